"""A turn's merged commit boundaries under SIGKILL (issue 24 item 1; docs/architecture.md "Commit boundaries").

Real broker, real ``settled worker`` children. A submission to an idle conversation is admitted and its first
attempt started in one transaction; a settlement and the start of the conversation's next queued submission are one
transaction. Worker a is killed inside that transaction, before its commit (``appender.before_commit``: every
record is on the broker, uncommitted) or right after it (``appender.after_commit``: before the run is launched);
worker b takes the partition over. Each kill is armed at run time once the worker reached the state before the
boundary, so the kill's hit is that transaction's and no other. The log is read back read_committed: a Kafka
transaction's commit marker takes one offset of the log partition, so two batches at consecutive offsets committed
in one transaction (one producer writes an owned log partition).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from settled._settings import Settings
from settled.client import Client
from settled.producers import reader_config
from settled.schemas import (
    AttemptStarted,
    LogEvent,
    ReceiptOutcome,
    RecoveryDecision,
    Settlement,
    SettlementOutcome,
    SubmissionAdmitted,
)
from tests._promise import promise
from tests.harness.factories import proposal
from tests.integration.engine._helpers import (
    TIMEOUT_S,
    count,
    invocations,
    killed,
    plan,
    receipt,
    send,
    settled,
    settlements,
)
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.engine_app import flag, world
from tests.integration.helpers import CODEC, read_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

BEFORE, AFTER = "appender.before_commit", "appender.after_commit"
STEP = {"step": "body"}  # the run's one durable step: its body counts each run that began (table step_runs)


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="tester", default_timeout_s=TIMEOUT_S) as c:  # the factories' principal
        yield c


def _log(s: Settings) -> list[tuple[int, LogEvent]]:
    """Every committed log event with its batch's offset."""
    out: list[tuple[int, LogEvent]] = []
    for r in read_topic(s, "log"):
        assert r.value is not None
        out.extend((r.offset, e) for e in CODEC.decode_batch(r.value, offset=r.offset).batch.events)
    return out


def _one_transaction(s: Settings, first: tuple[type[LogEvent], str], then: tuple[type[LogEvent], str]) -> bool:
    """Whether the first batch of ``first`` (event type, submission) and the first of ``then`` after it committed in
    one transaction: every offset from the one to the other holds a committed batch (no commit marker between)."""
    log = _log(s)
    offsets = {offset for offset, _ in log}
    at: dict[tuple[type[LogEvent], str | None], int] = {}
    for offset, e in log:
        at.setdefault((type(e), getattr(e, "submission_id", None)), offset)
    return at[first] < at[then] and all(o in offsets for o in range(at[first], at[then] + 1))


def _open_transaction(s: Settings) -> list[str]:
    """The event names of the log records above the last stable offset (a killed owner's open transaction), read
    read_uncommitted up to the high watermark."""
    tp = TopicPartition(s.topic("log"), 0)
    c = Consumer(reader_config(s, f"{s.namespace}.open-txn", isolation_level="read_uncommitted"))
    try:
        low, high = c.get_watermark_offsets(tp, timeout=30)
        stable = max(offset for offset, _ in _log(s)) + 1
        c.assign([TopicPartition(tp.topic, 0, low)])
        names: list[str] = []
        deadline = time.monotonic() + TIMEOUT_S
        while c.position([tp])[0].offset < high and time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            offset, value = msg.offset(), msg.value()
            assert offset is not None and value is not None
            if offset >= stable:
                names += [type(e).__name__ for e in CODEC.decode_batch(value, offset=offset).batch.events]
        return names
    finally:
        c.close()


def _of(s: Settings, kind: type[LogEvent], submission_id: str) -> list[LogEvent]:
    return [e for _, e in _log(s) if isinstance(e, kind) and getattr(e, "submission_id", None) == submission_id]


def _runs(world_db: Path, submission_id: str) -> list[int]:
    """The attempts whose run began the step body, in order."""
    with world(str(world_db)) as db:
        rows = db.execute("SELECT attempt FROM step_runs WHERE submission = ? ORDER BY rowid", (submission_id,))
        return [int(a) for (a,) in rows.fetchall()]


@pytest.mark.parametrize("boundary", [BEFORE, AFTER])
def test_admission_with_its_start_killed_at_the_commit_admits_once_and_starts_once(
    topics: Settings, spawn_worker: SpawnWorker, client: Client, world_db: Path, tmp_path: Path, boundary: str
) -> None:
    s = topics
    count(world_db, "SELECT 1")  # the world exists before any process counts in it
    a = spawn_worker("a")
    assert a.control is not None
    a.control.wait_hits(AFTER, 1, TIMEOUT_S)  # the claim committed: a's next transaction is the admission's
    a.kill_at(boundary)
    first = proposal("idle", value=plan(STEP))
    send(s, first)  # what a client's submit produces; its receipt never comes from worker a
    killed(a, tmp_path / "a.log")
    a.control.disarm(boundary)
    admitted = _of(s, SubmissionAdmitted, first.submission_id)
    started = _of(s, AttemptStarted, first.submission_id)
    if boundary == BEFORE:
        promise("DUR-001.admission-before-receipt", not admitted and receipt(s, first.submission_id) is None,
                f"killed before the commit: {admitted}, receipt {receipt(s, first.submission_id)}")  # fmt: skip
        assert not started, started
        # The transaction the kill left open held both: the admission and the attempt's start.
        opened = _open_transaction(s)
        assert opened == ["SubmissionAdmitted", "SubmissionReady", "AttemptStarted", "InputApplied"], opened
    else:
        assert len(admitted) == 1 and [e.attempt for e in started if isinstance(e, AttemptStarted)] == [1]
        assert _one_transaction(s, (SubmissionAdmitted, first.submission_id), (AttemptStarted, first.submission_id))
        assert receipt(s, first.submission_id) is not None
    promise("DUR-014.attempt-count-before-start", _runs(world_db, first.submission_id) == [],
            "the run began before its AttemptStarted committed")  # fmt: skip
    spawn_worker("b")
    # The client, not having heard, submits again with the same key: one admission, the retry a duplicate of it.
    again = client.submit("idle", plan(STEP), idempotency_key=first.idempotency_key)
    assert again.outcome is ReceiptOutcome.DUPLICATE and again.original_submission_id == first.submission_id, again
    wait_for(lambda: settled(s, first.submission_id) is not None, TIMEOUT_S, "the submission to settle")
    result = settled(s, first.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    admissions = _of(s, SubmissionAdmitted, first.submission_id)
    promise("DUR-001.key-once", len(admissions) == 1, f"{len(admissions)} admissions of one key")
    promise("DUR-002.one-settlement", [r.submission_id for r in settlements(s)] == [first.submission_id],
            f"settlements {settlements(s)}")  # fmt: skip
    attempts = [e.attempt for e in _of(s, AttemptStarted, first.submission_id) if isinstance(e, AttemptStarted)]
    if boundary == BEFORE:
        # Admitted by b from the inbox record a left undecided, and started with it, once.
        assert attempts == [1], attempts
        assert _one_transaction(s, (SubmissionAdmitted, first.submission_id), (AttemptStarted, first.submission_id))
        assert _runs(world_db, first.submission_id) == [1]
    else:
        # Attempt 1 is counted once though it never ran; recovery resumes the run as attempt 2.
        assert attempts == [1, 2], attempts
        assert len(_of(s, RecoveryDecision, first.submission_id)) == 1
        assert _runs(world_db, first.submission_id) == [2]


@pytest.mark.parametrize("boundary", [BEFORE, AFTER])
def test_a_settlement_with_the_next_start_killed_at_the_commit_settles_each_once_and_starts_the_next_once(
    topics: Settings, spawn_worker: SpawnWorker, client: Client, world_db: Path, tmp_path: Path, boundary: str
) -> None:
    s = topics
    a = spawn_worker("a")
    assert a.control is not None
    r1 = client.submit("queue", plan({"tool": "hold_until_flag", "args": {"flag": "go"}}))
    r2 = client.submit("queue", plan(STEP))  # admitted (its receipt read) while the first run holds the lane
    wait_for(lambda: invocations(world_db, "hold_until_flag") == 1, TIMEOUT_S, "the first run's tool call")
    a.control.arm("conductor.before_settle", "1*pause(60s)")
    with world(str(world_db)) as db:
        flag(db, "go", True)
    a.control.wait_reached("conductor.before_settle", TIMEOUT_S)  # r1's run returned; its settlement not staged
    a.control.disarm("conductor.before_settle")
    a.kill_at(boundary)  # the checkpoint of this loop turn: r1's settlement with r2's start
    a.control.release("conductor.before_settle")
    killed(a, tmp_path / "a.log")
    a.control.disarm(boundary)
    if boundary == BEFORE:
        assert not _of(s, Settlement, r1.request_id) and not _of(s, AttemptStarted, r2.request_id)
        opened = _open_transaction(s)
        assert opened == ["Settlement", "AttemptStarted", "InputApplied"], opened
    else:
        assert len(_of(s, Settlement, r1.request_id)) == 1 and len(_of(s, AttemptStarted, r2.request_id)) == 1
        assert _one_transaction(s, (Settlement, r1.request_id), (AttemptStarted, r2.request_id))
    promise("DUR-014.attempt-count-before-start", _runs(world_db, r2.request_id) == [],
            "r2's run began before its AttemptStarted committed")  # fmt: skip
    spawn_worker("b")
    wait_for(lambda: settled(s, r2.request_id) is not None, TIMEOUT_S, "both submissions to settle")
    counts = [r.submission_id for r in settlements(s)]
    promise("DUR-002.one-settlement", counts == [r1.request_id, r2.request_id], f"settlements {counts}")
    for r in (r1, r2):
        result = settled(s, r.request_id)
        assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert invocations(world_db, "hold_until_flag") == 1, "r1's recorded tool call ran again"
    attempts = [e.attempt for e in _of(s, AttemptStarted, r2.request_id) if isinstance(e, AttemptStarted)]
    if boundary == BEFORE:
        # b recovers r1 (its run ended uncommitted), settles it, and starts r2 with that settlement, once.
        assert attempts == [1], attempts
        assert _one_transaction(s, (Settlement, r1.request_id), (AttemptStarted, r2.request_id))
        assert _runs(world_db, r2.request_id) == [1]
    else:
        # r2's first attempt is counted once though it never ran; recovery resumes it as attempt 2.
        assert attempts == [1, 2], attempts
        assert _runs(world_db, r2.request_id) == [2]
