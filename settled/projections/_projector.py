"""The projector: ``settled.log`` into Postgres, rows and offsets in one transaction (docs/design.md §6; DUR-015).

A plain confluent-kafka consumer, ``read_committed``, no auto commit, no consumer group: the projector ``assign()``s
each log partition it may write, one writer per (schema, topic, partition) guarded by a session advisory lock
(``pg_try_advisory_lock``); a standby retries the locks it lacks and takes a partition over when its writer's
session ends.

Per polled chunk of one partition, in **one** psycopg transaction: ``SELECT next_offset ... FOR UPDATE`` of the
partition's offset row; if it is not the offset this process expects, another writer applied records — roll back,
fold those records without writing them (they are in the database already) and go on; else write the chunk's rows
(batched) and the next offset, then commit. The first record of a chunk must be at or after the stored next offset;
offsets have gaps (transaction markers), so "next" means "after the last record applied", never "+1 exactly".

The rows come from `settled.projections.project_batch`, i.e. from the protocol's fold; the in-memory fold advances
only when the transaction commits. A process starting (or losing its database connection) restores that fold by
re-reading the partition from offset 0 up to the stored offset without writing (no snapshots yet).

A record whose rows PostgreSQL refuses (a data error, told from a lost connection by its SQLSTATE class:
`settled.projections._sqlstate`) never stops the projector: the chunk rolls back and its records are written one
transaction each; a record refused alone has its rows written one conversation per savepoint (an ownership claim's
rows span the partition's conversations), and is entered in the ``projection_quarantine`` table (partition, offset,
event types, the refused conversations, SQLSTATE, error) in the transaction that moves the offset past it, logged and
counted (`Projector.quarantined`). Its fold is kept and the refused conversations' rows are not written: the
conversation's later batches still fold (and are quarantined too when their rows carry the same refused value), and
every other conversation goes on, its rows in that record included. A rebuild does exactly the same
(`settled.projections._bulk`), so live and rebuild agree; `settled projections check` leaves those positions out of
its comparison and lists them. A lost connection (or a transient error: SQLSTATE classes 08, 40, 53, 57P0x) makes
the projector reconnect and write the same rows again; any other error (a missing table, a defect) is raised.

Fault switch ``projection_offsets_separate_transaction`` (`settled._faults`): the rows commit in one transaction and
the offset in a second, so a crash between the two applies the rows again after a restart (DUR-015 broken on
purpose; `tests/fault_switches.toml` names the test that must catch it).

Failpoint ``projector.before_commit``: the chunk's rows are written, the offset is not yet (inside the transaction;
between the two transactions under the fault switch).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from settled._failpoints import failpoint
from settled._faults import fault_enabled
from settled._settings import Settings
from settled.producers import admin_config, consume_promptly, reader_config
from settled.projections._metrics import ProjectionMetrics
from settled.projections._rows import ProjectionState, RowSet, project_batch
from settled.projections._schema import ProjectionNames, check_layout, migrate
from settled.projections._sqlstate import ErrorKind, classify, describe
from settled.projections._store import OffsetConflictError, ProjectionWriter, QuarantinedRecord
from settled.projections._tables import SETTLEMENTS
from settled.schemas import Codec, FastBatchDecoder, LogBatch

__all__ = ["ChunkApplied", "Projector", "ProjectorConfig"]

_MAX_BACKOFF_S = 5.0
"""Longest pause between two writes failing with a transient error in a row, in seconds."""

_log = logging.getLogger("settled.projections")

Conn = psycopg.Connection[tuple[Any, ...]]


def is_record(msg: Message) -> bool:
    """Whether a polled message is a record; a consumer error is logged and skipped, a fatal one raised.

    Args:
        msg: A message from ``consume``.

    Returns:
        True for a record; False for a non-fatal consumer error (logged as a warning).

    Raises:
        KafkaException: The error is fatal (the consumer cannot go on).
    """
    err = msg.error()
    if err is None:
        return True
    if err.fatal():
        raise KafkaException(err)
    _log.warning("consumer error", extra={"error": str(err)})
    return False


@dataclass(frozen=True)
class ProjectorConfig:
    """How a projector runs.

    Attributes:
        names: The projection's schema names (the live one is written unless ``schema`` says otherwise).
        schema: The schema written; None means ``names.live``.
        partitions: The log partitions to write; None means all of the topic's.
        advisory_lock: Guard each partition with ``pg_try_advisory_lock`` (one writer); when False, concurrent
            writers are kept apart by the offset row's lock and the expected-offset check alone.
        max_records: Most records consumed per poll (a chunk per partition is at most this many).
        poll_timeout_s: Longest wait of one poll, in seconds.
        lock_retry_s: How often a standby retries the advisory locks it lacks, in seconds.
        reconnect_timeout_s: How long to keep reconnecting to Postgres before giving up, in seconds.
        notify: Send a ``NOTIFY`` on the projection's channel with every commit (read-your-writes waiters).
        validate_records: Decode every record through the validating pydantic models (`Codec.decode_batch`)
            instead of `FastBatchDecoder` (slower; the log's writers validated every batch already).
    """

    names: ProjectionNames
    schema: str | None = None
    partitions: tuple[int, ...] | None = None
    advisory_lock: bool = True
    max_records: int = 1000
    poll_timeout_s: float = 0.1
    lock_retry_s: float = 1.0
    reconnect_timeout_s: float = 60.0
    notify: bool = True
    validate_records: bool = False

    @property
    def target(self) -> str:
        """The schema written."""
        return self.schema if self.schema is not None else self.names.live


@dataclass(frozen=True)
class ChunkApplied:
    """What one committed chunk applied (for progress bars and tests).

    Attributes:
        partition: The log partition.
        records: Records (batches) applied.
        events: Events in them.
        rows: Rows sent.
        next_offset: The partition's next offset now stored.
    """

    partition: int
    records: int
    events: int
    rows: int
    next_offset: int


@dataclass
class _Part:
    partition: int
    state: ProjectionState
    pos: int = 0  # next offset after the last record folded into `state`
    silent_until: int = 0  # records below are in the database already: fold them without writing
    limit: int | None = None  # records at or past it are held back (the check stops at identical offsets)
    paused: bool = False


@dataclass
class Projector:
    """Projects ``<namespace>.log`` into a projection schema (module doc).

    Attributes:
        settings: Namespace, Kafka bootstrap and Postgres DSN.
        config: How it runs.
        codec: Decodes the log's batches.
        on_chunk: Called after each committed chunk.
        metrics: Where committed settlements and the partitions' lag are counted (``settled projections run`` with
            ``SETTLED_METRICS_PORT``); None counts nothing.
    """

    settings: Settings
    config: ProjectorConfig
    codec: Codec = field(default_factory=Codec)
    on_chunk: Callable[[ChunkApplied], None] | None = None
    metrics: ProjectionMetrics | None = None
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _parts: dict[int, _Part] = field(default_factory=dict, init=False)
    _conn: Conn | None = field(default=None, init=False)
    _consumer: Consumer | None = field(default=None, init=False)
    _wanted: tuple[int, ...] = field(default=(), init=False)
    _next_lock_try: float = field(default=0.0, init=False)
    _repositioned: set[int] = field(default_factory=set, init=False)
    _seeds: dict[int, tuple[ProjectionState, int]] = field(default_factory=dict, init=False)
    conflicts: int = field(default=0, init=False)
    """Chunks rolled back because another writer had moved the offset (tests read it)."""
    quarantined: int = field(default=0, init=False)
    """Records this process entered in the quarantine table (module doc)."""
    _transient_failures: int = field(default=0, init=False)
    _next_lag_s: float = field(default=0.0, init=False)  # monotonic time of the next lag reading

    @property
    def topic(self) -> str:
        """The log topic."""
        return self.settings.topic("log")

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Connect to Postgres (migrating the target schema when needed) and Kafka; take the partitions' locks.

        Raises:
            LookupError: The log topic does not exist.
            ProjectionLayoutError: The target schema has another layout.
        """
        self._wanted = self._topic_partitions()
        self._conn = self._connect()
        migrate(self._conn, self.config.target)
        check_layout(self._conn, self.config.target)
        self._consumer = Consumer(
            reader_config(self.settings, f"{self.settings.namespace}.projector", **{"auto.offset.reset": "earliest"})
        )
        self._writer = ProjectionWriter(self.config.target, self.topic)
        self._fast = FastBatchDecoder(self.codec)
        self._acquire()

    def seed(self, partition: int, state: ProjectionState, next_offset: int) -> None:
        """Start a partition from a folded state instead of re-reading it from offset 0 (a rebuild's bulk replay).

        Used when the partition is taken (`open`, or a later lock retry): if its stored next offset is
        ``next_offset``, the projector goes on from there with ``state``; otherwise (another writer moved it) the
        seed is dropped and the partition is restored from offset 0 as usual.

        Args:
            partition: The log partition.
            state: Its committed projection state, folded from offset 0 up to ``next_offset``.
            next_offset: The next offset after the records folded into ``state`` (as stored in the offset row).
        """
        self._seeds[partition] = (state, next_offset)

    def close(self) -> None:
        """Close the consumer and the connection (which releases the advisory locks)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._parts.clear()

    def stop(self) -> None:
        """Ask `run` to return after its current chunk."""
        self._stop.set()

    def run(self) -> None:
        """Project until `stop` is called: open, poll and apply, close.

        Raises:
            settled.protocol.ProtocolError: The fold refused a batch (a log a correct owner does not write).
            settled.schemas.DecodeError: A log record is not a decodable batch.
            psycopg.Error: A database error that is neither transient nor about the rows (`ErrorKind.OTHER`: a
                missing table, a defect); a record's refused rows are quarantined instead (module doc).
            TimeoutError: Postgres stayed unreachable past ``reconnect_timeout_s``.
        """
        self.open()
        try:
            while not self._stop.is_set():
                self.step()
        finally:
            self.close()

    # -- the loop --------------------------------------------------------------------------------------------------

    def held(self) -> tuple[int, ...]:
        """Return the partitions this process writes now."""
        return tuple(sorted(self._parts))

    def positions(self) -> dict[int, int]:
        """Return, per held partition, the next offset after the last record applied (as stored by this process)."""
        return {p: max(part.pos, part.silent_until) for p, part in list(self._parts.items())}

    def set_limits(self, limits: Mapping[int, int] | None) -> None:
        """Hold back every record at or past a per-partition offset (None: no limit); the check uses it.

        Args:
            limits: Partition → first offset not to apply.
        """
        consumer = self._require_consumer()
        for p, part in self._parts.items():
            part.limit = None if limits is None else limits.get(p)
            if part.paused and (part.limit is None or part.pos < part.limit):
                consumer.resume([TopicPartition(self.topic, p)])
                part.paused = False

    def caught_up(self, targets: Mapping[int, int]) -> bool:
        """Tell whether every held partition has applied all records below its target offset.

        Call it from the thread that runs `step` (it asks the consumer for positions); other threads read
        `positions`.

        Args:
            targets: Partition → offset (an end offset, or another writer's stored next offset).

        Returns:
            True when each held partition's next offset, or its consumer position, is at or past its target.
        """
        consumer = self._require_consumer()
        for p, target in targets.items():
            part = self._parts.get(p)
            if part is None:
                return False
            if max(part.pos, part.silent_until) >= target:
                continue
            if part.silent_until > part.pos:
                return False
            position = consumer.position([TopicPartition(self.topic, p)])[0].offset
            if position < target:
                return False
        return True

    def step(self) -> int:
        """Poll once and apply what came, one transaction per partition.

        Returns:
            How many records were applied or restored.
        """
        now = time.monotonic()
        if now >= self._next_lock_try and len(self._parts) < len(self._wanted):
            try:
                self._acquire()
            except psycopg.Error as exc:
                if classify(exc) is not ErrorKind.TRANSIENT:
                    raise
                _log.warning("postgres connection lost", extra={"error": str(exc)})
                self._recover_connection()
        consumer = self._require_consumer()
        if not self._parts:
            time.sleep(self.config.poll_timeout_s)
            return 0
        # Promptly: a batch consume would wait out its timeout for a full batch (~100 ms of lag per chunk).
        msgs = consume_promptly(consumer, self.config.max_records, self.config.poll_timeout_s)
        by_part: dict[int, list[Message]] = {}
        for msg in msgs:
            if not is_record(msg):
                continue
            p = msg.partition()
            if p is None or p not in self._parts:
                continue  # a partition given up since the fetch
            by_part.setdefault(p, []).append(msg)
        done = 0
        self._repositioned.clear()
        for p, recs in by_part.items():
            part = self._parts.get(p)
            # A partition repositioned while this poll's earlier chunks were applied (a reconnect resyncs every
            # partition) gets these records again from its new position: applying them now would fold them twice.
            if part is not None and p not in self._repositioned:
                done += self._apply(part, recs)
        if self.metrics is not None and now >= self._next_lag_s:
            self._next_lag_s = now + _LAG_INTERVAL_S
            self._read_lag(consumer, self.metrics)
        return done

    def _read_lag(self, consumer: Consumer, metrics: ProjectionMetrics) -> None:
        """Set each held partition's lag: the end of the log (as last fetched) minus the consumer's position."""
        tps = [TopicPartition(self.topic, p) for p in sorted(self._parts)]
        for tp in consumer.position(tps):
            _, high = consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset >= 0 and high >= 0:  # both known: the partition was fetched from at least once
                metrics.lag(tp.partition, high - tp.offset)

    def _apply(self, part: _Part, recs: list[Message]) -> int:
        p = part.partition
        if part.limit is not None:
            kept = [m for m in recs if _offset(m) < part.limit]
            if len(kept) < len(recs):
                held_back = _offset(recs[len(kept)])
                self._reposition(p, held_back)
                self._require_consumer().pause([TopicPartition(self.topic, p)])
                part.paused = True
            recs = kept
        i = 0
        if recs and _offset(recs[0]) < part.silent_until:
            restored = part.state.working()
            while i < len(recs) and _offset(recs[i]) < part.silent_until:
                offset = _offset(recs[i])
                restored = project_batch(restored, self._decode(p, recs[i]), offset, RowSet())
                part.pos = offset + 1
                i += 1
            part.state = restored.commit()
        rest = recs[i:]
        if not rest:
            return len(recs)
        if part.silent_until > part.pos:
            part.pos = part.silent_until  # the stored offset passed transaction markers after its last record
        rows = RowSet()
        state = part.state.working()
        for msg in rest:
            state = project_batch(state, self._decode(p, msg), _offset(msg), rows)
        next_offset = _offset(rest[-1]) + 1
        try:
            sent = self._write(p, part.pos, _offset(rest[0]), next_offset, rows)
        except OffsetConflictError as conflict:
            self._conflict(part, conflict)
            return 0
        except (psycopg.Error, UnicodeEncodeError) as exc:
            if not self._rows_refused(p, exc):
                return 0
            # Which record's rows? Write them one transaction each; a record refused alone is quarantined.
            return i + self._apply_each(part, rest)
        part.state = state.commit()
        part.pos = next_offset
        self._transient_failures = 0
        if self.metrics is not None:
            self.metrics.settled(_outcomes(rows))
        if self.on_chunk is not None:
            self.on_chunk(ChunkApplied(p, len(rest), rows.events, sent, next_offset))
        return len(recs)

    def _apply_each(self, part: _Part, recs: list[Message]) -> int:
        """Apply records one transaction each, quarantining a record whose rows are refused (module doc).

        Returns:
            How many were applied or quarantined (fewer than ``recs`` when a conflict or a lost connection stopped
            it: the partition was repositioned).
        """
        p = part.partition
        done = 0
        for msg in recs:
            offset = _offset(msg)
            batch = self._decode(p, msg)
            rows = RowSet()
            state = project_batch(part.state.working(), batch, offset, rows)
            stored_rows = True
            try:
                try:
                    sent = self._write(p, part.pos, offset, offset + 1, rows)
                except (psycopg.Error, UnicodeEncodeError) as exc:
                    if not self._rows_refused(p, exc):
                        return done
                    sent = self._quarantine(p, part.pos, offset, batch, rows, exc)
                    stored_rows = False
            except OffsetConflictError as conflict:
                self._conflict(part, conflict)
                return done
            except (psycopg.Error, UnicodeEncodeError) as exc:  # the quarantine's own transaction
                if classify(exc) is not ErrorKind.TRANSIENT:
                    raise
                _log.warning("postgres connection lost", extra={"partition": p, "error": str(exc)})
                self._recover_connection()
                return done
            part.state = state.commit()
            part.pos = offset + 1
            self._transient_failures = 0
            if self.metrics is not None and stored_rows:
                self.metrics.settled(_outcomes(rows))
            done += 1
            if self.on_chunk is not None:
                self.on_chunk(ChunkApplied(p, 1, rows.events, sent, offset + 1))
        return done

    def _rows_refused(self, p: int, exc: psycopg.Error | UnicodeEncodeError) -> bool:
        """Handle a failed write by its SQLSTATE (`classify`).

        Returns:
            True when the rows were refused (the caller quarantines); False when the database was lost and this
            process has reconnected (every held partition is repositioned to its stored offset).

        Raises:
            psycopg.Error: Neither transient nor about the rows (`ErrorKind.OTHER`); re-raised.
        """
        kind = classify(exc)
        if kind is ErrorKind.DATA:
            return True
        if kind is ErrorKind.TRANSIENT:
            self._transient_failures += 1
            if self._transient_failures > 1:
                # The server answers but keeps failing (disk full, too many connections, shutting down): back off
                # instead of re-reading and re-sending the chunk at once.
                time.sleep(min(0.1 * 2 ** (self._transient_failures - 2), _MAX_BACKOFF_S))
            _log.warning(
                "postgres connection lost or busy",
                extra={"partition": p, "error": str(exc), "sqlstate": getattr(exc, "sqlstate", None),
                       "failures": self._transient_failures},
            )  # fmt: skip
            self._recover_connection()
            return False
        raise exc

    def _quarantine(
        self, p: int, expected: int, offset: int, batch: LogBatch, rows: RowSet, exc: psycopg.Error | UnicodeEncodeError
    ) -> int:
        """Write a refused record's rows per conversation, quarantine it, move the offset past it: one transaction.

        Each conversation's rows (`RowSet.by_group`; an ownership claim's span the partition) are written in a
        savepoint of their own: those PostgreSQL refuses are rolled back and named in the quarantine entry, the others
        stay, so one conversation's refused id does not hide its neighbours' rows.

        Returns:
            Rows written.

        Raises:
            OffsetConflictError: Another writer moved the offset (rolled back).
            psycopg.Error: A transient or other error (rolled back; the caller handles it).
        """
        conn = self._require_conn()
        refused: list[str] = []
        record: QuarantinedRecord | None = None
        sent = 0
        with conn.transaction():
            stored = self._writer.lock_offset(conn, p)
            if stored != expected or offset < stored:
                raise OffsetConflictError(p, expected, stored)
            for group, group_rows in sorted(rows.by_group().items()):
                try:
                    with conn.transaction():  # a savepoint
                        sent += self._writer.write_rows(conn, group_rows)
                except (psycopg.Error, UnicodeEncodeError) as group_exc:
                    if classify(group_exc) is not ErrorKind.DATA:
                        raise
                    refused.append(group)
                    exc = group_exc
            if refused:
                sqlstate, error = describe(exc)
                record = QuarantinedRecord(
                    partition=p,
                    log_offset=offset,
                    event_types=",".join(dict.fromkeys(type(e).__name__ for e in batch.events)),
                    refused_groups=tuple(refused),
                    sqlstate=sqlstate,
                    error=error,
                )
                self._writer.quarantine(conn, record)
            self._writer.set_offset(conn, p, offset + 1)
            self._notify(conn, p, offset + 1)
        if record is not None:
            self.quarantined += 1
            _log.error(
                "log record quarantined: rows refused",
                extra={"partition": p, "offset": offset, "event_types": record.event_types,
                       "refused": record.refused_groups, "sqlstate": record.sqlstate, "error": record.error},
            )  # fmt: skip
        return sent

    def _conflict(self, part: _Part, conflict: OffsetConflictError) -> None:
        self.conflicts += 1
        _log.info(
            "offset conflict",
            extra={"partition": part.partition, "expected": conflict.expected, "stored": conflict.stored},
        )
        self._resync(part, conflict.stored)

    def _write(self, p: int, expected: int, first_offset: int, next_offset: int, rows: RowSet) -> int:
        conn = self._require_conn()
        writer = self._writer
        if fault_enabled("projection_offsets_separate_transaction"):
            # Fault switch: rows and offset in two transactions (DUR-015 broken on purpose).
            with conn.transaction():
                sent = writer.write_rows(conn, rows)
            failpoint("projector.before_commit")
            with conn.transaction():
                stored = writer.lock_offset(conn, p)
                if stored != expected or first_offset < stored:
                    raise OffsetConflictError(p, expected, stored)
                writer.set_offset(conn, p, next_offset)
                self._notify(conn, p, next_offset)
            return sent
        with conn.transaction():
            stored = writer.lock_offset(conn, p)
            if stored != expected or first_offset < stored:
                raise OffsetConflictError(p, expected, stored)
            sent = writer.write_rows(conn, rows)
            failpoint("projector.before_commit")
            writer.set_offset(conn, p, next_offset)
            self._notify(conn, p, next_offset)
        return sent

    def _notify(self, conn: Conn, p: int, next_offset: int) -> None:
        if self.config.notify and self.config.target == self.config.names.live:
            self._writer.notify(conn, self.config.names.channel, f"{p}:{next_offset}")

    def _decode(self, p: int, msg: Message) -> LogBatch:
        if self.config.validate_records:
            return self.codec.decode_batch(msg.value(), topic=self.topic, partition=p, offset=_offset(msg)).batch
        return self._fast.decode(msg.value(), topic=self.topic, partition=p, offset=_offset(msg))

    # -- positions -------------------------------------------------------------------------------------------------

    def _resync(self, part: _Part, stored: int) -> None:
        """Align the in-memory fold with a stored offset another writer (or a lost commit) moved."""
        if stored >= part.pos:
            part.silent_until = stored
            self._reposition(part.partition, part.pos)
            return
        _log.warning(
            "stored offset went backwards: restoring from offset 0",
            extra={"partition": part.partition, "stored": stored, "position": part.pos},
        )
        part.state = ProjectionState.empty(part.partition)
        part.pos = 0
        part.silent_until = stored
        self._reposition(part.partition, 0)

    def _reposition(self, p: int, offset: int) -> None:
        self._repositioned.add(p)
        consumer = self._require_consumer()
        consumer.incremental_unassign([TopicPartition(self.topic, p)])
        consumer.incremental_assign([TopicPartition(self.topic, p, offset)])
        part = self._parts.get(p)
        if part is not None:
            part.paused = False

    # -- locks and connections -------------------------------------------------------------------------------------

    def _topic_partitions(self) -> tuple[int, ...]:
        admin = AdminClient(admin_config(self.settings))
        meta = admin.list_topics(self.topic, timeout=self.settings.kafka_call_timeout_s).topics.get(self.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise LookupError(f"topic {self.topic} does not exist: run `settled topics create`")
        have = sorted(meta.partitions)
        if self.config.partitions is None:
            return tuple(have)
        missing = sorted(set(self.config.partitions) - set(have))
        if missing:
            raise ValueError(f"partitions {missing} are not partitions of {self.topic} (it has {len(have)})")
        return tuple(sorted(self.config.partitions))

    def _connect(self) -> Conn:
        # No server-side prepared statements: a plan keeps the table it was planned on, and a rebuild's switch
        # renames schemas under the stable name this connection writes through.
        conn = psycopg.connect(self.settings.postgres_dsn, autocommit=True, application_name="settled-projector")
        conn.prepare_threshold = None
        return conn

    def _acquire(self) -> None:
        """Take the advisory locks of the wanted partitions not held yet; start each one taken from offset 0."""
        conn = self._require_conn()
        key = self.config.names.lock_key(self.config.target, self.topic)
        taken = []
        for p in self._wanted:
            if p in self._parts:
                continue
            if self.config.advisory_lock:
                row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s), %s)", (key, p)).fetchone()
                if row is None or not row[0]:
                    continue
            taken.append(p)
        self._next_lock_try = time.monotonic() + self.config.lock_retry_s
        if not taken:
            return
        self._writer.ensure_offsets(conn, taken)
        stored = self._stored(taken)
        consumer = self._require_consumer()
        for p in taken:
            seed = self._seeds.pop(p, None)
            if seed is not None and seed[1] == stored[p]:  # folded up to its stored offset already (`seed`)
                self._parts[p] = _Part(p, seed[0], pos=seed[1], silent_until=seed[1])
                consumer.incremental_assign([TopicPartition(self.topic, p, seed[1])])
            else:
                self._parts[p] = _Part(p, ProjectionState.empty(p), pos=0, silent_until=stored[p])
                consumer.incremental_assign([TopicPartition(self.topic, p, 0)])
            _log.info("partition taken", extra={"partition": p, "stored_next_offset": stored[p]})

    def _stored(self, partitions: list[int]) -> dict[int, int]:
        conn = self._require_conn()
        out = {}
        with conn.transaction():
            for p in partitions:
                out[p] = self._writer.lock_offset(conn, p)
        return out

    def _recover_connection(self) -> None:
        """Reconnect, take the partitions' locks again (dropping those another writer took), resync each.

        Raises:
            TimeoutError: Postgres stayed unreachable for ``reconnect_timeout_s``.
        """
        deadline = time.monotonic() + self.config.reconnect_timeout_s
        delay_s = 0.1
        while True:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            try:
                self._conn = self._connect()
                stored = self._relock()
                break
            except psycopg.Error as exc:
                if classify(exc) is not ErrorKind.TRANSIENT:
                    raise
                if time.monotonic() > deadline:
                    raise TimeoutError(f"postgres unreachable for {self.config.reconnect_timeout_s} s: {exc}") from exc
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, 1.0)
        _log.info("postgres reconnected", extra={"partitions": sorted(self._parts), "stored": stored})
        for p, part in self._parts.items():
            self._resync(part, stored[p])

    def _relock(self) -> dict[int, int]:
        """On a new session: the held partitions' advisory locks again, and their stored offsets."""
        conn = self._require_conn()
        key = self.config.names.lock_key(self.config.target, self.topic)
        consumer = self._require_consumer()
        for p in list(self._parts):
            if self.config.advisory_lock:
                row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s), %s)", (key, p)).fetchone()
                if row is None or not row[0]:
                    _log.warning("partition lost to another writer", extra={"partition": p})
                    consumer.incremental_unassign([TopicPartition(self.topic, p)])
                    del self._parts[p]
        return self._stored(list(self._parts))

    def _require_conn(self) -> Conn:
        if self._conn is None:
            raise RuntimeError("the projector is not open")
        return self._conn

    def _require_consumer(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("the projector is not open")
        return self._consumer


#: How often the projector reads its partitions' lag for the metrics, in seconds.
_LAG_INTERVAL_S = 1.0
_SETTLEMENT_OUTCOME_I = SETTLEMENTS.columns.index("outcome")


def _outcomes(rows: RowSet) -> dict[str, int]:
    """Outcome → settlements among ``rows`` (a chunk's rows, as written)."""
    out: dict[str, int] = {}
    for row in rows.tables[SETTLEMENTS.name].values():
        outcome = str(row[_SETTLEMENT_OUTCOME_I])
        out[outcome] = out.get(outcome, 0) + 1
    return out


def _offset(msg: Message) -> int:
    offset = msg.offset()
    if offset is None:  # pragma: no cover - consumed records always carry an offset
        raise ValueError("a consumed record has no offset")
    return offset
