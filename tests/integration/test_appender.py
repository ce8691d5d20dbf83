"""The transactional appender through the real worker loop (issue 4 item 5)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from settled._settings import Settings
from settled.processors import Worker, WorkerConfig
from settled.producers._topics import provision_topics
from settled.schemas import LogBatch, Receipt, ReceiptOutcome, SubmissionAdmitted, verify_chain
from tests._promise import promise
from tests.integration.helpers import CODEC, produce_inbox, proposal, read_topic, running, wait_for
from tests.integration.txproc import TxDecider, TxState

pytestmark = pytest.mark.integration


@pytest.fixture
def topics(settings: Settings) -> Settings:
    s = settings.model_copy(update={"partitions": 1})
    provision_topics(s, CODEC, datetime.now(UTC))
    return s


def _receipts(s: Settings) -> list[Receipt]:
    out = []
    for r in read_topic(s, "receipts"):
        rec = CODEC.decode(r.value, topic=s.topic("receipts"))
        assert isinstance(rec, Receipt)
        out.append(rec)
    return out


def _batches(s: Settings) -> list[tuple[int, LogBatch]]:
    return [(r.offset, CODEC.decode_batch(r.value, offset=r.offset).batch) for r in read_topic(s, "log")]


def test_round_trip_admits_each_submission_once_with_a_valid_chain(topics: Settings) -> None:
    s = topics
    props = [proposal(f"c{i % 3}") for i in range(12)]
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p)) for p in props])
    worker: Worker[TxState] = Worker(settings=s, decider_factory=lambda _p: TxDecider())
    with running(worker):
        wait_for(lambda: len(_receipts(s)) >= 12, 60, "12 receipts")
    receipts = _receipts(s)
    assert sorted(r.request_id for r in receipts) == sorted(p.submission_id for p in props)
    assert all(r.outcome == ReceiptOutcome.ADMITTED for r in receipts)
    by_conv: dict[str, list[tuple[int, LogBatch]]] = {}
    for offset, batch in _batches(s):
        by_conv.setdefault(batch.conversation_id, []).append((offset, batch))
    for conv in ("c0", "c1", "c2"):
        verify_chain(by_conv[conv])
        seqs = [e.submission_seq for _, b in by_conv[conv] for e in b.events if isinstance(e, SubmissionAdmitted)]
        assert seqs == [1, 2, 3, 4]


def _set_topic_config(s: Settings, short: str, config: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap})
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in config.items()]
    res = ConfigResource(ConfigResource.Type.TOPIC, s.topic(short), incremental_configs=entries)
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result()


def _committed_offset(s: Settings, worker: Worker[TxState]) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": worker.group_id})
    try:
        return c.committed([TopicPartition(s.topic("inbox"), 0)], timeout=10)[0].offset
    finally:
        c.close()


def _decisions_by_input(s: Settings) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for _, batch in _batches(s):
        for event in batch.events:
            ref = getattr(event, "input_ref", None)
            if ref is not None:
                out.setdefault(ref.offset, []).append(type(event).__name__)
    return out


def _group_commit_with_a_poison_neighbour(s: Settings, worker_config: WorkerConfig, fp_dir) -> None:
    """X1–X9 share the partition (and transactions) with Y, whose log record is over the log topic's limit."""
    from settled import _failpoints

    _set_topic_config(s, "log", {"max.message.bytes": "20000"})
    xs = [proposal(f"x{i}") for i in range(1, 10)]
    y = proposal("y", value="y" * 50_000)
    order = [*xs[:4], y, *xs[4:]]  # Y at inbox offset 4
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p)) for p in order], partition=0,
                  **{"message.max.bytes": 2_000_000})  # fmt: skip
    control = _failpoints.FailpointControl(fp_dir)
    # The 1st commit is the ownership claim; the 2nd carries X's admissions.
    _failpoints.configure("appender.after_commit=2*pause(20s)", control_dir=fp_dir)
    worker: Worker[TxState] = Worker(settings=s, decider_factory=lambda _p: TxDecider(), config=worker_config)
    try:
        with running(worker):
            control.wait_reached("appender.after_commit", 30)
            # X1–X9 committed without waiting on Y; the offset committed with them does not pass Y's input unless
            # that same transaction records Y's rejection.
            offset = _committed_offset(s, worker)
            promise(
                "DESIGN-3.low-watermark",
                offset <= 4 or 4 in _decisions_by_input(s),
                f"the input offset committed with X passed Y's offset 4 ({offset}) while Y is not decided",
            )
            control.release("appender.after_commit")
            wait_for(lambda: len(_receipts(s)) >= 10, 60, "10 receipts")
            wait_for(lambda: _committed_offset(s, worker) == 10, 30, "the input offset to pass every input")
            # The in-memory state equals a fold of the committed log.
            owner = worker.owners[0]
            fresh = TxDecider().initial_state(0)
            for _, batch in _batches(s):
                fresh = TxDecider().fold(fresh, batch)
            assert owner.committed == fresh
    finally:
        _failpoints.reset()
    receipts = {r.request_id: r for r in _receipts(s)}
    assert len(receipts) == 10
    assert all(receipts[x.submission_id].outcome == ReceiptOutcome.ADMITTED for x in xs)
    assert receipts[y.submission_id].outcome == ReceiptOutcome.REJECTED
    decided = _decisions_by_input(s)
    assert sorted(decided) == list(range(10))
    assert all(len(v) == 1 for v in decided.values()), decided  # every input decided exactly once
    assert decided[4] == ["SubmissionRejected"]
    batches = _batches(s)
    ids = [b.batch_id for _, b in batches]
    assert len(ids) == len(set(ids))
    for conv in {b.conversation_id for _, b in batches}:
        verify_chain([(o, b) for o, b in batches if b.conversation_id == conv])


def test_oversized_neighbour_is_replaced_before_it_joins(topics: Settings, tmp_path) -> None:
    _group_commit_with_a_poison_neighbour(topics, WorkerConfig(), tmp_path / "fp")


def test_neighbour_rejected_by_the_broker_is_retried_alone_then_replaced(topics: Settings, tmp_path) -> None:
    # A size check set above the topic's limit: the broker itself rejects Y's record, the transaction aborts,
    # X1–X9 commit without Y, and Y, failing alone again, is replaced by its rejection.
    _group_commit_with_a_poison_neighbour(topics, WorkerConfig(max_record_bytes=1_000_000), tmp_path / "fp")
