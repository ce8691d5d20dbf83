"""Steering in the pure core (issue 22 item 3): `steer` decides a `SteerRun`; the stream and what a call sees."""

from __future__ import annotations

from settled.protocol import (
    ConversationState,
    Submission,
    SubmissionState,
    check_command,
    start_attempt,
    steer,
    steering_delivered,
    steering_stream,
    terminalize,
    undelivered_steering,
)
from settled.schemas import (
    CommandKind,
    CommandRejected,
    CommandRejectReason,
    LogEvent,
    ReceiptOutcome,
    SettlementOutcome,
    SteeringDelivered,
    SteeringReceived,
    SteerRun,
)

from ._sim import T0, Log, at
from .test_waits import _log

S = SubmissionState


def _conv(log: Log) -> ConversationState:
    return log.state.conversation("c1")


def _sub(log: Log, sid: str = "s1") -> Submission:
    sub = _conv(log).submission(sid)
    assert sub is not None
    return sub


def _steer(command_id: str, text: str = "shorter, please", sid: str = "s1") -> SteerRun:
    return SteerRun(
        command_id=command_id, principal="bob", conversation_id="c1", submission_id=sid, text=text, sent_at=T0
    )


def _journal(log: Log) -> list[LogEvent]:
    return [e for b in log.batches if b.conversation_id == "c1" for e in b.events]


def test_a_steering_message_for_a_running_run_is_canonical_and_deduped_by_its_id() -> None:
    log = _log()
    log.commit("c1", start_attempt(_conv(log), "s1", "a1", log.epoch))
    d = steer(_conv(log), _steer("m1"), log.ref(), T0)
    assert [type(e) for e in d.events] == [SteeringReceived]
    assert d.receipt is not None and d.receipt.outcome is ReceiptOutcome.APPLIED
    received = d.events[0]
    assert isinstance(received, SteeringReceived)
    assert (received.command_id, received.submission_id, received.text, received.principal) == (
        "m1",
        "s1",
        "shorter, please",
        "bob",
    )
    assert d.settlement is None
    log.commit("c1", d)
    again = steer(_conv(log), _steer("m1"), log.ref(), T0)
    assert again.receipt is not None and again.receipt.outcome is ReceiptOutcome.DUPLICATE
    log.commit("c1", again)  # the repeat only marks its input decided
    assert _sub(log).state is S.RUNNING
    assert [m.command_id for m in steering_stream(_journal(log), "s1")] == ["m1"]  # in the stream once


def test_a_steering_message_for_a_queued_run_is_accepted_too() -> None:
    log = _log()  # admitted, never started: unsettled
    d = steer(_conv(log), _steer("m1"), log.ref(), T0)
    assert [type(e) for e in d.events] == [SteeringReceived]
    log.commit("c1", d)
    assert _sub(log).state is S.READY


def test_a_steering_message_after_settlement_is_rejected_with_its_reason_and_nothing_else() -> None:
    log = _log()
    log.commit("c1", start_attempt(_conv(log), "s1", "a1", log.epoch))
    log.commit("c1", terminalize(_conv(log), "s1", SettlementOutcome.COMPLETED, at(1), reply_json="1"))
    d = steer(_conv(log), _steer("m1"), log.ref(), T0)
    assert [type(e) for e in d.events] == [CommandRejected]
    rejected = d.events[0]
    assert isinstance(rejected, CommandRejected)
    assert rejected.reason is CommandRejectReason.ALREADY_TERMINAL
    assert rejected.command_kind is CommandKind.STEER
    assert rejected.winning_outcome is SettlementOutcome.COMPLETED
    assert "completed" in rejected.detail
    assert d.receipt is not None and d.receipt.outcome is ReceiptOutcome.REJECTED
    assert d.settlement is None
    log.commit("c1", d)
    assert steering_stream(_journal(log), "s1") == []


def test_a_steering_message_for_an_unknown_run_is_rejected_unknown_target() -> None:
    log = _log()
    d = steer(_conv(log), _steer("m1", sid="nope"), log.ref(), T0)
    assert [type(e) for e in d.events] == [CommandRejected]
    rejected = d.events[0]
    assert isinstance(rejected, CommandRejected)
    assert rejected.reason is CommandRejectReason.UNKNOWN_TARGET
    assert rejected.command_kind is CommandKind.STEER


def test_an_empty_steering_message_is_rejected_invalid_naming_the_field() -> None:
    violation = check_command(_steer("m1", text="   "))
    assert violation is not None and violation.field == "text"
    log = _log()
    d = steer(_conv(log), _steer("m1", text=""), log.ref(), T0)
    assert [type(e) for e in d.events] == [CommandRejected]
    rejected = d.events[0]
    assert isinstance(rejected, CommandRejected)
    assert rejected.reason is CommandRejectReason.INVALID and "text" in rejected.detail


def test_a_model_call_sees_the_messages_no_earlier_call_saw_in_log_order() -> None:
    log = _log("s1", "s2")
    log.commit("c1", start_attempt(_conv(log), "s1", "a1", log.epoch))
    for cid in ("m1", "m2"):
        log.commit("c1", steer(_conv(log), _steer(cid, text=cid), log.ref(), T0))
    log.commit("c1", steer(_conv(log), _steer("m1", text="m1"), log.ref(), T0))  # a repeat: in the stream once
    log.commit("c1", steer(_conv(log), _steer("x1", sid="s2"), log.ref(), T0))  # another run's
    journal = _journal(log)
    assert [m.command_id for m in undelivered_steering(journal, "s1", ())] == ["m1", "m2"]
    log.append(
        "c1", [SteeringDelivered(submission_id="s1", attempt_id="a1", response_ordinal=0, command_ids=("m1", "m2"))]
    )
    log.commit("c1", steer(_conv(log), _steer("m3", text="m3"), log.ref(), T0))
    journal = _journal(log)
    assert steering_delivered(journal, "s1") == ["m1", "m2"]
    assert [m.command_id for m in undelivered_steering(journal, "s1", steering_delivered(journal, "s1"))] == ["m3"]
    assert [m.command_id for m in steering_stream(journal, "s2")] == ["x1"]
