"""The generic wait in the pure core (issue 16 item 1): Running → Waiting → Ready, lane held, resumes not charged."""

from __future__ import annotations

import pytest

from settled.protocol import (
    ConversationState,
    IllegalTransitionError,
    LogInconsistencyError,
    RecoveryAction,
    RecoverySnapshot,
    SettleAborted,
    StartAttempt,
    Submission,
    SubmissionState,
    TerminalOutcomeConflictError,
    abort,
    admit,
    classify,
    deliveries,
    expired_waits,
    open_waits,
    resolve_wait,
    schedule,
    signal,
    start_attempt,
    terminalize,
    wait_id_for,
)
from settled.schemas import (
    CommandKind,
    CommandRejected,
    CommandRejectReason,
    LogEvent,
    ReceiptOutcome,
    RecoveryDecisionKind,
    SendSignal,
    SettlementOutcome,
    SignalReceived,
    ToolCallPrepared,
    WaitKind,
    WaitOutcome,
    WaitRequested,
    canonical_json,
    json_digest,
)

from ._sim import T0, Log, abort_cmd, at, proposal

S = SubmissionState


def _log(*submissions: str) -> Log:
    log = Log()
    log.claim()
    for n, sid in enumerate(submissions or ("s1",), 1):
        log.commit("c1", admit(log.state.conversation("c1"), proposal(sid, f"k{n}"), log.ref(), T0))
    return log


def _conv(log: Log) -> ConversationState:
    return log.state.conversation("c1")


def _sub(log: Log, sid: str = "s1") -> Submission:
    sub = _conv(log).submission(sid)
    assert sub is not None
    return sub


def _request(ordinal: int, attempt_id: str, *, name: str = "paid", deadline_s: float | None = None) -> WaitRequested:
    return WaitRequested(
        submission_id="s1",
        attempt_id=attempt_id,
        wait_id=wait_id_for("s1", ordinal),
        kind=WaitKind.SIGNAL,
        name=name,
        ordinal=ordinal,
        deadline=None if deadline_s is None else at(deadline_s),
    )


def _start(log: Log, attempt_id: str, sid: str = "s1") -> None:
    log.commit("c1", start_attempt(_conv(log), sid, attempt_id, log.epoch))


def test_a_wait_request_suspends_the_run_and_its_delivery_makes_it_ready() -> None:
    log = _log()
    _start(log, "a1")
    trace = log.append("c1", [_request(0, "a1")])
    assert [(t.edge.source, t.edge.target) for t in trace] == [(S.RUNNING, S.WAITING)]
    assert _sub(log).waits == {"s1#w0"}
    assert schedule(_conv(log)) is None  # no worker: nothing starts while it waits
    trace = log.commit("c1", resolve_wait(_conv(log), "s1", "s1#w0", WaitOutcome.DELIVERED, at(1), source_id="g1"))
    assert [(t.edge.source, t.edge.target) for t in trace] == [(S.WAITING, S.READY)]
    assert schedule(_conv(log)) == StartAttempt("s1", 2)


def test_the_waiting_run_holds_its_lane_later_submissions_queue() -> None:
    log = _log("s1", "s2")
    _start(log, "a1")
    log.append("c1", [_request(0, "a1")])
    assert _conv(log).active_submission_id == "s1"
    assert schedule(_conv(log)) is None
    with pytest.raises(IllegalTransitionError, match="next step is None"):
        start_attempt(_conv(log), "s2", "b1", log.epoch)


def test_a_resume_after_a_delivery_or_an_expiry_is_not_charged() -> None:
    log = _log()
    for n in range(5):  # five waits, one attempt each: none is charged
        attempt_id = f"a{n + 1}"
        _start(log, attempt_id)
        log.append("c1", [_request(n, attempt_id, deadline_s=10)])
        outcome = WaitOutcome.EXPIRED if n % 2 else WaitOutcome.DELIVERED
        log.commit("c1", resolve_wait(_conv(log), "s1", wait_id_for("s1", n), outcome, at(11)))
    sub = _sub(log)
    assert (sub.attempt_count, sub.suspended_count, sub.charged_attempts) == (5, 5, 0)
    _start(log, "a6")
    log.claim("w2")  # attempt 6 died: charged, and the budget (3) is not spent
    recovery = classify(RecoverySnapshot.of("s1", _sub(log), [], max_attempts=3))
    assert recovery.action is RecoveryAction.DECIDE
    assert recovery.kind is RecoveryDecisionKind.RESUME, recovery.reason
    assert _sub(log).charged_attempts == 1


def test_parallel_waits_resume_only_once_every_one_is_decided() -> None:
    log = _log()
    _start(log, "a1")
    trace = log.append("c1", [_request(0, "a1"), _request(1, "a1", name="shipped")])
    assert len(trace) == 1 and _sub(log).waits == {"s1#w0", "s1#w1"}
    assert _sub(log).suspended_count == 1
    log.commit("c1", resolve_wait(_conv(log), "s1", "s1#w1", WaitOutcome.DELIVERED, at(1), payload_json="[1, 2]"))
    assert _sub(log).state is S.WAITING and schedule(_conv(log)) is None
    log.commit("c1", resolve_wait(_conv(log), "s1", "s1#w0", WaitOutcome.EXPIRED, at(2)))
    assert _sub(log).state is S.READY and _sub(log).waits == frozenset()


def test_a_wait_is_decided_once() -> None:
    log = _log()
    _start(log, "a1")
    log.append("c1", [_request(0, "a1")])
    decided = resolve_wait(_conv(log), "s1", "s1#w0", WaitOutcome.DELIVERED, at(1))
    log.commit("c1", decided)
    with pytest.raises(IllegalTransitionError, match="not open"):
        resolve_wait(_conv(log), "s1", "s1#w0", WaitOutcome.EXPIRED, at(2))
    with pytest.raises(LogInconsistencyError, match="no such wait"):
        log.append("c1", decided.events)  # the fold refuses a second decision written anyway


def test_a_wait_request_needs_the_running_attempt_and_no_call_in_flight() -> None:
    log = _log()
    _start(log, "a1")
    with pytest.raises(LogInconsistencyError, match="stale attempt"):
        log.append("c1", [_request(0, "a0")])
    prepared = ToolCallPrepared(
        submission_id="s1",
        run_id="s1",
        attempt_id="a1",
        call_id="s1#0",
        ordinal=0,
        tool="t",
        args_json="{}",
        args_digest=json_digest("{}"),
        idempotency_key="k",
        owner_epoch=log.epoch,
    )
    log.append("c1", [prepared])
    with pytest.raises(LogInconsistencyError, match="not settled"):
        log.append("c1", [_request(1, "a1")])


def test_an_abort_ends_the_wait_with_an_aborted_settlement() -> None:
    log = _log()
    _start(log, "a1")
    log.append("c1", [_request(0, "a1")])
    trace = log.commit("c1", abort(_conv(log), abort_cmd("x1", "s1"), log.ref(), T0))  # settles at once
    assert log.settlements[-1].outcome is SettlementOutcome.ABORTED
    assert [(t.edge.source, t.edge.target) for t in trace] == [
        (S.WAITING, S.TERMINALIZING),
        (S.TERMINALIZING, S.ABORTED),
    ]
    assert _sub(log).waits == frozenset()
    with pytest.raises(TerminalOutcomeConflictError):
        terminalize(_conv(log), "s1", SettlementOutcome.COMPLETED, at(2))


def test_a_waiting_run_with_an_abort_recorded_is_settled_by_the_scheduler() -> None:
    log = _log()
    _start(log, "a1")
    log.commit("c1", abort(_conv(log), abort_cmd("x1", "s1"), log.ref(), T0))  # recorded while running
    log.append("c1", [_request(0, "a1")])
    assert schedule(_conv(log)) == SettleAborted("s1")
    log.commit("c1", terminalize(_conv(log), "s1", SettlementOutcome.ABORTED, at(1)))
    assert _sub(log).outcome is SettlementOutcome.ABORTED


def _signal(signal_id: str, name: str = "paid", payload: object = 1, sid: str = "s1") -> SendSignal:
    return SendSignal(
        command_id=signal_id,
        principal="bob",
        conversation_id="c1",
        submission_id=sid,
        name=name,
        payload_json=canonical_json(payload),
        sent_at=T0,
    )


def _journal(log: Log) -> list[LogEvent]:
    return [e for b in log.batches if b.conversation_id == "c1" for e in b.events]


def test_a_signal_is_accepted_for_an_unsettled_run_whatever_it_waits_for_and_deduped_by_its_id() -> None:
    log = _log()
    d = signal(_conv(log), _signal("g1"), log.ref(), T0)  # queued, never started: accepted
    assert d.receipt is not None and d.receipt.outcome is ReceiptOutcome.APPLIED
    assert [type(e) for e in d.events] == [SignalReceived]
    log.commit("c1", d)
    again = signal(_conv(log), _signal("g1"), log.ref(), T0)
    assert again.receipt is not None and again.receipt.outcome is ReceiptOutcome.DUPLICATE
    log.commit("c1", again)  # only marks its input decided
    assert _sub(log).state is S.READY


def test_a_signal_for_an_unknown_or_settled_run_is_rejected_with_its_reason_and_nothing_else() -> None:
    log = _log()
    unknown = signal(_conv(log), _signal("g1", sid="nope"), log.ref(), T0)
    assert [type(e) for e in unknown.events] == [CommandRejected]
    assert unknown.receipt is not None and unknown.receipt.outcome is ReceiptOutcome.REJECTED
    assert unknown.events[0].reason is CommandRejectReason.UNKNOWN_TARGET  # type: ignore[union-attr]
    assert unknown.events[0].command_kind is CommandKind.SIGNAL  # type: ignore[union-attr]
    _start(log, "a1")
    log.commit("c1", terminalize(_conv(log), "s1", SettlementOutcome.COMPLETED, at(1), reply_json="1"))
    settled = signal(_conv(log), _signal("g2"), log.ref(), T0)
    assert [type(e) for e in settled.events] == [CommandRejected]
    assert settled.events[0].reason is CommandRejectReason.ALREADY_TERMINAL  # type: ignore[union-attr]
    assert settled.settlement is None


def test_signals_go_to_waits_by_name_in_log_order_each_once() -> None:
    log = _log()
    log.commit("c1", signal(_conv(log), _signal("g1", payload="early"), log.ref(), T0))  # before the wait
    log.commit("c1", signal(_conv(log), _signal("g1", payload="early"), log.ref(), T0))  # a repeat counts once
    _start(log, "a1")
    log.commit("c1", signal(_conv(log), _signal("h1", name="other"), log.ref(), T0))
    log.append("c1", [_request(0, "a1"), _request(1, "a1")])  # two waits for "paid"
    pairs = deliveries(_conv(log), "s1", _journal(log))
    assert [(w.wait_id, g.command_id) for w, g in pairs] == [("s1#w0", "g1")]
    w, g = pairs[0]
    log.commit("c1", resolve_wait(_conv(log), "s1", w.wait_id, WaitOutcome.DELIVERED, at(1), source_id=g.command_id))
    assert deliveries(_conv(log), "s1", _journal(log)) == []  # g1 is consumed; w1 waits
    log.commit("c1", signal(_conv(log), _signal("g2", payload="late"), log.ref(), T0))
    pairs = deliveries(_conv(log), "s1", _journal(log))
    assert [(w.wait_id, g.command_id) for w, g in pairs] == [("s1#w1", "g2")]


def test_a_waiting_run_survives_a_new_owners_claim() -> None:
    log = _log()
    _start(log, "a1")
    log.append("c1", [_request(0, "a1")])
    assert log.claim("w2") == ()
    assert _sub(log).state is S.WAITING


def test_open_and_expired_waits_read_the_requests_against_the_state() -> None:
    log = _log()
    _start(log, "a1")
    requests = [_request(0, "a1", deadline_s=5), _request(1, "a1", name="b"), _request(2, "a1", deadline_s=9)]
    log.append("c1", requests)
    log.commit("c1", resolve_wait(_conv(log), "s1", "s1#w2", WaitOutcome.DELIVERED, at(1)))
    still = open_waits(_conv(log), "s1", requests)
    assert [r.wait_id for r in still] == ["s1#w0", "s1#w1"]
    assert expired_waits(still, at(4.999)) == []
    assert [r.wait_id for r in expired_waits(still, at(5))] == ["s1#w0"]
