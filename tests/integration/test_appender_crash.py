"""The appender under crashes, fencing and lost commit answers (issue 4; scenario 11).

Workers run as real child processes (tests/integration/txproc.py) killed at named failpoints; fencing uses a
second producer with the partition owner's ``transactional.id``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from settled import _failpoints
from settled._settings import Settings
from settled.processors import Worker
from settled.producers import BATCH_ID_HEADER, producer_config, transactional_id
from settled.schemas import LogBatch, OwnershipClaimed, Receipt, SubmissionAdmitted, verify_chain
from tests._promise import promise
from tests.harness.factories import proposal
from tests.integration.helpers import CODEC, produce_inbox, read_topic, running, wait_for
from tests.integration.txproc import TxDecider, TxState

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _spawn(s: Settings, fp_dir: Path | None = None, failpoints: str = "") -> subprocess.Popen[bytes]:
    env = {**os.environ, "SETTLED_KAFKA_BOOTSTRAP": s.kafka_bootstrap}
    if failpoints:
        env["SETTLED_FAILPOINTS"] = failpoints
    if fp_dir is not None:
        env.update(_failpoints.FailpointControl(fp_dir).env(failpoints))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.txproc", "--namespace", s.namespace],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _batches(s: Settings) -> list[tuple[int, LogBatch]]:
    return [(r.offset, CODEC.decode_batch(r.value, offset=r.offset).batch) for r in read_topic(s, "log")]


def _admissions(s: Settings) -> Counter[str]:
    return Counter(e.submission_id for _, b in _batches(s) for e in b.events if isinstance(e, SubmissionAdmitted))


def _receipts(s: Settings) -> list[Receipt]:
    out = []
    for r in read_topic(s, "receipts"):
        rec = CODEC.decode(r.value)
        assert isinstance(rec, Receipt)
        out.append(rec)
    return out


def _uncommitted_log_batch_ids(s: Settings) -> list[str]:
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": "x", "isolation.level": "read_uncommitted"})
    tp = TopicPartition(s.topic("log"), 0)
    end = c.get_watermark_offsets(tp, timeout=10)[1]
    c.assign([TopicPartition(s.topic("log"), 0, 0)])
    ids: list[str] = []
    seen = 0
    while seen < end:
        m = c.poll(2.0)
        if m is None:
            break
        seen = (m.offset() or 0) + 1
        ids += [v.decode() for k, v in (m.headers() or []) if k == BATCH_ID_HEADER]
    c.close()
    return ids


def _wait_admitted(s: Settings, count: int, timeout_s: float) -> int:
    try:
        wait_for(lambda: sum(_admissions(s).values()) >= count, timeout_s, f"{count} admissions")
    except AssertionError:
        pass
    return sum(_admissions(s).values())


def _assert_clean_log(s: Settings, expected: set[str]) -> None:
    admissions = _admissions(s)
    promise("DUR-007.once", set(admissions) == expected, f"admitted {sorted(admissions)}, expected {sorted(expected)}")
    promise("DUR-007.once", all(n == 1 for n in admissions.values()), f"admitted more than once: {admissions}")
    batches = _batches(s)
    ids = [b.batch_id for _, b in batches]
    promise("DUR-007.once", len(ids) == len(set(ids)), f"repeated batch ids in {ids}")
    for conv in {b.conversation_id for _, b in batches}:
        verify_chain([(o, b) for o, b in batches if b.conversation_id == conv])
    receipts = Counter(r.request_id for r in _receipts(s))
    promise("DUR-007.once", receipts == Counter({i: 1 for i in expected}), f"receipts {receipts}")


def test_kill_between_produce_and_commit_then_the_batch_appears_once(topics: Settings, tmp_path: Path) -> None:
    """Scenario 11: records sent to the log and the receipts side topic, then SIGKILL before the commit."""
    s = topics
    props = [proposal(f"c{i % 2}") for i in range(5)]
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p)) for p in props])
    # The 1st produce is the ownership claim; the 2nd carries the admissions. With the fault switch
    # offsets_in_separate_transaction, the offsets commit first and the kill lands between the two transactions.
    first = _spawn(s, tmp_path / "fp", "appender.after_produce=2*kill;appender.between_split_transactions=1*kill")
    assert first.wait(60) == -9, first.stderr.read() if first.stderr else ""
    assert _admissions(s) == Counter(), "nothing of the killed transaction is visible to read_committed readers"
    assert _receipts(s) == []
    if not os.environ.get("SETTLED_FAULT"):
        assert len(_uncommitted_log_batch_ids(s)) >= 3, "the admissions were on the broker, uncommitted"

    second = _spawn(s)
    try:
        admitted = _wait_admitted(s, 5, 30)
        promise("DUR-002.no-lost-input", admitted == 5, f"{admitted} of 5 submissions admitted after the restart")
        _assert_clean_log(s, {p.submission_id for p in props})
        claims = [e.owner_epoch for _, b in _batches(s) for e in b.events if isinstance(e, OwnershipClaimed)]
        assert claims == [1, 2]
    finally:
        second.terminate()
        second.wait(30)


def test_a_fenced_appender_writes_nothing_visible(topics: Settings, tmp_path: Path) -> None:
    s = topics
    props = [proposal("c") for _ in range(3)]
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p)) for p in props])
    control = _failpoints.FailpointControl(tmp_path / "fp")
    zombie = _spawn(s, tmp_path / "fp", "appender.before_commit=2*pause(30s)")
    try:
        control.wait_reached("appender.before_commit", 30)  # records produced, commit not yet sent
        usurper = Producer(producer_config(s, transactional_id=transactional_id(s, 0)))
        usurper.init_transactions(15)  # fences the zombie and aborts its open transaction
        control.release("appender.before_commit")
        control.wait_hits("worker.before_checkpoint", 1, 30)  # the zombie's loop went on after its failed commit
        admitted = _admissions(s)
        promise("DUR-006.fenced-invisible", admitted == Counter(), f"a fenced owner's batches are visible: {admitted}")
        assert _receipts(s) == []
    finally:
        zombie.kill()
        zombie.wait(30)


def test_a_commit_whose_answer_is_lost_leaves_exactly_one_batch(topics: Settings, tmp_path: Path) -> None:
    s = topics
    props = [proposal(f"c{i % 3}") for i in range(6)]
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p)) for p in props])
    # The 2nd commit succeeds but is reported as timed out: the appender replaces its producer, reads the log
    # tail, finds its batches there and does not append them again.
    _failpoints.configure("appender.commit_outcome_lost=2*raise", control_dir=tmp_path / "fp")
    worker: Worker[TxState] = Worker(settings=s, decider_factory=lambda _p: TxDecider())
    try:
        with running(worker):
            wait_for(lambda: len(_receipts(s)) >= 6, 60, "6 receipts")
            turns = _failpoints.hit_counts().get("worker.before_checkpoint", 0)
            # Two more turns of the loop: the checkpoint that lost its answer has returned.
            wait_for(lambda: _failpoints.hit_counts().get("worker.before_checkpoint", 0) >= turns + 2, 30, "2 turns")
            assert _failpoints.hit_counts()["appender.commit_outcome_lost"] >= 2
    finally:
        _failpoints.reset()
    _assert_clean_log(s, {p.submission_id for p in props})
