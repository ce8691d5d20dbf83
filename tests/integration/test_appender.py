"""The transactional appender through the real worker loop (issue 4 item 5)."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime

import pytest

from settled._settings import Settings
from settled.processors import Worker, WorkerConfig
from settled.schemas import LogBatch, Receipt, ReceiptOutcome, SubmissionAdmitted, verify_chain
from tests._promise import promise
from tests.harness.factories import proposal
from tests.integration.helpers import CODEC, produce_inbox, read_topic, running, wait_for
from tests.integration.txproc import TxDecider, TxState

pytestmark = pytest.mark.integration


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


def test_an_abort_blaming_no_record_re_appends_the_held_batches(topics: Settings, tmp_path) -> None:
    """A transaction aborted with no record to blame: the held batches stay pending and are re-appended, not lost."""
    from settled import _failpoints

    s = topics
    props = [proposal(f"h{i}") for i in range(4)]
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p)) for p in props])
    control = _failpoints.FailpointControl(tmp_path / "fp")
    # The 1st commit is the claim; the 2nd (the admissions) is answered with an abortable error; the owner then
    # waits at owner.after_deferred so the test can compare its state with the log.
    _failpoints.configure(
        "appender.abortable_commit_error=2*raise;owner.after_deferred=1*pause(20s)", control_dir=tmp_path / "fp"
    )
    worker: Worker[TxState] = Worker(settings=s, decider_factory=lambda _p: TxDecider())
    try:
        with running(worker):
            control.wait_reached("owner.after_deferred", 30)
            owner = worker.owners[0]
            fresh = TxDecider().initial_state(0)
            for _, batch in _batches(s):
                fresh = TxDecider().fold(fresh, batch)
            promise(
                "DESIGN-3.fold-after-abort", owner.committed == fresh, "in-memory state differs from the log's fold"
            )
            assert owner.has_pending  # the held batches are still there
            assert _receipts(s) == []
            released_at = datetime.now(UTC)
            control.release("owner.after_deferred")
            wait_for(lambda: len(_receipts(s)) >= 4, 30, "4 receipts")
    finally:
        _failpoints.reset()
    admitted = [b for _, b in _batches(s) if any(isinstance(e, SubmissionAdmitted) for e in b.events)]
    assert sorted(b.submission_id for b in admitted) == sorted(p.submission_id for p in props)
    # Re-appended as held (decided before the abort), not decided again after it.
    promise("DESIGN-3.held-facts", all(b.recorded_at < released_at for b in admitted), "batches were re-decided")
    assert len(_receipts(s)) == 4


def test_a_rebalance_mid_transaction_loses_and_duplicates_nothing(topics: Settings, tmp_path) -> None:
    """The owner stalls mid-transaction past max.poll.interval.ms; another member takes the partition; the stalled
    transaction cannot commit; after the partition returns, every input is decided exactly once."""
    import threading

    from confluent_kafka import Consumer

    from settled import _failpoints

    s = topics
    props = [proposal(f"r{i % 3}") for i in range(6)]
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p)) for p in props])
    control = _failpoints.FailpointControl(tmp_path / "fp")
    _failpoints.configure("appender.after_produce=2*pause(20s)", control_dir=tmp_path / "fp")
    worker: Worker[TxState] = Worker(
        settings=s,
        decider_factory=lambda _p: TxDecider(),
        config=WorkerConfig(consumer_overrides={"max.poll.interval.ms": 4000}),
    )
    stop_intruder = threading.Event()
    intruder_got: list[int] = []

    def intrude() -> None:
        c = Consumer(
            {
                "bootstrap.servers": s.kafka_bootstrap,
                "group.id": worker.group_id,
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": 3000,
                "heartbeat.interval.ms": 500,
                "enable.auto.commit": False,
            }
        )
        c.subscribe([s.topic("inbox")], on_assign=lambda _c, tps: intruder_got.extend(tp.partition for tp in tps))
        while not stop_intruder.is_set():
            c.poll(0.1)  # never processes anything: it only holds the partition
        c.close()

    try:
        with running(worker):
            control.wait_reached("appender.after_produce", 30)
            t = threading.Thread(target=intrude, daemon=True)
            t.start()
            wait_for(lambda: 0 in intruder_got, 30, "the intruder to take the partition")
            control.release("appender.after_produce")
            time.sleep(2)
            assert _receipts(s) == [], "the stalled transaction must not commit"
            stop_intruder.set()
            t.join(10)
            wait_for(lambda: len(_receipts(s)) >= 6, 60, "6 receipts after the partition came back")
    finally:
        stop_intruder.set()
        _failpoints.reset()
    decided = _decisions_by_input(s)
    promise("DUR-007.once", sorted(decided) == list(range(6)), f"inputs decided: {sorted(decided)}")
    promise("DUR-007.once", all(len(v) == 1 for v in decided.values()), f"an input decided twice: {decided}")
    assert Counter(r.request_id for r in _receipts(s)) == Counter({p.submission_id: 1 for p in props})


@pytest.mark.parametrize("damage", ["drop", "alter"])
def test_verify_chain_names_the_offset_of_a_dropped_or_altered_batch(topics: Settings, make_topic, damage: str) -> None:
    from confluent_kafka import Producer

    from settled.schemas import ChainBreakError

    s = topics
    props = [proposal("chain") for _ in range(5)]
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p)) for p in props])
    worker: Worker[TxState] = Worker(settings=s, decider_factory=lambda _p: TxDecider())
    with running(worker):
        wait_for(lambda: len(_receipts(s)) >= 5, 60, "5 receipts")
    real = [r for r in read_topic(s, "log") if r.key == b"chain"]
    verify_chain([(r.offset, CODEC.decode_batch(r.value, offset=r.offset).batch) for r in real])  # a real log passes
    # Copy the conversation's batches to a test topic, damaging the third.
    copy = make_topic("chain-copy")
    p = Producer({"bootstrap.servers": s.kafka_bootstrap})
    for i, r in enumerate(real):
        value = r.value
        if i == 2 and damage == "drop":
            continue
        if i == 2 and damage == "alter":
            batch = CODEC.decode_batch(value, offset=r.offset).batch
            altered = batch.model_copy(update={"recorded_at": batch.recorded_at.replace(year=2000)})
            value = CODEC.encode(altered)  # same digest field, other content: the digest no longer matches
        p.produce(copy, key=r.key, value=value)
    assert p.flush(10) == 0
    from settled.producers import read_partition

    entries = [
        CODEC.decode_batch(m.value(), topic=copy, partition=0, offset=m.offset())
        for m in read_partition(s, copy, 0, 0, 30)
    ]
    with pytest.raises(ChainBreakError) as info:
        verify_chain(entries)
    assert info.value.offset == 2, info.value  # the copy's third record (or, dropped, the one after the gap)
