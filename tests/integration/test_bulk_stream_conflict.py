"""The bulk replay, streamed and not, with one request id in two partitions: same tables, the reference fold's,
offsets with rows.

`BulkReplay` (settled/projections/_bulk.py) writes its partitions' rows and offsets in one transaction (DUR-015);
with ``stream=True`` the transcript rows go into a ``COPY`` open while the replay runs.

A client reuses one abort ``command_id`` for conversations on the two log partitions; the worker rejects both
(unknown target), so both partitions carry a receipt with that request id. Receipts are keyed by (conversation,
request id) (layout 2, settled/projections/sql/0002_conversation_keys.sql), so the two shares of a rebuild, run in
turn, partition 0 first, write both receipts without meeting each other's rows (an earlier layout keyed receipts by
request id alone and the second share had to fall back to upserts, keeping only partition 0's receipt).

Asserted, for ``stream=True`` and ``stream=False``: the tables end identical between the two and equal to the
reference rows (`project_batch` over the whole log, both receipts there) and to `fold_reference`'s fold-derived
columns; each partition's offset is its target; and no reader ever sees partition 1's offset without all of its rows
or its rows without its offset (sampled from another connection during the replay and throughout the write).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from settled._settings import Settings
from settled.processors import Worker
from settled.producers import provision_topics
from settled.projections import (
    FOLD_COLUMNS,
    TABLES,
    ProjectionState,
    RowSet,
    fold_reference,
    migrate,
    project_batch,
    read_offsets,
    read_table,
)
from settled.projections._bulk import BulkReplay
from settled.protocol import PartitionState, fold
from settled.runtime import App
from settled.schemas import CommandRejected, LogBatch, Settlement
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests.harness.factories import abort_command, proposal
from tests.integration.admission_load import log_batches
from tests.integration.helpers import CODEC, committed_log_ends, conversations_on, running, wait_for
from tests.integration.workerproc import Inbox

pytestmark = pytest.mark.integration

PER_CONVERSATION = 3

Tables = dict[str, dict[tuple[Any, ...], tuple[Any, ...]]]


@pytest.fixture
def schemas(postgres_dsn: str) -> Iterator[dict[bool, str]]:
    """Two migrated, empty projection schemas: one for ``stream=True``, one for ``stream=False``."""
    base = f"bsc_{uuid.uuid4().hex[:10]}"
    made = {True: f"{base}_stream", False: f"{base}_plain"}
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for schema in made.values():
            migrate(conn, schema)
    yield made
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for schema in made.values():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _tables(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Tables:
    return {name: {k: tuple(v) for k, v in read_table(conn, schema, spec).items()} for name, spec in TABLES.items()}


def _reference(batches: list[tuple[int, int, LogBatch]], partitions: list[int]) -> tuple[Tables, dict[int, Any]]:
    """The reference rows (one `RowSet`, partitions folded in order, as `check` does) and each partition's fold."""
    rows = RowSet()
    folds: dict[int, Any] = {}
    for p in partitions:
        mine = sorted((o, b) for q, o, b in batches if q == p)
        state = ProjectionState.empty(p)
        for offset, batch in mine:
            state = project_batch(state, batch, offset, rows)
        folds[p] = fold_reference(fold(PartitionState(partition=p), [b for _, b in mine]))
    return {name: {k: tuple(v) for k, v in rows.tables[name].items()} for name in TABLES}, folds


def _rows_of(tables: Tables, partition: int, conversations: set[str]) -> dict[str, int]:
    """How many rows of each table belong to ``partition`` (its conversations)."""
    out: dict[str, int] = {}
    for name, spec in TABLES.items():
        if name == "partitions":
            i = spec.columns.index("partition")
            out[name] = sum(1 for row in tables[name].values() if row[i] == partition)
            continue
        i = spec.columns.index("conversation_id")
        out[name] = sum(1 for row in tables[name].values() if row[i] in conversations)
    return out


class _Observer:
    """Samples, from its own connection, partition 1's offset and row counts in one snapshot each time.

    Every sample must be all-or-nothing: offset 0 and none of the partition's rows, or the target offset and all of
    them (the rows and the offset of a bulk replay commit together, DUR-015). Partition 1's rows are counted by
    conversation.
    """

    def __init__(self, dsn: str, schema: str, topic: str, partition: int, conversations: set[str]) -> None:
        self.dsn, self.schema, self.topic = dsn, schema, topic
        self.partition, self.conversations = partition, conversations
        self.conn: psycopg.Connection[tuple[Any, ...]] = psycopg.connect(dsn, autocommit=True)
        self.conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        self.samples: list[tuple[int, dict[str, int]]] = []
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="bulk-observer")

    def sample(self) -> tuple[int, dict[str, int]]:
        with self._lock, self.conn.transaction():
            offset = read_offsets(self.conn, self.schema, self.topic).get(self.partition, 0)
            counts = _rows_of(_tables(self.conn, self.schema), self.partition, self.conversations)
        self.samples.append((offset, counts))
        return offset, counts

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                self.sample()
                time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test through `errors`
            self.errors.append(exc)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        self.conn.close()


def test_one_request_id_in_two_partitions_writes_the_same_rows_streamed_or_not(
    settings: Settings, schemas: dict[bool, str]
) -> None:
    s = settings.model_copy(update={"partitions": 2})
    provision_topics(s, CODEC, datetime.now(UTC))
    convs = {p: {conversations_on(p, 2, f"conflict-{p}{c}")[0] for c in "ab"} for p in (0, 1)}
    shared_command = f"abort-shared-{uuid.uuid4().hex[:8]}"
    proposals = [
        proposal(cid, value={"n": i}) for p in (0, 1) for cid in sorted(convs[p]) for i in range(PER_CONVERSATION)
    ]
    # One command id, reused by a client for a conversation on each partition: two receipts with one request id.
    aborts = [abort_command(min(convs[p]), "no-such-submission", command_id=shared_command) for p in (0, 1)]

    worker: Worker[Any] = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    inbox = Inbox(s)

    def events_seen() -> tuple[int, int]:
        events = [e for _, _, b in log_batches(s) for e in b.events]
        settled = sum(1 for e in events if isinstance(e, Settlement))
        rejected = sum(1 for e in events if isinstance(e, CommandRejected) and e.command_id == shared_command)
        return settled, rejected

    with running(worker):
        inbox.send(*proposals, *aborts)
        wait_for(lambda: events_seen() == (len(proposals), 2), 90, "every proposal settled and both aborts rejected")

    batches = log_batches(s)
    targets = committed_log_ends(s)
    assert sorted(targets) == [0, 1] and all(targets[p] > 0 for p in (0, 1)), targets
    for p, _, b in batches:  # the conversations are where the partitioner said
        assert b.conversation_id.startswith("~partition/") or b.conversation_id in convs[p], (p, b.conversation_id)
    reference, folds = _reference(batches, [0, 1])
    for p in (0, 1):  # one receipt per conversation that used the id
        shared = reference["receipts"][(min(convs[p]), shared_command)]
        assert shared[TABLES["receipts"].columns.index("outcome")] == "rejected", shared
    full = _rows_of(reference, 1, convs[1])
    assert full["transcript"] > 0 and full["receipts"] > 0, full

    topic = s.topic("log")
    ended: dict[bool, Tables] = {}
    offsets: dict[bool, dict[int, int]] = {}
    for stream in (True, False):
        schema = schemas[stream]
        deadline = time.monotonic() + 120
        # Share 1 of a rebuild (partition 0) commits first; it holds the shared receipt.
        first = BulkReplay(s, schema, [0], max_records=5, stream=stream)
        assert first.run({0: targets[0]}, deadline)[0][1] == targets[0]

        observer = _Observer(s.postgres_dsn, schema, topic, 1, convs[1])
        in_replay: list[tuple[int, dict[str, int]]] = []

        def progress(
            nexts: dict[int, int],
            records: int,
            events: int,
            obs: _Observer = observer,
            seen: list[tuple[int, dict[str, int]]] = in_replay,
        ) -> None:
            seen.append(obs.sample())  # the write's transaction is open now: nothing of it is visible

        second = BulkReplay(s, schema, [1], max_records=5, stream=stream)
        observer.thread.start()
        try:
            result = second.run({1: targets[1]}, deadline, progress)
            observer.sample()
        finally:
            observer.close()
        assert not observer.errors, observer.errors
        assert result[1][1] == targets[1]
        assert in_replay, "progress was never reported during the replay"
        assert all(sample == (0, dict.fromkeys(TABLES, 0)) for sample in in_replay), (
            f"stream={stream}: rows or offset of the open replay were visible: {in_replay}"
        )
        torn = [
            (o, c) for o, c in observer.samples if (o, c) not in ((0, dict.fromkeys(TABLES, 0)), (targets[1], full))
        ]
        assert not torn, f"stream={stream}: offset and rows of partition 1 seen apart: {torn[:5]} (all: {full})"
        assert observer.samples[-1] == (targets[1], full)

        with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
            ended[stream] = _tables(conn, schema)
            offsets[stream] = read_offsets(conn, schema, topic)

    # Identical between streamed and not, and equal to the reference rows: nothing lost, nothing doubled.
    for name in TABLES:
        assert ended[True][name] == ended[False][name], f"{name}: streamed and unstreamed writes differ"
        missing = reference[name].keys() - ended[True][name].keys()
        extra = ended[True][name].keys() - reference[name].keys()
        changed = [
            k for k in reference[name].keys() & ended[True][name].keys() if reference[name][k] != ended[True][name][k]
        ]
        assert not (missing or extra or changed), (
            f"{name}: {len(missing)} rows missing {sorted(missing, key=repr)[:3]}, {len(extra)} extra, "
            f"{len(changed)} differing {changed[:3]}"
        )
    assert offsets[True] == offsets[False] == targets
    # The fold-derived columns agree with the protocol's own fold (`fold_reference`, as `check` compares).
    for p, folded in folds.items():
        for name, by_key in folded.items():
            spec = TABLES[name]
            for key, values in by_key.items():
                row = ended[True][name].get(key)
                assert row is not None, f"{name} {key} (partition {p}) is missing"
                for column in FOLD_COLUMNS[name]:
                    got = row[spec.columns.index(column)]
                    assert got == values[column], f"{name} {key}.{column}: {got!r} != fold {values[column]!r}"
