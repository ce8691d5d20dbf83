"""A rebuild's replay: fold whole partitions in memory, write their final rows once with COPY (docs/design.md §6).

A rebuild writes into a fresh schema version nobody reads, so it needs none of the live projector's per-chunk
upserts: `BulkReplay` reads its partitions from offset 0 up to target offsets (read_committed), decodes each record
once (`FastBatchDecoder`), folds and projects it as the live projector's `project_batch` does (`project_chunk`: a
poll's records of a partition folded first, then their rows) into one `RowSet` per partition — merged per key in
memory by the tables' own merge rules (conversations, submissions and the in-state attempt rows built once per key:
`RowSet.finish`), so the rows are those the live projector would have upserted chunk by chunk — and writes the rows
with binary ``COPY`` together with the partitions' offset rows in **one** transaction (rows and offsets together,
DUR-015). That transaction is open during the replay: the transcript rows (append-only, most of the rows) go into
its ``COPY`` poll by poll, the other tables' final rows and the offsets after the replay. Every table's key starts
with the partition or the conversation (`settled.projections.TABLES`) and a conversation lives on one partition, so
the shares of a rebuild do not write the same row; a row that is there already is refused like any data error, below.

A row PostgreSQL refuses (a data error by SQLSTATE class, `settled.projections._sqlstate`: a NUL character, an index
row over the btree maximum) rolls that transaction back, and the share replays its partitions from offset 0 through
the projector instead (`RowsRefusedError`), which writes each record it cannot write alone into the quarantine table as
the live projector does: the rebuild quarantines the same records as the live projector, so the two agree.

`RebuildShare` is one process's share of a rebuild: the bulk replay, then catch-up on demand through a `Projector`
seeded with the folded states (`Projector.seed`), so nothing is read twice. `SharePool` runs the shares, in this
process or one child process each (the fold is CPU-bound and holds the GIL), and relays their progress.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkContext, SpawnContext
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql

from settled._errors import ErrorCategory, SettledError
from settled._settings import Settings
from settled.producers import consume_promptly, reader_config
from settled.projections._projector import ChunkApplied, Projector, ProjectorConfig, is_record
from settled.projections._rows import ProjectionState, Row, RowSet, project_chunk
from settled.projections._schema import ProjectionNames
from settled.projections._sqlstate import ErrorKind, classify, describe
from settled.projections._store import ProjectionWriter
from settled.projections._tables import TABLES, TRANSCRIPT, TableSpec
from settled.schemas import Codec, FastBatchDecoder, LogBatch

__all__ = [
    "BulkReplay",
    "RebuildShare",
    "RebuildWorkerError",
    "ReplayTimings",
    "RowsRefusedError",
    "SharePool",
    "shared_decoder",
    "split_partitions",
]

_log = logging.getLogger("settled.projections")

Conn = psycopg.Connection[tuple[Any, ...]]

_PROGRESS_EVERY_S = 0.25


class RebuildWorkerError(SettledError, RuntimeError):
    """A rebuild's child process failed; its error is named here (the original may not survive pickling).

    Attributes:
        error_type: The original exception's class name (e.g. ``StaleEpochError``, ``DecodeError``).
        detail: Its message.
        child_traceback: The child's formatted traceback.
    """

    category = ErrorCategory.BROKEN_INVARIANT

    def __init__(self, error_type: str, detail: str, child_traceback: str) -> None:
        super().__init__(f"a rebuild worker failed: {error_type}: {detail}")
        self.error_type = error_type
        self.detail = detail
        self.child_traceback = child_traceback


class RowsRefusedError(SettledError):
    """PostgreSQL refused rows of the bulk write (a data error, `settled.projections._sqlstate.ErrorKind.DATA`).

    The write's transaction rolled back: nothing of it is stored. The bulk write cannot tell which record's rows
    were refused, so the share replays through the projector, which quarantines them one record at a time.
    """

    category = ErrorCategory.BAD_INPUT


@dataclass
class ReplayTimings:
    """Where a replay's time went, in seconds (summed over the processes that replayed).

    Attributes:
        consume: Waiting for and receiving records from Kafka.
        decode: Decoding records into batches (`FastBatchDecoder`).
        fold: The fold pass of `project_chunk`: the protocol fold (`settled.protocol.apply_conversation`) and each
            batch's pass over its events for the rows.
        rows: The row pass of `project_chunk` and the rows built per key at the end (`RowSet.finish`).
        write: Writing rows and offsets to Postgres (the bulk ``COPY``).
        catch_up: Catching up to later targets through the seeded projector (all of its parts together).
        cpu: CPU seconds the replaying processes used for the bulk replay and its write (``time.process_time``: all
            their threads, librdkafka's included): unlike the wall-clock figures above, not stretched when other
            processes take the cores.
        records: Records (batches) replayed.
        events: Events in them.
        rows_written: Rows the bulk write sent.
    """

    consume: float = 0.0
    decode: float = 0.0
    fold: float = 0.0
    rows: float = 0.0
    write: float = 0.0
    catch_up: float = 0.0
    cpu: float = 0.0
    records: int = 0
    events: int = 0
    rows_written: int = 0

    def add(self, other: ReplayTimings) -> None:
        """Add another process's timings to these.

        Args:
            other: The timings to add.
        """
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, float]:
        """Return the timings as a plain dict (counts stay integers).

        Returns:
            Field name → value.
        """
        return {f.name: getattr(self, f.name) for f in fields(self)}


_DECODER: list[FastBatchDecoder] = []
_DECODER_LOCK = threading.Lock()


def shared_decoder() -> FastBatchDecoder:
    """Return this process's `FastBatchDecoder` (built on first use: tens of milliseconds of compiling).

    A replaying process builds it right after assigning its partitions, while its first fetch is in flight; a
    process forked from one that built it (or loaded the schemas) inherits that work.

    Returns:
        The decoder (one per process; it holds no per-record state).
    """
    with _DECODER_LOCK:
        if not _DECODER:
            _DECODER.append(FastBatchDecoder(Codec()))
        return _DECODER[0]


def split_partitions(targets: Mapping[int, int], shares: int) -> list[list[int]]:
    """Split partitions into at most ``shares`` groups of about equal work (offsets to replay), largest first.

    Args:
        targets: Partition → offsets to replay.
        shares: Groups wanted (at least 1).

    Returns:
        Non-empty groups, each sorted; empty partitions go with the lightest group.
    """
    groups: list[list[int]] = [[] for _ in range(max(1, shares))]
    load = [0] * len(groups)
    for p in sorted(targets, key=lambda q: (-targets[q], q)):
        i = load.index(min(load))
        groups[i].append(p)
        load[i] += targets[p]
    return [sorted(g) for g in groups if g]


def copy_types(conn: Conn, schema: str) -> dict[str, list[str]]:
    """Return the Postgres type of every column of the projection tables, for binary ``COPY``.

    Args:
        conn: A connection.
        schema: The projection schema (migrated).

    Returns:
        Table → type names in `settled.projections.TableSpec.columns` order (arrays as ``text[]``).
    """
    rows = conn.execute(
        "SELECT table_name, column_name, udt_name FROM information_schema.columns WHERE table_schema = %s",
        (schema,),
    ).fetchall()
    found = {(str(t), str(c)): str(u) for t, c, u in rows}
    out: dict[str, list[str]] = {}
    for name, spec in TABLES.items():
        types = []
        for column in spec.columns:
            udt = found[(name, column)]
            types.append(f"{udt[1:]}[]" if udt.startswith("_") else udt)
        out[name] = types
    return out


@dataclass
class BulkReplay:
    """Replays some log partitions from offset 0 into a fresh schema version (module doc).

    Attributes:
        settings: Namespace, Kafka and Postgres.
        schema: The schema written (a rebuild's ``<base>__next`` or the check's scratch copy), migrated and empty.
        partitions: The log partitions replayed.
        max_records: Records consumed per poll.
        poll_timeout_s: Longest wait of one poll, in seconds.
        stream: ``COPY`` the transcript rows while the replay goes on, in its transaction (the other tables once
            at its end): Postgres stores them while this process folds, instead of after it.
        timings: Where the time went (filled by `run`).
    """

    settings: Settings
    schema: str
    partitions: Sequence[int]
    max_records: int = 10_000
    poll_timeout_s: float = 0.2
    stream: bool = True
    timings: ReplayTimings = field(default_factory=ReplayTimings)

    def run(
        self,
        targets: Mapping[int, int],
        deadline: float,
        progress: Callable[[dict[int, int], int, int], None] | None = None,
    ) -> dict[int, tuple[ProjectionState, int]]:
        """Fold every record below each partition's target, write the rows and offsets in one transaction.

        Args:
            targets: Partition → first offset not to apply (records at or past it are left for the catch-up).
            deadline: ``time.monotonic()`` bound.
            progress: Called now and then with (next offset per partition, records, events) so far.

        Returns:
            Partition → (its committed projection state, its stored next offset).

        Raises:
            TimeoutError: The deadline passed.
            settled.protocol.ProtocolError: The fold refused a batch.
            settled.schemas.DecodeError: A record is not a decodable batch.
            RowsRefusedError: PostgreSQL refused some rows (a data error); nothing was written.
            psycopg.Error: The write failed otherwise (e.g. the connection was lost).
        """
        was_enabled = gc.isenabled()
        gc.disable()  # the replay builds a large, acyclic heap: the cycle collector only rescans it
        cpu = time.process_time()
        try:
            states, nexts = self._replay_and_write(targets, deadline, progress)
        finally:
            self.timings.cpu += time.process_time() - cpu
            if was_enabled:
                gc.enable()
        return {p: (states[p].commit(), nexts[p]) for p in self.partitions}

    def _replay(
        self,
        targets: Mapping[int, int],
        deadline: float,
        progress: Callable[[dict[int, int], int, int], None] | None,
        stream: Callable[[Row], None] | None = None,
    ) -> tuple[dict[int, ProjectionState], dict[int, int], dict[int, RowSet]]:
        topic = self.settings.topic("log")
        clock = time.perf_counter
        want = {p: int(targets.get(p, 0)) for p in self.partitions}
        states = {p: ProjectionState.empty(p) for p in self.partitions}
        streamed = TRANSCRIPT if stream is not None else None
        rowsets = {p: RowSet(clock=clock, deferred=True, streamed=streamed) for p in self.partitions}
        nexts = dict.fromkeys(self.partitions, 0)
        active = {p for p, t in want.items() if t > 0}
        timings = self.timings
        consumer = Consumer(
            reader_config(
                self.settings, f"{self.settings.namespace}.projection-rebuild", **{"auto.offset.reset": "earliest"}
            )
        )
        next_report = 0.0
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in sorted(active)])
            # Built (unless this process has one already) while the first fetch is in flight.
            decoder = shared_decoder()
            decode = decoder.decode
            while active:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the replay of {topic} did not reach {want} in time (at {nexts})")
                started = clock()
                # What is ready now, waiting only for the first record: a batch consume would wait out its whole
                # timeout whenever fewer records than it asks for are left (the last poll of every replay).
                msgs = consume_promptly(consumer, self.max_records, self.poll_timeout_s)
                timings.consume += clock() - started
                # Decode the whole poll first, then fold it, then derive its rows (`project_chunk`): each loop's code
                # stays hot (measured: ~10-20 % less CPU per batch than alternating record by record).
                t0 = clock()
                todo: dict[int, list[tuple[int, LogBatch]]] = {}
                failure: Exception | None = None
                # The partition of the previous record, its chunk and target: a poll's records come in runs of one
                # partition, so these are looked up once per run, not per record.
                last_p: int | None = None
                chunk: list[tuple[int, LogBatch]] = []
                target = 0
                try:
                    for msg in msgs:
                        if msg.error() is not None and not is_record(msg):
                            continue
                        p = msg.partition()
                        offset = msg.offset()
                        if p is None:
                            continue
                        if p != last_p:
                            if p not in active:
                                continue
                            last_p, target = p, want[p]
                            found = todo.get(p)
                            chunk = todo[p] = [] if found is None else found
                        if offset is None:
                            continue
                        if offset >= target:
                            self._done(consumer, topic, p, target, nexts, active)
                            last_p = None
                            continue
                        chunk.append((offset, decode(msg.value(), topic=topic, partition=p, offset=offset)))
                        nexts[p] = offset + 1
                        if offset + 1 >= target:
                            self._done(consumer, topic, p, target, nexts, active)
                            last_p = None
                except Exception as exc:  # noqa: BLE001 - re-raised below, once the records before it are folded
                    failure = exc
                t1 = clock()
                for p, records in todo.items():  # partitions are independent: each folds its own records in order
                    if records:
                        states[p] = project_chunk(states[p], records, rowsets[p])
                if failure is not None:
                    raise failure
                timings.decode += t1 - t0
                t2 = clock()
                timings.rows += t2 - t1
                if stream is not None:  # the poll's new transcript rows, into the open COPY
                    for p in todo:
                        fresh = rowsets[p].fresh
                        if fresh:
                            for row in fresh:
                                stream(row)
                            timings.rows_written += len(fresh)
                            fresh.clear()
                    timings.write += clock() - t2
                # Offsets below a target may hold no record a read_committed reader sees (markers, aborted ones).
                for p in list(active):
                    position = consumer.position([TopicPartition(topic, p)])[0].offset
                    if position >= want[p]:
                        self._done(consumer, topic, p, want[p], nexts, active)
                if progress is not None and (not active or time.monotonic() >= next_report):
                    next_report = time.monotonic() + _PROGRESS_EVERY_S
                    progress(dict(nexts), sum(r.batches for r in rowsets.values()),
                             sum(r.events for r in rowsets.values()))  # fmt: skip
        finally:
            consumer.close()
        started = clock()
        for rowset in rowsets.values():
            rowset.finish()
        timings.rows += clock() - started
        for rowset in rowsets.values():
            timings.fold += rowset.fold_s
            timings.rows -= rowset.fold_s
            timings.records += rowset.batches
            timings.events += rowset.events
        return states, nexts, rowsets

    @staticmethod
    def _done(consumer: Consumer, topic: str, p: int, target: int, nexts: dict[int, int], active: set[int]) -> None:
        nexts[p] = target  # every record below the target is folded: the offsets between are no records
        active.discard(p)
        consumer.pause([TopicPartition(topic, p)])

    def _replay_and_write(
        self,
        targets: Mapping[int, int],
        deadline: float,
        progress: Callable[[dict[int, int], int, int], None] | None,
    ) -> tuple[dict[int, ProjectionState], dict[int, int]]:
        """Replay inside the write's transaction, then write the other rows and the offsets (DUR-015: one commit).

        With `stream`, the transcript rows go into a ``COPY`` open during the replay (`_replay`'s ``stream``).
        """
        started = time.perf_counter()
        topic = self.settings.topic("log")
        writer = ProjectionWriter(self.schema, topic)
        conn: Conn = psycopg.connect(self.settings.postgres_dsn, autocommit=True, application_name="settled-rebuild")
        conn.prepare_threshold = None
        replayed: tuple[dict[int, ProjectionState], dict[int, int], dict[int, RowSet]] | None = None
        replay_s = 0.0
        try:
            types = copy_types(conn, self.schema)
            writer.ensure_offsets(conn, self.partitions)
            with conn.transaction(), conn.cursor() as cur:
                for p in self.partitions:
                    self._expect_offset(conn, writer, p, 0)
                if self.stream:
                    with cur.copy(self._copy_statement(TRANSCRIPT)) as copy:
                        copy.set_types(types[TRANSCRIPT.name])
                        replay_started = time.perf_counter()
                        replayed = self._replay(targets, deadline, progress, copy.write_row)
                        replay_s = time.perf_counter() - replay_started
                else:
                    replay_started = time.perf_counter()
                    replayed = self._replay(targets, deadline, progress)
                    replay_s = time.perf_counter() - replay_started
                _, nexts, rowsets = replayed
                self._copy(cur, types, rowsets, skip=TRANSCRIPT if self.stream else None)
                for p in self.partitions:
                    writer.set_offset(conn, p, nexts[p])
        except (psycopg.Error, UnicodeEncodeError) as exc:
            if classify(exc) is not ErrorKind.DATA:
                raise
            _, error = describe(exc)
            raise RowsRefusedError(f"{self.schema}: PostgreSQL refused rows of the bulk write: {error}") from exc
        finally:
            conn.close()
            # The write is what the replay's own phases do not cover (the streamed rows were timed as they went).
            self.timings.write += time.perf_counter() - started - replay_s
        states, nexts, _ = replayed
        return states, nexts

    def _copy_statement(self, spec: TableSpec) -> sql.Composed:
        columns = sql.SQL(", ").join(sql.Identifier(c) for c in spec.columns)
        return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            sql.Identifier(self.schema, spec.name), columns
        )

    def _copy(
        self,
        cur: psycopg.Cursor[tuple[Any, ...]],
        types: Mapping[str, list[str]],
        rowsets: Mapping[int, RowSet],
        skip: TableSpec | None,
    ) -> None:
        for name, spec in TABLES.items():
            if spec is skip:
                continue
            parts = [rowsets[p].tables[name] for p in self.partitions if rowsets[p].tables[name]]
            if not parts:
                continue
            with cur.copy(self._copy_statement(spec)) as copy:
                copy.set_types(types[name])
                write_row = copy.write_row
                for rows in parts:
                    for row in rows.values():
                        write_row(row)
                    self.timings.rows_written += len(rows)

    def _expect_offset(self, conn: Conn, writer: ProjectionWriter, p: int, expected: int) -> None:
        stored = writer.lock_offset(conn, p)
        if stored != expected:
            raise RuntimeError(
                f"{self.schema}.offsets of partition {p} is at {stored}, not {expected}: another writer is "
                "replaying into this schema version"
            )


# ---------------------------------------------------------------------------------------------------- shares


@dataclass
class RebuildShare:
    """One process's share of a rebuild or check: a bulk replay, then catch-up on demand (module doc).

    Attributes:
        settings: Namespace, Kafka and Postgres.
        names: The projection's schema names.
        schema: The schema written.
        partitions: This share's log partitions.
        max_records: Records consumed per poll.
    """

    settings: Settings
    names: ProjectionNames
    schema: str
    partitions: Sequence[int]
    max_records: int = 10_000
    timings: ReplayTimings = field(default_factory=ReplayTimings)
    _seeds: dict[int, tuple[ProjectionState, int]] = field(default_factory=dict)
    _projector: Projector | None = None
    _records: int = 0
    _events: int = 0

    def bulk(
        self,
        targets: Mapping[int, int],
        deadline: float,
        progress: Callable[[dict[int, int], int, int], None] | None = None,
    ) -> dict[int, int]:
        """Replay this share's partitions up to ``targets`` (`BulkReplay.run`).

        Args:
            targets: Partition → first offset not to apply.
            deadline: ``time.monotonic()`` bound.
            progress: Called with (next offsets, records, events) so far.

        Returns:
            Partition → stored next offset.
        """
        replay = BulkReplay(self.settings, self.schema, self.partitions, max_records=self.max_records)
        mine = {p: targets.get(p, 0) for p in self.partitions}
        try:
            self._seeds = replay.run(mine, deadline, progress)
        except RowsRefusedError as exc:
            # Nothing was written: replay from offset 0 through the projector, which quarantines what is refused.
            _log.warning(
                "bulk write refused; replaying through the projector", extra={"schema": self.schema, "error": str(exc)}
            )
            self.timings.add(replay.timings)
            self._seeds = {}
            return self.until(mine, deadline, exact=True, progress=progress)
        self.timings.add(replay.timings)
        self._records, self._events = replay.timings.records, replay.timings.events
        return {p: offset for p, (_, offset) in self._seeds.items()}

    def until(
        self,
        targets: Mapping[int, int],
        deadline: float,
        *,
        exact: bool = False,
        progress: Callable[[dict[int, int], int, int], None] | None = None,
        stop_at: float | None = None,
    ) -> dict[int, int]:
        """Catch up to ``targets`` through a projector seeded with the bulk replay's states.

        Args:
            targets: Partition → offset to reach (records below it applied).
            deadline: ``time.monotonic()`` bound.
            exact: Apply nothing at or past the targets (the check compares at identical offsets).
            progress: Called with (next offsets, records, events) so far.
            stop_at: ``time.monotonic()`` after which it returns where it is, short of the targets, without raising
                (the caller compares the positions with its targets; checked between projector steps).

        Returns:
            Partition → the projector's next offset.

        Raises:
            TimeoutError: The deadline passed.
        """
        started = time.perf_counter()
        mine = {p: int(targets.get(p, 0)) for p in self.partitions}
        if self._projector is None and all(p in self._seeds and self._seeds[p][1] >= mine[p] for p in self.partitions):
            # The bulk replay already reached the targets (nothing appended since): no projector to open.
            positions = {p: self._seeds[p][1] for p in self.partitions}
            if progress is not None:
                progress(positions, self._records, self._events)
            self.timings.catch_up += time.perf_counter() - started
            return positions
        projector = self._open_projector()
        projector.set_limits(mine if exact else None)
        next_report = 0.0
        while not projector.caught_up(mine):
            now = time.monotonic()
            if stop_at is not None and now > stop_at:
                break
            if now > deadline:
                raise TimeoutError(f"catch-up did not reach {mine} in time (at {projector.positions()})")
            projector.step()
            if progress is not None and time.monotonic() >= next_report:
                next_report = time.monotonic() + _PROGRESS_EVERY_S
                progress(projector.positions(), self._records, self._events)
        if progress is not None:
            progress(projector.positions(), self._records, self._events)
        self.timings.catch_up += time.perf_counter() - started
        return projector.positions()

    def _open_projector(self) -> Projector:
        if self._projector is not None:
            return self._projector
        projector = Projector(
            self.settings,
            ProjectorConfig(
                names=self.names,
                schema=self.schema,
                partitions=tuple(self.partitions),
                notify=False,
                max_records=min(self.max_records, 5000),
            ),
        )
        for p, (state, offset) in self._seeds.items():
            projector.seed(p, state, offset)
        self._seeds = {}

        def on_chunk(chunk: ChunkApplied) -> None:
            self._records += chunk.records
            self._events += chunk.events
            self.timings.records += chunk.records
            self.timings.events += chunk.events

        projector.on_chunk = on_chunk
        projector.open()
        missing = sorted(set(self.partitions) - set(projector.held()))
        if missing:
            projector.close()
            raise RuntimeError(f"{self.schema}: partitions {missing} are held by another writer")
        self._projector = projector
        return projector

    def close(self) -> None:
        """Close the catch-up projector, if one was opened."""
        if self._projector is not None:
            self._projector.close()
            self._projector = None


def _share_main(
    conn: Connection,
    settings: Settings,
    names: ProjectionNames,
    schema: str,
    partitions: list[int],
    targets: dict[int, int],
    max_records: int,
    timeout_s: float,
) -> None:
    """A share's child process: bulk replay, then catch-up commands from the parent until told to stop."""
    deadline = time.monotonic() + timeout_s
    share = RebuildShare(settings, names, schema, partitions, max_records)

    def progress(nexts: dict[int, int], records: int, events: int) -> None:
        conn.send(("progress", nexts, records, events))

    try:
        nexts = share.bulk(targets, deadline, progress)
        conn.send(("bulk", nexts, share.timings.as_dict()))
        while True:
            command = conn.recv()
            if command[0] == "stop":
                break
            _, wanted, exact, stop_at = command
            nexts = share.until(wanted, deadline, exact=exact, progress=progress, stop_at=stop_at)
            conn.send(("at", nexts, share.timings.as_dict()))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises RebuildWorkerError
        conn.send(("error", type(exc).__name__, str(exc), traceback.format_exc()))
    finally:
        share.close()
        conn.close()


@dataclass
class _Child:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    partitions: list[int]
    nexts: dict[int, int]
    records: int = 0
    events: int = 0
    timings: ReplayTimings = field(default_factory=ReplayTimings)


class SharePool:
    """Runs a rebuild's shares, in this process (one share) or one child process each, and relays progress.

    Args:
        settings: Namespace, Kafka and Postgres.
        names: The projection's schema names.
        schema: The schema written.
        targets: Partition → the bulk replay's target offset.
        workers: Shares wanted; 1 runs in this process.
        max_records: Records consumed per poll.
        timeout_s: Bound on the children's whole life, in seconds.
        progress: Called with (next offset per partition, records, events), all shares together.
    """

    def __init__(
        self,
        settings: Settings,
        names: ProjectionNames,
        schema: str,
        targets: Mapping[int, int],
        *,
        workers: int,
        max_records: int,
        timeout_s: float,
        progress: Callable[[dict[int, int], int, int], None] | None = None,
    ) -> None:
        self.settings = settings
        self.targets = dict(targets)
        self.progress = progress
        self.groups = split_partitions(self.targets, workers)
        self._children: list[_Child] = []
        self._local: RebuildShare | None = None
        self._timeout_s = timeout_s
        if len(self.groups) <= 1:
            self._local = RebuildShare(settings, names, schema, sorted(self.targets), max_records)
            return
        # fork is cheap, but only safe while this process runs no other thread; else start clean interpreters.
        context: ForkContext | SpawnContext
        if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
            context = multiprocessing.get_context("fork")
        else:
            context = multiprocessing.get_context("spawn")
        self.start_method = context.get_start_method()
        for group in self.groups:
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=_share_main,
                args=(child_end, settings, names, schema, group, {p: self.targets[p] for p in group}, max_records,
                      timeout_s),
                name=f"settled-rebuild-{group[0]}",
                daemon=True,
            )  # fmt: skip
            process.start()
            child_end.close()
            self._children.append(_Child(process, parent_end, group, dict.fromkeys(group, 0)))

    start_method: str = "in-process"

    @property
    def workers(self) -> int:
        """Processes replaying (1 when in this process)."""
        return max(1, len(self._children))

    def timings(self) -> ReplayTimings:
        """Return the shares' timings summed."""
        if self._local is not None:
            return self._local.timings
        total = ReplayTimings()
        for child in self._children:
            total.add(child.timings)
        return total

    def bulk(self, deadline: float) -> dict[int, int]:
        """Wait for every share's bulk replay.

        Args:
            deadline: ``time.monotonic()`` bound.

        Returns:
            Partition → stored next offset.
        """
        if self._local is not None:
            return self._local.bulk(self.targets, deadline, self.progress)
        return self._collect("bulk", deadline)

    def until(
        self, targets: Mapping[int, int], deadline: float, *, exact: bool = False, stop_at: float | None = None
    ) -> dict[int, int]:
        """Have every share catch up to ``targets`` (`RebuildShare.until`).

        Args:
            targets: Partition → offset to reach.
            deadline: ``time.monotonic()`` bound (TimeoutError past it).
            exact: Apply nothing at or past the targets.
            stop_at: ``time.monotonic()`` after which each share answers where it is, short of the targets: every
                command still gets exactly one answer, so a later command never reads a stale one.

        Returns:
            Partition → next offset.
        """
        if self._local is not None:
            return self._local.until(targets, deadline, exact=exact, progress=self.progress, stop_at=stop_at)
        for child in self._children:
            child.conn.send(("until", {p: int(targets.get(p, 0)) for p in child.partitions}, exact, stop_at))
        return self._collect("at", deadline)

    def _collect(self, kind: str, deadline: float) -> dict[int, int]:
        waiting = {child.conn: child for child in self._children}
        out: dict[int, int] = {}
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"rebuild workers did not finish ({kind}) in time")
            for ready in wait(list(waiting), timeout=min(left, 1.0)):
                child = waiting[ready]  # type: ignore[index]
                try:
                    message = child.conn.recv()
                except EOFError as exc:
                    code = child.process.exitcode
                    raise RebuildWorkerError("EOFError", f"worker for {child.partitions} exited ({code})", "") from exc
                if message[0] == "progress":
                    _, child.nexts, child.records, child.events = message
                    self._report()
                elif message[0] == "error":
                    raise RebuildWorkerError(message[1], message[2], message[3])
                else:
                    _, nexts, timings = message
                    child.nexts = dict(nexts)
                    child.timings = ReplayTimings(**timings)
                    out.update(nexts)
                    del waiting[ready]  # type: ignore[arg-type]
            for child in waiting.values():
                if not child.process.is_alive() and not child.conn.poll():
                    raise RebuildWorkerError(
                        "exit", f"worker for {child.partitions} exited ({child.process.exitcode})", ""
                    )
        self._report()
        return out

    def _report(self) -> None:
        if self.progress is None:
            return
        nexts: dict[int, int] = {}
        for child in self._children:
            nexts.update(child.nexts)
        self.progress(nexts, sum(c.records for c in self._children), sum(c.events for c in self._children))

    def close(self) -> None:
        """Stop the shares (children are told to stop, then terminated if they linger)."""
        if self._local is not None:
            self._local.close()
            return
        for child in self._children:
            try:
                child.conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        for child in self._children:
            child.process.join(10)
            if child.process.is_alive():
                child.process.terminate()
                child.process.join(5)
            child.conn.close()


def default_workers() -> int:
    """Return how many processes a rebuild replays with by default: one per core (``os.cpu_count()``).

    Returns:
        At least 1.
    """
    return max(1, os.cpu_count() or 1)
