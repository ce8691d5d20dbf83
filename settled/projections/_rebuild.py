"""Rebuild a projection from offset 0 and switch atomically; check live = rebuild = reference fold (docs/design.md §6).

`rebuild`: replay the whole log into a fresh schema version (``<base>__next``: its tables and its offset rows
together) — a bulk replay that folds each partition in memory up to the log's end offsets and writes its final rows
once with COPY (`settled.projections._bulk`, one process per share of the partitions) — catch up to the live position
(at least the log's end offsets, and every live offset row) through projectors seeded with the folded states, then
switch in one transaction:

1. lock the live version's tables ``IN EXCLUSIVE MODE`` (``meta`` and ``offsets`` first, so the wait is for the live
   projector's open transaction, which takes its offset row first): the live projector cannot commit any more,
   readers still read the old version;
2. read the live offsets, now fixed, and catch the new version up to them (what arrived since the last catch-up) —
   so the switch cannot starve however fast the live projector moves (a live projector that stays ahead between
   two catch-ups made an earlier design retry until it gave up);
3. take the same tables ``IN ACCESS EXCLUSIVE MODE`` (waiting out readers), check that the new version is at or
   past every live offset, and rename ``<base>`` → ``<base>__retired`` and ``<base>__next`` → ``<base>``.

The new version's offsets are read before the switch transaction begins (autocommit; only this rebuild's catch-up
writes them), so while the switch waits for its catch-up it holds nothing on ``<base>__next``. Every lock wait is
bounded by ``lock_timeout``; a lock timeout or a deadlock rolls the switch back and it is tried again (the new version
keeps what it caught up). Step 2 holds the live projector back, so it is bounded twice: when the gap is larger than
``locked_catch_up_max_offsets`` the switch rolls back once for one more catch-up round outside the lock (the next
switch catches up under the lock whatever the gap), and a catch-up still short of the live offsets after
``locked_catch_up_timeout_s`` rolls the switch back (the live projector goes on) and uses up an attempt; each attempt
first catches up outside the lock, so the gap left for the lock is what arrived during one round. A reader sees
the old version or the new one, never a mix; the live projector's next transaction finds the new version's offsets at
or ahead of its own, folds the records in between without writing them, and goes on writing the new version.

One at a time: `rebuild` and `check` both drop and recreate a schema version of the projection (``<base>__next``,
``<base>__retired``, ``<base>__check``), so each first takes the projection's session advisory lock
(``pg_try_advisory_lock`` on a session held until it returns; key: `maintenance_lock_key`) and a second
one started meanwhile raises `RebuildInProgressError` at once — without it a second rebuild's
``DROP SCHEMA <base>__next`` could drop the version the first had just switched to live, or wait on the first's switch
while the first waited on its catch-up behind that ``DROP`` (a deadlock PostgreSQL cannot see: one side of it waits in
Python). Its own statements (drop, migrate, the switch) run on that session, so once the session is gone, and the
lock with it, the switch fails with the connection instead of renaming schemas that another rebuild may be using.

The live projector waits for step 2 at most ``locked_catch_up_timeout_s`` (plus one projector step, as the bound is
checked between steps) and the lock waits' ``lock_timeout``.

Failpoint ``rebuild.before_switch``: the new version is caught up, the switch transaction not yet begun (a test
appends there so that the live projector is ahead at every switch). Failpoint ``check.before_snapshot``: the scratch
copy and the reference are at the live offsets, the live and scratch tables not yet read.

`check`: compares three projections of the same log prefix — the live tables, a fresh rebuild into
``<base>__check``, and the reference computed in memory from an independent read of the log (the rows of
`settled.projections.project_batch`, and the fold-derived columns of `settled.protocol.fold`'s state) — at identical
offsets: it builds the scratch copy up to the live offsets, then holds the live offset rows ``FOR SHARE`` (pausing
the live projector) while it catches the scratch copy and the reference up to them and reads live and scratch tables
inside one ``REPEATABLE READ`` snapshot.

Quarantined records (``projection_quarantine``: the records whose rows PostgreSQL refused, `settled.projections.
Projector`) are left out of all three: the reference folds them (so the conversation's later batches fold) but drops
the rows of their refused conversations, as the live projector and the rebuild do, and the comparison with the
protocol's fold skips every row those dropped. The scratch rebuild must quarantine exactly the live version's
records and conversations (a difference otherwise); `CheckReport.quarantined` lists them and `settled projections
check` exits non-zero while any exist.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition
from psycopg import sql

from settled._errors import ErrorCategory, SettledError
from settled._failpoints import failpoint
from settled._settings import Settings
from settled.producers import reader_config
from settled.projections._bulk import ReplayTimings, SharePool, default_workers
from settled.projections._rows import FOLD_COLUMNS, ProjectionState, RowSet, fold_reference, project_batch
from settled.projections._schema import (
    PROJECTION_NAME,
    ProjectionNames,
    migrate,
    read_meta,
    schema_exists,
)
from settled.projections._store import QuarantinedRecord, read_offsets, read_quarantine, read_table
from settled.projections._tables import TABLES
from settled.protocol import PartitionState, fold
from settled.schemas import Codec, LogBatch

__all__ = [
    "CheckReport",
    "Difference",
    "RebuildInProgressError",
    "RebuildProgress",
    "RebuildResult",
    "check",
    "log_end_offsets",
    "maintenance_lock_key",
    "rebuild",
]

_log = logging.getLogger("settled.projections")

Conn = psycopg.Connection[tuple[Any, ...]]


@dataclass(frozen=True)
class RebuildProgress:
    """Progress of a replay, reported after each committed chunk.

    Attributes:
        done_offsets: Offsets replayed so far, all partitions together.
        total_offsets: Offsets to replay (the log's end offsets when the replay started, summed).
        batches: Batches (log records) applied.
        events: Canonical events in them.
        elapsed_s: Seconds since the replay started.
    """

    done_offsets: int
    total_offsets: int
    batches: int
    events: int
    elapsed_s: float

    @property
    def events_per_s(self) -> float:
        """Events applied per second so far."""
        return self.events / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class RebuildResult:
    """What a rebuild did.

    Attributes:
        schema: The live schema now holding the rebuilt version.
        generation: The new version's generation (the old one's + 1).
        offsets: Its next offset per partition at the switch.
        batches: Batches applied.
        events: Events applied.
        elapsed_s: Seconds, replay and switch together.
        switch_attempts: Switch transactions tried (a lock timeout or a deadlock with a reader, or a catch-up gap
            too large to close under the lock, makes one roll back).
        workers: Processes that replayed (1: in the calling process).
        phases: Wall-clock seconds per phase: ``setup`` (schema, end offsets, starting the workers), ``replay``
            (the bulk replay up to the end offsets, its write included), ``catch_up`` (up to the live position),
            ``switch`` (the switch transactions, ``locked_catch_up`` included), ``locked_catch_up`` (catching up
            while the switch held the live projector back; absent when there was nothing to catch up).
        work: Where the replaying processes spent their time (summed over processes: consume, decode, fold, row
            building, Postgres write, catch-up).
    """

    schema: str
    generation: int
    offsets: dict[int, int]
    batches: int
    events: int
    elapsed_s: float
    switch_attempts: int
    workers: int = 1
    phases: Mapping[str, float] = field(default_factory=dict)
    work: ReplayTimings = field(default_factory=ReplayTimings)


def log_end_offsets(settings: Settings, timeout_s: float) -> dict[int, int]:
    """Return the read_committed end offset (LSO) of every log partition.

    Args:
        settings: Namespace and bootstrap servers.
        timeout_s: Bound on each query, in seconds.

    Returns:
        Partition → end offset.

    Raises:
        LookupError: The log topic does not exist.
    """
    topic = settings.topic("log")
    consumer = Consumer(reader_config(settings, f"{settings.namespace}.projector-offsets"))
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise LookupError(f"topic {topic} does not exist: run `settled topics create`")
        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s, cached=False)[1])
            for p in sorted(meta.partitions)
        }
    finally:
        consumer.close()


def _connect(settings: Settings) -> Conn:
    conn = psycopg.connect(settings.postgres_dsn, autocommit=True, application_name="settled-projections")
    conn.prepare_threshold = None
    return conn


class RebuildInProgressError(SettledError, RuntimeError):
    """Another `rebuild` or `check` of the same projection holds its maintenance lock (module doc: one at a time).

    Attributes:
        base: The projection's base schema name.
        holder: Who holds the lock (PostgreSQL pid and application name), when it could be seen.
    """

    category = ErrorCategory.CONFLICT

    def __init__(self, base: str, holder: str | None) -> None:
        self.base = base
        self.holder = holder
        by = f" (held by {holder})" if holder else ""
        super().__init__(
            f"another rebuild or check of projection {base!r} is in progress{by}: "
            f"wait for it to finish, then run this one again"
        )


def maintenance_lock_key(base: str) -> int:
    """Return the advisory lock key that serialises `rebuild` and `check` of one projection (module doc).

    The key is the first 8 bytes of BLAKE2b over ``settled.projection-maintenance:<base>`` as a signed big-endian
    64-bit integer — the one-key (bigint) form of ``pg_try_advisory_lock``, a key space apart from the projector's
    two-key per-partition locks.

    Args:
        base: The projection's base schema name (`ProjectionNames.base`).

    Returns:
        The bigint lock key.
    """
    digest = hashlib.blake2b(f"settled.projection-maintenance:{base}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _maintenance_lock(settings: Settings, names: ProjectionNames, what: str) -> Conn:
    """Take the projection's maintenance lock on a dedicated session, or raise `RebuildInProgressError` at once.

    Returns:
        The session holding the lock; closing it releases the lock. The rebuild or check does its own work (drop,
        migrate, switch) on this session, so a session that has dropped (and with it the lock) fails that work
        instead of letting it go on unserialised.
    """
    key = maintenance_lock_key(names.base)
    conn = psycopg.connect(settings.postgres_dsn, autocommit=True, application_name=f"settled-projections-{what}")
    conn.prepare_threshold = None
    try:
        row = conn.execute("SELECT pg_try_advisory_lock(%s::bigint)", (key,)).fetchone()
        if row is not None and row[0]:
            return conn
        holder = conn.execute(
            "SELECT l.pid, a.application_name FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND l.classid = %s::bigint::oid AND l.objid = %s::bigint::oid",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
        ).fetchone()
    except BaseException:
        conn.close()
        raise
    conn.close()
    raise RebuildInProgressError(names.base, f"pid {holder[0]}, {holder[1]!r}" if holder else None)


class _Behind(Exception):
    """The new version is behind the live one after its catch-up (the switch rolls back and is tried again)."""


class _GapTooLarge(Exception):
    """Too much to catch up while holding the live projector back: one more catch-up round outside the lock first."""


@dataclass
class _Relay:
    """Turns the shares' progress into `RebuildProgress` reports."""

    total: int
    progress: Callable[[RebuildProgress], None] | None
    started: float = field(default_factory=time.monotonic)

    def __call__(self, nexts: dict[int, int], records: int, events: int) -> None:
        if self.progress is not None:
            done = min(sum(nexts.values()), self.total)
            self.progress(RebuildProgress(done, self.total, records, events, time.monotonic() - self.started))

    def caught_up(self, records: int, events: int) -> None:
        # Caught up means done, though the last offsets may be transaction markers no record sits at.
        if self.progress is not None:
            self.progress(RebuildProgress(self.total, self.total, records, events, time.monotonic() - self.started))


def _fresh_version(
    settings: Settings,
    names: ProjectionNames,
    conn: Conn,
    schema: str,
    targets: Mapping[int, int],
    *,
    generation: int | None,
    progress: Callable[[RebuildProgress], None] | None,
    workers: int | None,
    parallel_min_records: int,
    max_records: int,
    timeout_s: float,
) -> tuple[_Relay, SharePool]:
    """Drop and recreate ``schema`` (a fresh version of the projection) and start the shares replaying into it.

    Runs on ``conn``, the session holding the maintenance lock (module doc). ``targets`` (offset per partition) sizes
    the shares and the progress total; the caller then runs `SharePool.bulk` and `SharePool.until`.
    """
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    migrate(conn, schema, generation=generation)
    relay = _Relay(sum(targets.values()), progress)
    pool = SharePool(
        settings,
        names,
        schema,
        targets,
        workers=_workers(workers, targets, parallel_min_records),
        max_records=max_records,
        timeout_s=timeout_s,
        progress=relay,
    )
    return relay, pool


def _workers(requested: int | None, targets: Mapping[int, int], parallel_min_records: int) -> int:
    if requested is not None:
        return max(1, requested)
    if sum(targets.values()) < parallel_min_records:
        return 1  # a child process costs more than it saves on a short log
    return default_workers()


def rebuild(
    settings: Settings,
    names: ProjectionNames,
    *,
    progress: Callable[[RebuildProgress], None] | None = None,
    keep_retired: bool = True,
    timeout_s: float = 3600.0,
    switch_attempts: int = 20,
    lock_timeout_s: float = 5.0,
    locked_catch_up_max_offsets: int = 10_000,
    locked_catch_up_timeout_s: float = 5.0,
    max_records: int = 10_000,
    workers: int | None = None,
    parallel_min_records: int = 20_000,
) -> RebuildResult:
    """Replay the log from offset 0 into a new schema version and switch to it atomically (module doc).

    The replay folds each partition in memory and writes its final rows once (`settled.projections` bulk replay,
    one process per share of the partitions), then catches up to the live position through projectors seeded with
    the folded states.

    Args:
        settings: Namespace, Kafka and Postgres.
        names: The projection's schema names.
        progress: Called as the replay advances.
        keep_retired: Keep the replaced version as ``<base>__retired`` (else drop it in the switch).
        timeout_s: Bound on the whole rebuild, in seconds.
        switch_attempts: Switch transactions to try before giving up (lock timeouts, deadlocks with readers, at most
            one gap above ``locked_catch_up_max_offsets`` and catch-ups under the lock past
            ``locked_catch_up_timeout_s`` use them up, module doc).
        lock_timeout_s: ``lock_timeout`` of one switch transaction, in seconds.
        locked_catch_up_max_offsets: Most offsets (all partitions together) the first switch catches up while it
            holds the live projector back; above it, one more catch-up round runs outside the lock first.
        locked_catch_up_timeout_s: Longest the switch holds the live projector back while it catches up, in seconds;
            a catch-up still short then rolls the switch back and uses up an attempt.
        max_records: Records consumed per poll.
        workers: Processes replaying (None: one per core when the log holds at least ``parallel_min_records``
            records, else 1, which replays in this process).
        parallel_min_records: See ``workers``.

    Returns:
        What was rebuilt.

    Raises:
        ValueError: ``switch_attempts`` is below 1, ``locked_catch_up_max_offsets`` below 0 or
            ``locked_catch_up_timeout_s`` not above 0.
        RebuildInProgressError: Another rebuild or check of this projection is running (nothing was changed).
        psycopg.OperationalError: The session holding the maintenance lock was lost (the live version is not switched).
        TimeoutError: The replay or the switch did not finish in time.
        LookupError: The log topic does not exist.
        settled.protocol.ProtocolError: The fold refused a batch (replaying in this process).
        settled.schemas.ChainBreakError: A batch does not continue its conversation's chain (idem).
        RebuildWorkerError: A replaying child process failed (it names the error, e.g. a ``ProtocolError``).
    """
    if switch_attempts < 1:
        raise ValueError(f"switch_attempts must be at least 1, got {switch_attempts}")
    if locked_catch_up_max_offsets < 0:
        raise ValueError(f"locked_catch_up_max_offsets must be at least 0, got {locked_catch_up_max_offsets}")
    if not locked_catch_up_timeout_s > 0:
        raise ValueError(f"locked_catch_up_timeout_s must be above 0, got {locked_catch_up_timeout_s}")
    deadline = time.monotonic() + timeout_s
    started = time.monotonic()
    phases: dict[str, float] = {}
    with _maintenance_lock(settings, names, "rebuild") as conn:
        topic = settings.topic("log")
        live_exists = schema_exists(conn, names.live)
        generation = int(read_meta(conn, names.live).get("generation", "0")) + 1 if live_exists else 1
        targets = log_end_offsets(settings, settings.kafka_call_timeout_s)
        relay, pool = _fresh_version(
            settings,
            names,
            conn,
            names.building,
            targets,
            generation=generation,
            progress=progress,
            workers=workers,
            parallel_min_records=parallel_min_records,
            max_records=max_records,
            timeout_s=timeout_s,
        )
        phases["setup"] = time.monotonic() - started
        try:
            mark = time.monotonic()
            pool.bulk(deadline)
            phases["replay"] = time.monotonic() - mark
            work = pool.timings()
            relay.caught_up(work.records, work.events)
            mark = time.monotonic()
            max_gap: int | None = locked_catch_up_max_offsets
            reasons: list[str] = []

            def locked_catch_up(targets: dict[int, int]) -> bool:
                started_locked = time.monotonic()
                reached = pool.until(targets, deadline, stop_at=started_locked + locked_catch_up_timeout_s)
                phases["locked_catch_up"] = phases.get("locked_catch_up", 0.0) + time.monotonic() - started_locked
                return all(reached.get(p, 0) >= o for p, o in targets.items())

            for attempt in range(1, switch_attempts + 1):
                live = read_offsets(conn, names.live, topic) if live_exists else {}
                ends = log_end_offsets(settings, settings.kafka_call_timeout_s)
                catch_up = time.monotonic()
                pool.until({p: max(end, live.get(p, 0)) for p, end in ends.items()}, deadline)
                phases["catch_up"] = phases.get("catch_up", 0.0) + time.monotonic() - catch_up
                failpoint("rebuild.before_switch")
                try:
                    offsets = _switch(
                        conn, names, topic, live_exists, keep_retired, lock_timeout_s, locked_catch_up, max_gap
                    )
                except _GapTooLarge as exc:
                    max_gap = None  # the next switch catches up under the lock whatever the gap: it converges
                    reasons.append(str(exc))
                    _log.info("switch retried", extra={"attempt": attempt, "reason": str(exc)})
                    continue
                except (_Behind, psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
                    reasons.append(repr(exc))
                    _log.info("switch retried", extra={"attempt": attempt, "reason": repr(exc)})
                    continue
                phases["switch"] = time.monotonic() - mark - phases["catch_up"]
                _log.info("projection switched", extra={"schema": names.live, "generation": generation})
                work = pool.timings()
                return RebuildResult(
                    names.live,
                    generation,
                    offsets,
                    work.records,
                    work.events,
                    time.monotonic() - started,
                    attempt,
                    workers=pool.workers,
                    phases=phases,
                    work=work,
                )
            raise TimeoutError(
                f"the switch to the rebuilt projection failed {switch_attempts} times; last reason: "
                f"{reasons[-1] if reasons else 'none'}"
            )
        finally:
            pool.close()


def _switch(
    conn: Conn,
    names: ProjectionNames,
    topic: str,
    live_exists: bool,
    keep_retired: bool,
    lock_timeout_s: float,
    catch_up: Callable[[dict[int, int]], bool],
    max_gap: int | None,
) -> dict[int, int]:
    """One switch transaction (module doc): hold the live projector back, catch up to it, then rename both versions.

    Args:
        conn: The rebuild's autocommit connection.
        names: The projection's schema names.
        topic: The log topic.
        live_exists: Whether there is a live version to replace.
        keep_retired: Keep the replaced version as ``<base>__retired``.
        lock_timeout_s: ``lock_timeout`` of every lock wait here, in seconds.
        catch_up: Catches the new version up to some offsets (through other connections, which write only the new
            version, so no lock held here stops them) within its time bound; returns whether it reached them.
        max_gap: Most offsets to catch up while holding the live projector back; None: no bound.

    Returns:
        The new version's next offset per partition.

    Raises:
        _GapTooLarge: More than ``max_gap`` offsets to catch up (rolled back).
        _Behind: The catch-up under the lock hit its time bound, or the new version is still behind the live one
            after it (rolled back).
        psycopg.errors.LockNotAvailable: A lock wait took longer than ``lock_timeout_s`` (rolled back).
        psycopg.errors.DeadlockDetected: A reader and the switch waited on each other (rolled back).
    """
    live, building, retired = (sql.Identifier(n) for n in (names.live, names.building, names.retired))
    live_tables = sql.SQL(", ").join(sql.Identifier(names.live, t) for t in ("meta", "offsets", *TABLES))
    # Outside the transaction (autocommit): only `catch_up` moves them, so they hold until it runs, and the switch
    # holds no lock on the new version while it waits for its catch-up.
    new = read_offsets(conn, names.building, topic)
    with conn.transaction():
        conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{int(lock_timeout_s * 1000)}ms")))
        stored: dict[int, int] = {}
        if live_exists:
            # EXCLUSIVE: the live projector (its offset row first, ROW SHARE) cannot commit, readers still read.
            conn.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(live_tables))
            stored = read_offsets(conn, names.live, topic)  # fixed until this transaction ends
            gap = sum(max(0, o - new.get(p, 0)) for p, o in stored.items())
            if max_gap is not None and gap > max_gap:
                raise _GapTooLarge(
                    f"{gap} offsets to catch up (more than {max_gap}) while holding the live projector back"
                )
            if gap and not catch_up(stored):
                raise _Behind(
                    f"the catch-up of {gap} offsets under the live lock took over its bound; the live projector goes on"
                )
            # ACCESS EXCLUSIVE: wait out the readers, so that none reads one version and then the other.
            conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(live_tables))
        new = read_offsets(conn, names.building, topic)
        behind = {p: (new.get(p, 0), o) for p, o in stored.items() if new.get(p, 0) < o}
        if behind:
            raise _Behind(f"the rebuilt version is behind the live one at partitions {behind} after its catch-up")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(retired))
        if live_exists:
            conn.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(live, retired))
        conn.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(building, live))
        if live_exists and not keep_retired:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(retired))
    return new


# ------------------------------------------------------------------------------------------------------------ check


@dataclass(frozen=True)
class Difference:
    """One value on which the projections disagree.

    Attributes:
        table: The table (``offsets`` for the offset rows).
        key: The row's primary key.
        column: The column (``<row>`` when the row itself is missing somewhere).
        live: The live value (``<missing>`` when the row is absent).
        rebuild: The fresh rebuild's value.
        reference: The reference fold's value (``<not compared>`` for columns the fold does not derive).
    """

    table: str
    key: tuple[Any, ...]
    column: str
    live: Any
    rebuild: Any
    reference: Any


@dataclass(frozen=True)
class CheckReport:
    """The outcome of `check`.

    Attributes:
        offsets: The identical next offsets compared at, per partition.
        rows: Row count per table (live).
        differences: Every disagreement.
        quarantined: The live version's quarantined records below those offsets, left out of the comparison.
    """

    offsets: dict[int, int]
    rows: dict[str, int]
    differences: tuple[Difference, ...]
    quarantined: tuple[QuarantinedRecord, ...] = ()

    @property
    def ok(self) -> bool:
        """True when live, rebuild and reference agree on every row (the quarantined records left out)."""
        return not self.differences


MISSING = "<missing>"
NOT_COMPARED = "<not compared>"


class _Reference:
    """The reference projection: an independent read of the log folded in memory."""

    def __init__(self, settings: Settings, partitions: list[int]) -> None:
        self.settings = settings
        self.topic = settings.topic("log")
        self.codec = Codec()
        self.states = {p: ProjectionState.empty(p) for p in partitions}
        self.folds = {p: PartitionState(partition=p) for p in partitions}
        self.rows = RowSet()
        self.left_out: dict[str, set[tuple[Any, ...]]] = {name: set() for name in TABLES}
        self.next = {p: 0 for p in partitions}
        self.consumer = Consumer(reader_config(settings, f"{settings.namespace}.projection-check"))

    def close(self) -> None:
        self.consumer.close()

    def extend(
        self, limits: Mapping[int, int], deadline: float, leave_out: Mapping[tuple[int, int], frozenset[str]]
    ) -> None:
        """Fold every record below each partition's limit.

        Of a record at a (partition, offset) of ``leave_out``, the rows of the groups named there (`row_group`) are
        not kept, only their keys (``left_out``).
        """
        for p, limit in limits.items():
            if self.next[p] >= limit:
                continue
            tp = TopicPartition(self.topic, p, self.next[p])
            self.consumer.assign([tp])
            batches: list[LogBatch] = []
            while self.next[p] < limit:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {self.topic}[{p}] up to {limit} took too long")
                msg = self.consumer.poll(0.2)
                if msg is None:
                    position = self.consumer.position([TopicPartition(self.topic, p)])[0].offset
                    if position >= limit:
                        self.next[p] = limit
                    continue
                err = msg.error()
                if err is not None:
                    raise KafkaException(err)
                offset = msg.offset()
                if offset is None or offset >= limit:
                    self.next[p] = limit
                    break
                batch = self.codec.decode_batch(msg.value(), topic=self.topic, partition=p, offset=offset).batch
                refused = leave_out.get((p, offset))
                if refused is not None:
                    own = RowSet()
                    self.states[p] = project_batch(self.states[p], batch, offset, own)
                    for group, group_rows in own.by_group().items():
                        for name, rows in group_rows.tables.items():
                            if group in refused:
                                self.left_out[name].update(rows)
                            else:
                                for row in rows.values():
                                    self.rows.add(TABLES[name], row)
                else:
                    self.states[p] = project_batch(self.states[p], batch, offset, self.rows)
                batches.append(batch)
                self.next[p] = offset + 1
            self.consumer.unassign()
            self.folds[p] = fold(self.folds[p], batches)


def check(
    settings: Settings,
    names: ProjectionNames,
    *,
    progress: Callable[[RebuildProgress], None] | None = None,
    keep_scratch: bool = False,
    timeout_s: float = 3600.0,
    max_records: int = 10_000,
    workers: int | None = None,
    parallel_min_records: int = 20_000,
) -> CheckReport:
    """Compare live, a fresh rebuild and the reference fold of the log at identical offsets (module doc).

    Args:
        settings: Namespace, Kafka and Postgres.
        names: The projection's schema names.
        progress: Called as the scratch rebuild advances.
        keep_scratch: Keep ``<base>__check`` afterwards (else it is dropped).
        timeout_s: Bound on the whole check, in seconds.
        max_records: Records consumed per poll.
        workers: Processes replaying the scratch rebuild (see `rebuild`).
        parallel_min_records: See `rebuild`.

    Returns:
        The report (`CheckReport.ok` when nothing differs).

    Raises:
        LookupError: The live projection or the log topic does not exist.
        RebuildInProgressError: Another rebuild or check of this projection is running (nothing was changed).
        psycopg.OperationalError: The session holding the maintenance lock was lost before the tables were read (no
            report: another rebuild or check may have changed ``<base>__check`` meanwhile).
        TimeoutError: The check did not finish in time.
        RebuildWorkerError: A replaying child process failed.
    """
    deadline = time.monotonic() + timeout_s
    topic = settings.topic("log")
    with _maintenance_lock(settings, names, "check") as conn:
        if not schema_exists(conn, names.live):
            raise LookupError(f"projection schema {names.live!r} does not exist: run `settled projections run`")
        first = read_offsets(conn, names.live, topic)
        partitions = sorted(log_end_offsets(settings, settings.kafka_call_timeout_s))
        first = {p: first.get(p, 0) for p in partitions}
        relay, pool = _fresh_version(
            settings,
            names,
            conn,
            names.scratch,
            first,
            generation=None,
            progress=progress,
            workers=workers,
            parallel_min_records=parallel_min_records,
            max_records=max_records,
            timeout_s=timeout_s,
        )
        reference = _Reference(settings, partitions)
        try:
            pool.bulk(deadline)  # exactly the records below `first`
            reference.extend(first, deadline, _positions(read_quarantine(conn, names.live)))
            with _connect(settings) as pause, pause.transaction():
                # Hold the live offset rows: the live projector waits, so the live tables stay at these offsets.
                rows = pause.execute(
                    sql.SQL(
                        "SELECT partition, next_offset FROM {} WHERE projection = %s AND topic = %s FOR SHARE"
                    ).format(sql.Identifier(names.live, "offsets")),
                    (PROJECTION_NAME, topic),
                ).fetchall()
                at = {p: 0 for p in partitions} | {int(p): int(o) for p, o in rows}
                relay.total = sum(at.values())
                pool.until(at, deadline, exact=True)
                work = pool.timings()
                relay.caught_up(work.records, work.events)
                # The live projector is held: the quarantined records below `at` are all there and stay.
                reference.extend(at, deadline, _positions(read_quarantine(pause, names.live)))
                failpoint("check.before_snapshot")
                snapshot = _snapshot(settings, names, topic)
                # The snapshot is read on its own session: that it was read under the maintenance lock is shown by
                # the lock's session still being there now (a session lock ends only with its session).
                conn.execute("SELECT 1")
        finally:
            pool.close()
            reference.close()
        if not keep_scratch:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(names.scratch)))
        return _compare(at, snapshot, reference)


def _positions(records: list[QuarantinedRecord]) -> dict[tuple[int, int], frozenset[str]]:
    return {(r.partition, r.log_offset): frozenset(r.refused_groups) for r in records}


@dataclass
class _Snapshot:
    live_offsets: dict[int, int]
    scratch_offsets: dict[int, int]
    live: dict[str, Mapping[tuple[Any, ...], tuple[Any, ...]]]
    scratch: dict[str, Mapping[tuple[Any, ...], tuple[Any, ...]]]
    live_quarantine: list[QuarantinedRecord]
    scratch_quarantine: list[QuarantinedRecord]


def _snapshot(settings: Settings, names: ProjectionNames, topic: str) -> _Snapshot:
    with _connect(settings) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            return _Snapshot(
                live_offsets=read_offsets(conn, names.live, topic),
                scratch_offsets=read_offsets(conn, names.scratch, topic),
                live={name: read_table(conn, names.live, spec) for name, spec in TABLES.items()},
                scratch={name: read_table(conn, names.scratch, spec) for name, spec in TABLES.items()},
                live_quarantine=read_quarantine(conn, names.live),
                scratch_quarantine=read_quarantine(conn, names.scratch),
            )


def _compare(at: dict[int, int], snap: _Snapshot, reference: _Reference) -> CheckReport:
    diffs: list[Difference] = []
    for p, offset in sorted(at.items()):
        live, scratch = snap.live_offsets.get(p, 0), snap.scratch_offsets.get(p, 0)
        if not (live == scratch == reference.next[p] == offset):
            diffs.append(Difference("offsets", (p,), "next_offset", live, scratch, reference.next[p]))
    quarantined = [r for r in snap.live_quarantine if r.log_offset < at.get(r.partition, 0)]
    live_q = {(r.partition, r.log_offset): (r.event_types, r.refused_groups) for r in quarantined}
    scratch_q = {
        (r.partition, r.log_offset): (r.event_types, r.refused_groups)
        for r in snap.scratch_quarantine
        if r.log_offset < at.get(r.partition, 0)
    }
    for position in sorted(set(live_q) | set(scratch_q)):
        if live_q.get(position) != scratch_q.get(position):
            diffs.append(
                Difference(
                    "projection_quarantine", position, "event_types, refused_groups", live_q.get(position, MISSING),
                    scratch_q.get(position, MISSING), NOT_COMPARED,
                )
            )  # fmt: skip
    for name, spec in TABLES.items():
        live_rows, scratch_rows, ref_rows = snap.live[name], snap.scratch[name], reference.rows.tables[name]
        for key in sorted(set(live_rows) | set(scratch_rows) | set(ref_rows), key=repr):
            lv, sc, rf = live_rows.get(key), scratch_rows.get(key), ref_rows.get(key)
            if lv is None or sc is None or rf is None:
                diffs.append(
                    Difference(
                        name,
                        key,
                        "<row>",
                        MISSING if lv is None else "present",
                        MISSING if sc is None else "present",
                        MISSING if rf is None else "present",
                    )
                )
                continue
            for i, column in enumerate(spec.columns):
                if not (lv[i] == sc[i] == rf[i]):
                    diffs.append(Difference(name, key, column, lv[i], sc[i], rf[i]))
    for p, state in reference.folds.items():
        folded = fold_reference(state)
        for name, by_key in folded.items():
            spec = TABLES[name]
            live_rows, scratch_rows = snap.live[name], snap.scratch[name]
            if name == "partitions" and state.claim_epoch == 0 and state.partition_count is None:
                continue  # an empty partition has no row
            left_out = reference.left_out[name]
            for key, values in by_key.items():
                if key in left_out:
                    continue  # a quarantined record wrote no row here: the fold's is not the projection's
                lv, sc = live_rows.get(key), scratch_rows.get(key)
                for column in FOLD_COLUMNS[name]:
                    i = spec.columns.index(column)
                    want = values[column]
                    got_live = MISSING if lv is None else lv[i]
                    got_scratch = MISSING if sc is None else sc[i]
                    if not (got_live == got_scratch == want):
                        diffs.append(Difference(f"{name} (fold)", key, column, got_live, got_scratch, want))
            for key in set(live_rows) - set(by_key):
                if name == "partitions" and key != (p,):
                    continue
                if name != "partitions" and live_rows[key][spec.columns.index("partition")] != p:
                    continue
                diffs.append(Difference(f"{name} (fold)", key, "<row>", "present", "?", MISSING))
    counts = {name: len(rows) for name, rows in snap.live.items()}
    return CheckReport(offsets=dict(at), rows=counts, differences=tuple(diffs), quarantined=tuple(quarantined))
