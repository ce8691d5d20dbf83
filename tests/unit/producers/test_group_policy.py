"""The appender's group policy (settled/producers/_policy.py) and its checkpoint over a fake producer, no broker.

The pure function first (alone, collateral, poisoned twice, deferred), then `TransactionalAppender.checkpoint` over
`tests/unit/producers/_fake.py` wrapped in the fault-injecting producer, so the failpoints that stand in for broker
errors are exercised as in the integration tests (tests/integration/test_appender.py,
tests/integration/test_appender_crash.py, tests/integration/test_appender_offsets_refused.py), in milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest
from confluent_kafka import KafkaError

from settled import _failpoints
from settled._settings import Settings
from settled.producers import AppendBatch, OutRecord, Run, TransactionalAppender
from settled.producers._policy import (
    MAX_COLLATERAL,
    Defer,
    Group,
    Replace,
    Retry,
    after_abort,
)
from settled.producers._txproducer import FaultInjectingProducer
from tests._promise import promise
from tests.unit.producers._fake import FakeKafka, FakePartitionLog, FakeProducer, FakeRecord

SETTINGS = Settings(kafka_bootstrap="fake:9092", namespace="unit")
LOG = SETTINGS.topic("log")
POISON = b"POISON"


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    _failpoints.reset()
    yield
    _failpoints.reset()


def _batch(conversation: str, offset: int, value: bytes = b"ok") -> AppendBatch:
    return AppendBatch(
        batch_id=f"{conversation}-{offset}",
        conversation_id=conversation,
        log_record=OutRecord(LOG, conversation.encode(), value),
        inputs=frozenset({offset}),
    )


def _replace_poison(run: Run, reason: str) -> Run:
    first = run[0]
    inputs = frozenset(o for b in run for o in b.inputs)
    failure = OutRecord(LOG, first.conversation_id.encode(), f"failed: {reason}".encode())
    return (AppendBatch(f"{first.batch_id}.failed", first.conversation_id, failure, inputs=inputs),)


def _rejecting(code: int) -> FakeKafka:
    def reject(record: FakeRecord) -> int | None:
        return code if record.value.startswith(POISON) else None

    return FakeKafka(reject=reject)


def _appender(kafka: FakeKafka, max_record_bytes: int = 1_000_000) -> TransactionalAppender:
    appender = TransactionalAppender(
        settings=SETTINGS,
        partition=0,
        input_topic=SETTINGS.topic("inbox"),
        group_metadata=lambda: "group-metadata",
        replace_poison=_replace_poison,
        max_record_bytes=max_record_bytes,
        producer_factory=lambda _config: FaultInjectingProducer(FakeProducer(kafka)),
        partition_log=FakePartitionLog(kafka, LOG),
    )
    appender.open()
    return appender


# -- the pure policy ---------------------------------------------------------------------------------------------

A, P, B = (_batch("a", 0),), (_batch("p", 1, POISON),), (_batch("b", 2),)
SIZE = KafkaError.MSG_SIZE_TOO_LARGE


def test_an_abort_with_no_failed_record_defers() -> None:
    assert after_abort(Group((A, P)), {}) == Defer()
    assert after_abort(Group((A,), alone=True, poisoned=True), {}) == Defer()


def test_records_failing_in_a_shared_transaction_retry_every_conversation_alone_in_order() -> None:
    decision = after_abort(Group((A, P, B)), {"p-1": {SIZE}, "b-2": {KafkaError._PURGE_QUEUE}})

    assert decision == Retry((Group((A,), alone=True), Group((P,), alone=True), Group((B,), alone=True)))


def test_a_record_fault_alone_is_retried_once_then_the_conversation_is_replaced_naming_the_fault() -> None:
    first = after_abort(Group((P,), alone=True), {"p-1": {SIZE}})
    assert first == Retry((Group((P,), alone=True, poisoned=True),))

    second = after_abort(Group((P,), alone=True, poisoned=True), {"p-1": {SIZE}})
    assert second == Replace((P,), "its records failed alone twice (MSG_SIZE_TOO_LARGE)")


def test_a_collateral_failure_alone_is_retried_up_to_the_bound_then_deferred() -> None:
    group = Group((A,), alone=True)
    for failures in range(1, MAX_COLLATERAL + 1):
        decision = after_abort(group, {"a-0": {KafkaError.NOT_ENOUGH_REPLICAS}})
        assert decision == Retry((Group((A,), alone=True, failures=failures),))
        (group,) = decision.groups

    assert after_abort(group, {"a-0": {KafkaError.NOT_ENOUGH_REPLICAS}}) == Defer()


# -- the checkpoint over a fake producer -------------------------------------------------------------------------


def test_a_record_rejected_in_a_shared_transaction_fails_only_its_own_conversation() -> None:
    kafka = _rejecting(KafkaError.MSG_SIZE_TOO_LARGE)  # the broker rejects p's record, so its whole record batch
    appender = _appender(kafka)
    batches = [*A, *P, *B]

    result = appender.checkpoint(batches, [0, 1, 2], 3)

    promise(
        "DUR-014.neighbours-complete",
        [r for r, _ in result.replaced] == [P] and set(kafka.batch_ids(LOG)) >= {"a-0", "b-2"},
        f"replaced {[r[0].batch_id for r, _ in result.replaced]}, log holds {kafka.batch_ids(LOG)}",
    )
    # The group aborts, a commits alone, p fails alone twice and its replacement commits, then b commits alone.
    assert kafka.batch_ids(LOG) == ["a-0", "p-1.failed", "b-2"]
    assert [b.batch_id for b in result.committed] == ["a-0", "p-1.failed", "b-2"]
    assert "MSG_SIZE_TOO_LARGE" in kafka.committed[LOG][1].value.decode()
    assert (result.transactions, result.aborts, result.deferred) == (3, 3, ())
    assert kafka.transactions == ["abort", "commit", "abort", "abort", "commit", "commit"]
    assert result.input_offset == kafka.input_offset == 3


def test_a_neighbour_failing_with_no_record_fault_is_deferred_and_the_offset_never_passes_it() -> None:
    kafka = _rejecting(KafkaError.NOT_ENOUGH_REPLICAS)  # not a record fault: p's failures are not its own

    result = _appender(kafka).checkpoint([*A, *P, *B], [0, 1, 2], 3)

    assert kafka.batch_ids(LOG) == ["a-0"]
    assert [b.batch_id for b in result.deferred] == ["p-1", "b-2"]
    assert result.replaced == ()
    assert result.aborts == 1 + 1 + MAX_COLLATERAL  # the group, then p alone until the bound
    promise("DUR-002.no-lost-input", kafka.input_offset == 1, f"input offset {kafka.input_offset} passed input 1")


def test_an_oversized_record_is_replaced_before_it_joins() -> None:
    kafka = FakeKafka()
    big = (_batch("p", 1, POISON * 100),)

    result = _appender(kafka, max_record_bytes=100).checkpoint([*A, *big, *B], [0, 1, 2], 3)

    assert kafka.batch_ids(LOG) == ["a-0", "p-1.failed", "b-2"]
    assert (result.transactions, result.aborts) == (1, 0)
    assert "exceeds the limit of 100 bytes" in kafka.committed[LOG][1].value.decode()


def test_an_abort_blaming_no_record_defers_everything_and_the_next_checkpoint_appends_it() -> None:
    kafka = FakeKafka()
    appender = _appender(kafka)
    _failpoints.configure("appender.abortable_commit_error=1*raise")

    held = appender.checkpoint([*A, *B], [0, 2], 3)

    assert (held.committed, held.deferred, held.aborts, held.input_offset) == ((), (*A, *B), 1, None)
    assert kafka.batch_ids(LOG) == [] and kafka.input_offset is None
    again = appender.checkpoint(held.deferred, [0, 2], 3)
    assert kafka.batch_ids(LOG) == ["a-0", "b-2"]
    assert (again.transactions, kafka.input_offset) == (1, 3)


def test_a_commit_whose_answer_is_lost_counts_what_landed_on_a_new_producer_and_writes_nothing_twice() -> None:
    kafka = FakeKafka()
    appender = _appender(kafka)
    _failpoints.configure("appender.commit_outcome_lost=1*raise")

    result = appender.checkpoint([*A, *B], [0, 2], 3)

    assert kafka.producers == 2  # step 7: a new producer fences whatever was in flight
    promise("DUR-007.once", kafka.batch_ids(LOG) == ["a-0", "b-2"], f"log holds {kafka.batch_ids(LOG)}")
    assert ([b.batch_id for b in result.committed], result.transactions, result.input_offset) == (["a-0", "b-2"], 1, 3)


def test_a_stale_coordinators_refusal_defers_and_the_next_checkpoint_runs_on_a_new_producer() -> None:
    kafka = FakeKafka()
    appender = _appender(kafka)
    _failpoints.configure("appender.offsets_refused_by_coordinator=1*raise")

    refused = appender.checkpoint([*A], [0], 1)

    assert (refused.deferred, refused.aborts, kafka.producers) == (A, 1, 1)
    again = appender.checkpoint([*A], [0], 1)
    assert kafka.producers == 2
    assert (again.committed, kafka.batch_ids(LOG), kafka.input_offset) == (A, ["a-0"], 1)


class _Observed:
    """A `settled.producers.TransactionObserver` that keeps what it was told."""

    def __init__(self) -> None:
        self.told: list[tuple[int, dict[str, float]]] = []

    def transaction_committed(self, records: int, call_s: Mapping[str, float]) -> None:
        self.told.append((records, dict(call_s)))


def test_the_observer_is_told_each_committed_transactions_records_and_calls_never_an_aborted_one() -> None:
    kafka = _rejecting(SIZE)
    appender = _appender(kafka)
    observed = _Observed()
    appender.observer = observed
    receipt = OutRecord(SETTINGS.topic("receipts"), b"a", b"receipt")
    with_receipt = AppendBatch("a-0", "a", OutRecord(LOG, b"a", b"ok"), side_records=(receipt,), inputs=frozenset({0}))
    # a (with its receipt) and b commit together: 3 records. Then p's record is rejected in a shared transaction with
    # c: that one aborts, p fails alone twice (aborted), its one-record replacement commits, then c commits alone.
    appender.checkpoint([with_receipt, _batch("b", 1)], [0, 1], 2)
    appender.checkpoint([_batch("p", 2, POISON), _batch("c", 3)], [2, 3], 4)
    calls = {"begin_transaction", "produce", "flush", "send_offsets_to_transaction", "commit_transaction"}
    assert [records for records, _ in observed.told] == [3, 1, 1], observed.told
    assert all(set(call_s) == calls and min(call_s.values()) >= 0 for _, call_s in observed.told), observed.told
