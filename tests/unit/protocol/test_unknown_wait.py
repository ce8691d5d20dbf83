"""The Unknown wait is one kind of the generic wait (issue 16 item 1): one suspended state, one classifier branch.

A call in doubt suspends its run on a wait of kind `unknown` (its wait id is the call id), under the state label
`unknown`; signals and approvals suspend it on waits of their kinds under the label `waiting`. Both labels are the one
waiting state (`WAITING_STATES`), the recovery classifier answers every kind alike, and each kind keeps its own
delivery rule (a signed `ResolveUnknown` for an Unknown, a `WaitResolved` for a signal or approval).
"""

from __future__ import annotations

import pytest

from settled.protocol import (
    WAITING_STATES,
    ConversationState,
    IllegalTransitionError,
    LogInconsistencyError,
    OpenCall,
    RecoveryAction,
    RecoverySnapshot,
    Submission,
    SubmissionState,
    admit,
    classify,
    resolve,
    resolve_wait,
    schedule,
    start_attempt,
    wait_id_for,
    waiting_state,
)
from settled.schemas import (
    ResolutionKind,
    ResolveUnknown,
    ToolCallPrepared,
    WaitKind,
    WaitOutcome,
    WaitRequested,
    json_digest,
)

from ._sim import T0, Log, at, proposal

S = SubmissionState
ARGS = '{"amount":5}'


def _conv(log: Log) -> ConversationState:
    return log.state.conversation("c1")


def _sub(log: Log) -> Submission:
    sub = _conv(log).submission("s1")
    assert sub is not None
    return sub


def _running(*more: str) -> Log:
    """A log whose submission ``s1`` runs its first attempt ``a1`` (later submissions queue behind it)."""
    log = Log()
    log.claim()
    for n, sid in enumerate(("s1", *more), 1):
        log.commit("c1", admit(_conv(log), proposal(sid, f"k{n}"), log.ref(), T0))
    log.commit("c1", start_attempt(_conv(log), "s1", "a1", log.epoch))
    return log


def _unknown(log: Log) -> None:
    """The run prepares an unsafe call and dies; the classifier marks it Unknown (a wait of kind unknown)."""
    prepared = ToolCallPrepared(
        submission_id="s1",
        run_id="s1",
        attempt_id="a1",
        call_id="call1",
        ordinal=0,
        tool="pay",
        args_json=ARGS,
        args_digest=json_digest(ARGS),
        idempotency_key="ik-call1",
        owner_epoch=log.epoch,
    )
    log.append("c1", [prepared])
    log.claim("w2")
    recovery = classify(RecoverySnapshot.of("s1", _sub(log), [OpenCall("call1", "pay")], max_attempts=3))
    log.append("c1", recovery.events)


def _request(kind: WaitKind) -> WaitRequested:
    details = '{"args_digest":"d1"}' if kind is WaitKind.APPROVAL else None
    return WaitRequested(
        submission_id="s1",
        attempt_id="a1",
        wait_id=wait_id_for("s1", 0),
        kind=kind,
        name="paid",
        ordinal=0,
        details_json=details,
    )


def _suspended(kind: WaitKind) -> Log:
    log = _running("s2")
    if kind is WaitKind.UNKNOWN:
        _unknown(log)
    else:
        log.append("c1", [_request(kind)])
    return log


def _resolve_command(kind: ResolutionKind) -> ResolveUnknown:
    return ResolveUnknown(
        command_id="res1",
        principal="operator",
        conversation_id="c1",
        submission_id="s1",
        call_id="call1",
        kind=kind,
        result_json='{"paid":true}' if kind is ResolutionKind.CALL_OUTCOME else None,
        key_id="ops-2026",
        signature=b"verified-by-the-caller",
        requested_at=T0,
    )


@pytest.mark.parametrize(
    ("kind", "wait_id"),
    [(WaitKind.UNKNOWN, "call1"), (WaitKind.SIGNAL, "s1#w0"), (WaitKind.APPROVAL, "s1#w0")],
)
def test_every_wait_kind_suspends_the_run_in_the_one_waiting_state(kind: WaitKind, wait_id: str) -> None:
    log = _suspended(kind)
    sub = _sub(log)
    assert sub.state in WAITING_STATES and sub.state is waiting_state(kind)
    assert dict(sub.wait_kinds) == {wait_id: kind}
    assert sub.suspended_on(wait_id) is kind
    assert schedule(_conv(log)) is None  # no worker slot: nothing starts
    assert _conv(log).active_submission_id == "s1" and _conv(log).queue == ("s1", "s2")  # it holds the lane


def test_unknown_is_the_label_of_the_waiting_state_of_kind_unknown() -> None:
    assert waiting_state(WaitKind.UNKNOWN) is S.UNKNOWN
    assert waiting_state(WaitKind.SIGNAL) is waiting_state(WaitKind.APPROVAL) is S.WAITING
    assert frozenset({S.UNKNOWN, S.WAITING}) == WAITING_STATES


@pytest.mark.parametrize("kind", list(WaitKind))
def test_the_recovery_classifier_takes_the_same_branch_for_every_wait_kind(kind: WaitKind) -> None:
    log = _suspended(kind)
    recovery = classify(RecoverySnapshot.of("s1", _sub(log), [], max_attempts=3))
    assert recovery.action is RecoveryAction.WAIT, recovery
    assert recovery.events == () and recovery.decision is None  # nothing is decided for a suspended run
    assert "waits" in recovery.reason


def test_a_wait_of_kind_unknown_is_delivered_only_by_its_signed_resolution() -> None:
    log = _suspended(WaitKind.UNKNOWN)
    with pytest.raises(IllegalTransitionError, match="signed ResolveUnknown"):
        resolve_wait(_conv(log), "s1", "call1", WaitOutcome.DELIVERED, at(1), payload_json="1")
    trace = log.commit("c1", resolve(_conv(log), _resolve_command(ResolutionKind.CALL_OUTCOME), log.ref(), at(1)))
    assert [(t.edge.source, t.edge.target) for t in trace] == [(S.UNKNOWN, S.READY)]
    assert dict(_sub(log).wait_kinds) == {} and _sub(log).suspended_on("call1") is None


def test_a_run_cannot_request_a_wait_of_kind_unknown() -> None:
    log = _running()
    with pytest.raises(LogInconsistencyError, match="kind"):
        log.append("c1", [_request(WaitKind.UNKNOWN)])
    assert _sub(log).state is S.RUNNING


def test_the_signal_and_approval_deliveries_do_not_deliver_an_unknown_call() -> None:
    log = _suspended(WaitKind.SIGNAL)
    with pytest.raises(IllegalTransitionError, match="not open"):
        resolve_wait(_conv(log), "s1", "call1", WaitOutcome.DELIVERED, at(1))
    log.commit("c1", resolve_wait(_conv(log), "s1", "s1#w0", WaitOutcome.DELIVERED, at(1), source_id="g1"))
    assert _sub(log).state is S.READY and dict(_sub(log).wait_kinds) == {}
