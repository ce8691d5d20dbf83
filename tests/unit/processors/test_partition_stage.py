"""`PartitionOwner` staging without Kafka: one serialization per batch, and all-or-nothing staging (issue 6).

The owner seals a batch and encodes it in one serialization when it has the codec's ``encode_batch_dict`` (the
worker's hot path); the bytes and the digest must be exactly those of `LogBatch.seal` followed by ``Codec.encode``
(a reader checks the digest from the bytes). A batch the fold refuses is not staged at all: the conductor stages a
run's effects straight into the owner and refuses the effect when the fold raises (no separate probe fold).
"""

from __future__ import annotations

from typing import Any

import pytest

from settled._settings import Settings
from settled.processors import Decision, LedgerDecider, PartitionOwner
from settled.processors._ledger import to_loop_decision
from settled.producers import TransactionalAppender
from settled.protocol import PartitionState, ProtocolError, admit, claim, lifecycle_events, start_attempt
from settled.schemas import Codec, InputRef, LifecycleEvent, LogBatch, ToolCallSettled, body_batch_digest, json_digest
from tests.unit.protocol._sim import T0, proposal

CID = "c1"


def owner(codec: Codec, *, fast: bool) -> PartitionOwner[PartitionState]:
    settings = Settings(namespace="unit-stage", kafka_bootstrap="127.0.0.1:1", partitions=1)

    def no_poison(run: Any, reason: str) -> Any:
        raise AssertionError("no replacement expected")

    def decode(value: bytes, topic: str, partition: int, offset: int) -> LogBatch:
        return codec.decode_batch(value, topic=topic, partition=partition, offset=offset).batch

    return PartitionOwner(
        settings=settings,
        partition=0,
        decider=LedgerDecider(partition=0, partition_count=1),
        appender=TransactionalAppender(
            settings=settings,
            partition=0,
            input_topic="unit-stage.inbox",
            group_metadata=dict,
            replace_poison=no_poison,
        ),
        encode=codec.encode,
        decode_batch=decode,
        clock=lambda: T0,
        worker_id="w1",
        encode_batch=codec.encode_batch_dict if fast else None,
    )


def stage_a_run(o: PartitionOwner[PartitionState]) -> None:
    o._stage(Decision("~partition/0", (claim(o.overlay, "w1", T0),)), epoch=1)
    ref = InputRef(topic="unit-stage.inbox", partition=0, offset=0)
    o._stage(to_loop_decision(CID, admit(o.overlay.conversation(CID), proposal("s1", "k"), ref, T0)), epoch=1)
    o._stage(to_loop_decision(CID, start_attempt(o.overlay.conversation(CID), "s1", "a1", 1)), epoch=1)


def test_one_serialization_gives_the_bytes_and_digest_of_seal_then_encode() -> None:
    codec = Codec()
    fast, slow = owner(codec, fast=True), owner(codec, fast=False)
    stage_a_run(fast)
    stage_a_run(slow)
    assert len(fast._pending) == len(slow._pending) == 3
    for (f_out, _, f_batch), (s_out, _, s_batch) in zip(fast._pending, slow._pending, strict=True):
        assert f_out.log_record.value == s_out.log_record.value
        assert f_batch == s_batch
        assert f_batch.batch_digest == f_batch.compute_digest()
        decoded = codec.decode_batch(f_out.log_record.value, offset=0)
        assert decoded.batch.batch_digest == f_batch.batch_digest
        body = f_out.log_record.value[10:]  # single-object framing: C3 01 + 8-byte fingerprint
        assert body_batch_digest(body) == f_batch.batch_digest
    assert fast.overlay == slow.overlay


def test_a_batch_the_fold_refuses_is_not_staged() -> None:
    o = owner(Codec(), fast=True)
    stage_a_run(o)
    before = (list(o._pending), o.overlay, dict(o._pending_heads))
    never_prepared = ToolCallSettled(
        submission_id="s1", attempt_id="a1", call_id="s1#0", result_json="1", result_digest=json_digest("1")
    )
    with pytest.raises(ProtocolError):
        o.stage(Decision(CID, (never_prepared,), submission_id="s1"))
    assert (list(o._pending), o.overlay, dict(o._pending_heads)) == before


@pytest.mark.parametrize("fast", [True, False])
def test_a_batch_carries_its_lifecycle_events_as_side_records_of_its_transaction(fast: bool) -> None:
    codec = Codec()
    o = owner(codec, fast=fast)
    stage_a_run(o)
    claimed, admitted, started = o._pending
    lifecycle = "unit-stage.lifecycle"
    assert [r for r in claimed[0].side_records if r.topic == lifecycle] == []
    assert [r for r in admitted[0].side_records if r.topic == lifecycle] == []
    (record,) = [r for r in started[0].side_records if r.topic == lifecycle]
    assert record.key == CID.encode()
    event = codec.decode(record.value, expected=(LifecycleEvent,))
    assert event == lifecycle_events(started[2])[0]
    assert (event.type, event.event_id, event.submission_id) == ("durable.started", f"{started[2].batch_id}#0", "s1")
