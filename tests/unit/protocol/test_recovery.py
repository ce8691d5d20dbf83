"""The recovery classifier, case by case: one case per row of docs/semantics.md §15 crash-point matrix, then the rules.

Each case builds the persisted facts the crash leaves (real batches folded by the protocol's fold), classifies
them, and — when the answer is a decision — appends its events to the same log, so the fold proves the decision
is a legal edge and leads where recovery means to go (DUR-009, DUR-013; docs/semantics.md §14, §15).
"""

from __future__ import annotations

import pytest

from settled.protocol import (
    OpenCall,
    ReconcileAnswer,
    Reconciliation,
    Recovery,
    RecoveryAction,
    RecoverySnapshot,
    SubmissionState,
    ToolSafety,
    abort,
    admit,
    classify,
    start_attempt,
    terminalize,
)
from settled.schemas import (
    AttemptStarted,
    DeclaredToolCall,
    DeltaKind,
    InputApplied,
    ModelResponseCompleted,
    ModelResponseDelta,
    ReceiptOutcome,
    RecoveryDecisionKind,
    SettlementOutcome,
    SubmissionAdmitted,
    SubmissionReady,
    ToolCallPrepared,
    ToolCallSettled,
    ToolCallUnknown,
    canonical_json,
    json_digest,
)

from ._sim import T0, Log, abort_cmd, proposal

S = SubmissionState
K = RecoveryDecisionKind
IDEMPOTENT = ToolSafety(idempotent=True)
UNSAFE = ToolSafety()
RECONCILABLE = ToolSafety(reconcilable=True)
ARGS = canonical_json({"amount": 5})


@pytest.fixture
def log() -> Log:
    log = Log()
    log.claim()
    return log


def admitted(log: Log, sid: str = "s1") -> None:
    log.commit("c1", admit(log.state.conversation("c1"), proposal(sid, f"k-{sid}"), log.ref(), T0))


def started(log: Log, sid: str = "s1", attempt_id: str = "a1") -> None:
    log.commit("c1", start_attempt(log.state.conversation("c1"), sid, attempt_id, log.epoch))


def prepare(log: Log, call_id: str = "call1", tool: str = "pay", sid: str = "s1", attempt_id: str = "a1") -> None:
    log.append(
        "c1",
        [
            ToolCallPrepared(
                submission_id=sid,
                run_id=sid,
                attempt_id=attempt_id,
                call_id=call_id,
                ordinal=0,
                tool=tool,
                args_json=ARGS,
                args_digest=json_digest(ARGS),
                idempotency_key=f"ik-{call_id}",
                owner_epoch=log.epoch,
            )
        ],
    )


def snapshot(log: Log, *calls: OpenCall, sid: str = "s1", max_attempts: int = 3, **kw: bool) -> RecoverySnapshot:
    sub = log.state.conversation("c1").submission(sid)
    return RecoverySnapshot.of(sid, sub, calls, max_attempts, **kw)


def state(log: Log, sid: str = "s1") -> SubmissionState:
    return log.state.conversation("c1").state_of(sid)


def decide_and_apply(log: Log, recovery: Recovery) -> SubmissionState:
    """Append the decision's events (the fold checks them) and return the submission's new state."""
    assert recovery.action is RecoveryAction.DECIDE, recovery
    assert recovery.decision is not None
    log.append("c1", recovery.events)
    return state(log, recovery.decision.submission_id)


def died(log: Log) -> None:
    """The owner disappears and a new one claims the partition: running attempts go to Recovery."""
    log.claim("w2")


# ---------------------------------------------------------------------------------- docs/semantics.md §15, row by row


def test_row01_before_ledger_admission_nothing_is_accepted(log: Log) -> None:
    r = classify(snapshot(log))
    assert r.action is RecoveryAction.NOTHING and "client retries" in r.reason


def test_row02_after_admission_before_readiness_recovery_materializes(log: Log) -> None:
    # settled commits SubmissionAdmitted and SubmissionReady in one transaction; a log holding only the first
    # (e.g. written by another implementation) is still classified.
    decision = admit(log.state.conversation("c1"), proposal("s1", "k1"), log.ref(), T0)
    assert isinstance(decision.events[0], SubmissionAdmitted)
    log.append("c1", decision.events[:1])
    r = classify(snapshot(log))
    assert r.action is RecoveryAction.MATERIALIZE
    log.append("c1", [SubmissionReady(submission_id="s1", submission_seq=1)])
    assert state(log) is S.READY


def test_row03_after_readiness_before_receipt_a_retry_returns_the_same_receipt(log: Log) -> None:
    admitted(log)
    r = classify(snapshot(log))
    assert r.action is RecoveryAction.SCHEDULE and "same receipt" in r.reason
    again = admit(log.state.conversation("c1"), proposal("s1-retry", "k-s1"), log.ref(), T0)
    assert again.receipt is not None and again.receipt.outcome is ReceiptOutcome.DUPLICATE
    assert again.receipt.original_submission_id == "s1"


def test_row04_after_claim_before_canonical_input_the_input_is_applied_idempotently(log: Log) -> None:
    admitted(log)
    log.append("c1", [AttemptStarted(submission_id="s1", attempt=1, attempt_id="a1", owner_epoch=log.epoch)])
    died(log)
    r = classify(snapshot(log))
    assert r.kind is K.RESUME and "input is not applied" in r.reason
    assert decide_and_apply(log, r) is S.READY
    nxt = start_attempt(log.state.conversation("c1"), "s1", "a2", log.epoch)
    assert any(isinstance(e, InputApplied) for e in nxt.events)  # applied by the next attempt, once
    log.commit("c1", nxt)
    assert log.state.conversation("c1").submission("s1").input_applied  # type: ignore[union-attr]


def test_row05_after_canonical_input_before_marker_is_one_event_here(log: Log) -> None:
    # InputApplied is both the canonical input and its applied marker (one event, docs/design.md §3): the boundary
    # between them does not exist, so recovery finds the input applied and does not apply it again.
    admitted(log)
    started(log)
    died(log)
    r = classify(snapshot(log))
    assert r.kind is K.RESUME
    decide_and_apply(log, r)
    nxt = start_attempt(log.state.conversation("c1"), "s1", "a2", log.epoch)
    assert not any(isinstance(e, InputApplied) for e in nxt.events)


def test_row06_after_claim_before_attempt_start_reclaims(log: Log) -> None:
    admitted(log)
    died(log)  # the owner claimed, then died before its AttemptStarted committed
    r = classify(snapshot(log))
    assert r.action is RecoveryAction.SCHEDULE
    assert state(log) is S.READY


def test_row07_mid_provider_stream_records_the_interruption_and_retries(log: Log) -> None:
    admitted(log)
    started(log)
    log.append(
        "c1",
        [
            ModelResponseDelta(
                submission_id="s1", attempt_id="a1", response_ordinal=0, delta_index=0, kind=DeltaKind.TEXT, text="He"
            )
        ],
    )
    died(log)
    r = classify(snapshot(log, partial_response=True))
    assert r.kind is K.RESUME and "retried as a new response" in r.reason
    assert decide_and_apply(log, r) is S.READY


def test_row08_after_model_item_commit_before_tool_preparation_resumes_tool_scheduling(log: Log) -> None:
    admitted(log)
    started(log)
    call = DeclaredToolCall(call_id="m1", tool="pay", args_json=ARGS, args_digest=json_digest(ARGS))
    log.append(
        "c1",
        [
            ModelResponseCompleted(
                submission_id="s1",
                attempt_id="a1",
                response_ordinal=0,
                provider="scripted",
                model="m",
                text="",
                tool_calls=(call,),
            )
        ],
    )
    died(log)
    r = classify(snapshot(log))
    assert r.kind is K.RESUME
    assert decide_and_apply(log, r) is S.READY


@pytest.mark.parametrize("row", ["row09 prepared, not invoked", "row10 during invocation", "row11 returned"])
def test_rows09_to_11_prepared_only_idempotent_tool_is_retried_safely(log: Log, row: str) -> None:
    # The three rows leave the same durable facts (Prepared only): recovery cannot tell them apart, so the
    # tool's declared safety decides.
    admitted(log)
    started(log)
    prepare(log)
    died(log)
    r = classify(snapshot(log, OpenCall("call1", "pay", IDEMPOTENT)))
    assert r.kind is K.SAFE_RETRY and r.decision is not None and r.decision.call_ids == ("call1",)
    assert decide_and_apply(log, r) is S.READY


@pytest.mark.parametrize("row", ["row09 prepared, not invoked", "row10 during invocation", "row11 returned"])
def test_rows09_to_11_prepared_only_unsafe_tool_is_unknown(log: Log, row: str) -> None:
    admitted(log)
    started(log)
    prepare(log)
    died(log)
    r = classify(snapshot(log, OpenCall("call1", "pay", UNSAFE)))
    assert r.kind is K.UNKNOWN
    assert [type(e) for e in r.events[:-1]] == [ToolCallUnknown]
    assert "neither idempotent nor reconcilable" in r.reason
    assert decide_and_apply(log, r) is S.UNKNOWN
    assert log.state.conversation("c1").submission("s1").unknown_calls == frozenset({"call1"})  # type: ignore[union-attr]


def test_row09_reconciler_proves_never_started_then_retry(log: Log) -> None:
    admitted(log)
    started(log)
    prepare(log)
    died(log)
    first = classify(snapshot(log, OpenCall("call1", "pay", RECONCILABLE)))
    assert first.action is RecoveryAction.RECONCILE_FIRST and first.reconcile == ("call1",)
    answered = OpenCall("call1", "pay", RECONCILABLE, Reconciliation(ReconcileAnswer.NEVER_STARTED))
    r = classify(snapshot(log, answered))
    assert r.kind is K.SAFE_RETRY and "never started" in r.reason
    assert decide_and_apply(log, r) is S.READY


def test_row10_reconciler_recovers_the_result(log: Log) -> None:
    admitted(log)
    started(log)
    prepare(log)
    died(log)
    result = canonical_json({"charged": 5})
    answered = OpenCall("call1", "pay", RECONCILABLE, Reconciliation(ReconcileAnswer.RECOVERED, result))
    r = classify(snapshot(log, answered))
    assert r.kind is K.RECONCILE
    settled = r.events[0]
    assert isinstance(settled, ToolCallSettled) and settled.result_json == result and settled.attempt_id == "a1"
    assert decide_and_apply(log, r) is S.READY


def test_row11_reconciler_cannot_tell_makes_the_call_unknown(log: Log) -> None:
    admitted(log)
    started(log)
    prepare(log)
    died(log)
    answered = OpenCall("call1", "pay", RECONCILABLE, Reconciliation(ReconcileAnswer.UNKNOWN, reason="no record"))
    r = classify(snapshot(log, answered))
    assert r.kind is K.UNKNOWN and "reconciler answered unknown: no record" in r.reason
    assert decide_and_apply(log, r) is S.UNKNOWN


def test_row12_after_tool_result_commit_continues(log: Log) -> None:
    admitted(log)
    started(log)
    prepare(log)
    result = canonical_json({"ok": True})
    log.append(
        "c1",
        [
            ToolCallSettled(
                submission_id="s1",
                attempt_id="a1",
                call_id="call1",
                result_json=result,
                result_digest=json_digest(result),
            )
        ],
    )
    died(log)
    r = classify(snapshot(log))
    assert r.kind is K.RESUME and r.decision is not None and r.decision.call_ids == ()
    assert decide_and_apply(log, r) is S.READY


def test_row13_after_decision_to_finish_before_terminalizing_recomputes(log: Log) -> None:
    # The run returned its reply in memory; nothing of it is canonical: the next attempt recomputes it from the
    # canonical boundary (replaying every recorded effect).
    admitted(log)
    started(log)
    died(log)
    r = classify(snapshot(log))
    assert r.kind is K.RESUME
    assert decide_and_apply(log, r) is S.READY


@pytest.mark.parametrize(("aborted", "outcome"), [(False, None), (True, SettlementOutcome.ABORTED)])
def test_row14_after_settlement_reservation_appends_the_reserved_record(
    log: Log, aborted: bool, outcome: SettlementOutcome | None
) -> None:
    admitted(log)
    started(log)
    if aborted:
        log.commit("c1", abort(log.state.conversation("c1"), abort_cmd("ab1", "s1"), log.ref(), T0))
    died(log)
    budget = classify(snapshot(log, max_attempts=1))
    assert budget.kind is K.TERMINALIZE
    decide_and_apply(log, budget)  # the obligation is fixed (reserved); the process dies before the settlement
    assert state(log) is S.TERMINALIZING
    r = classify(snapshot(log, max_attempts=1))
    assert r.action is RecoveryAction.SETTLE_RESERVED and r.settle is outcome
    settle = terminalize(log.state.conversation("c1"), "s1", r.settle or SettlementOutcome.FAILED, T0)
    log.commit("c1", settle)
    assert state(log) is (S.ABORTED if aborted else S.FAILED)


def test_row15_after_canonical_settlement_before_ledger_finalization_is_terminal(log: Log) -> None:
    # The canonical settlement and the settlements record commit in one transaction: history is the ledger.
    admitted(log)
    started(log)
    log.commit("c1", terminalize(log.state.conversation("c1"), "s1", SettlementOutcome.COMPLETED, T0, reply_json="1"))
    r = classify(snapshot(log))
    assert r.action is RecoveryAction.NOTHING and "settled completed" in r.reason


def test_row16_after_ledger_finalization_before_notification_returns_the_recorded_settlement(log: Log) -> None:
    admitted(log)
    started(log)
    log.commit("c1", terminalize(log.state.conversation("c1"), "s1", SettlementOutcome.COMPLETED, T0, reply_json="1"))
    assert [r.submission_id for r in log.settlements] == ["s1"]
    r = classify(snapshot(log))
    assert r.action is RecoveryAction.NOTHING and "recorded settlement" in r.reason


# ---------------------------------------------------------------------------------------------- the rules


def test_abort_with_only_safe_calls_terminalizes_aborted(log: Log) -> None:
    admitted(log)
    started(log)
    prepare(log)
    log.commit("c1", abort(log.state.conversation("c1"), abort_cmd("ab1", "s1"), log.ref(), T0))
    died(log)
    r = classify(snapshot(log, OpenCall("call1", "pay", IDEMPOTENT)))
    assert r.kind is K.TERMINALIZE and r.settle is SettlementOutcome.ABORTED
    assert decide_and_apply(log, r) is S.TERMINALIZING


def test_abort_with_a_call_in_doubt_is_unknown_not_aborted(log: Log) -> None:
    admitted(log)
    started(log)
    prepare(log)
    log.commit("c1", abort(log.state.conversation("c1"), abort_cmd("ab1", "s1"), log.ref(), T0))
    died(log)
    r = classify(snapshot(log, OpenCall("call1", "pay", UNSAFE)))
    assert r.kind is K.UNKNOWN  # docs/design.md §5: the abort settles the submission once the call is resolved
    assert decide_and_apply(log, r) is S.UNKNOWN


def test_spent_budget_terminalizes_failed_unless_a_call_is_in_doubt(log: Log) -> None:
    admitted(log)
    started(log)
    prepare(log)
    died(log)
    r = classify(snapshot(log, OpenCall("call1", "pay", IDEMPOTENT), max_attempts=1))
    assert r.kind is K.TERMINALIZE and r.settle is SettlementOutcome.FAILED and "max_attempts 1" in r.reason
    r2 = classify(snapshot(log, OpenCall("call1", "pay", UNSAFE), max_attempts=1))
    assert r2.kind is K.UNKNOWN


def test_a_call_already_unknown_keeps_the_run_unknown(log: Log) -> None:
    admitted(log)
    started(log)
    prepare(log, "call1")
    prepare(log, "call2")
    log.append("c1", [ToolCallUnknown(submission_id="s1", call_id="call1", reason="timeout")])
    assert state(log) is S.RECOVERY  # Running -> Recovery on ToolCallUnknown
    r = classify(snapshot(log, OpenCall("call2", "pay", IDEMPOTENT)))
    assert r.kind is K.UNKNOWN and r.decision is not None and r.decision.call_ids == ("call1",)
    assert decide_and_apply(log, r) is S.UNKNOWN


def test_recovered_and_idempotent_calls_together_reconcile(log: Log) -> None:
    admitted(log)
    started(log)
    prepare(log, "call1")
    prepare(log, "call2")
    died(log)
    result = canonical_json("done")
    r = classify(
        snapshot(
            log,
            OpenCall("call1", "pay", RECONCILABLE, Reconciliation(ReconcileAnswer.RECOVERED, result)),
            OpenCall("call2", "get", IDEMPOTENT),
        )
    )
    assert r.kind is K.RECONCILE and r.decision is not None and r.decision.call_ids == ("call1", "call2")
    assert decide_and_apply(log, r) is S.READY


def test_an_open_call_the_journal_does_not_describe_is_in_doubt(log: Log) -> None:
    admitted(log)
    started(log)
    prepare(log)
    died(log)
    r = classify(snapshot(log))  # no OpenCall given: e.g. a tool no longer registered
    assert r.kind is K.UNKNOWN and "'<unrecorded>'" in r.reason


def test_running_and_unknown_submissions_wait(log: Log) -> None:
    admitted(log)
    started(log)
    assert classify(snapshot(log)).action is RecoveryAction.WAIT
    prepare(log)
    died(log)
    decide_and_apply(log, classify(snapshot(log, OpenCall("call1", "pay", UNSAFE))))
    r = classify(snapshot(log))
    assert r.action is RecoveryAction.WAIT and "ResolveUnknown" in r.reason


def test_reconciliation_and_snapshot_refuse_bad_values() -> None:
    with pytest.raises(ValueError, match="result_json is required"):
        Reconciliation(ReconcileAnswer.RECOVERED)
    with pytest.raises(ValueError, match="only then"):
        Reconciliation(ReconcileAnswer.NEVER_STARTED, result_json="1")
    with pytest.raises(ValueError, match="not canonical"):
        Reconciliation(ReconcileAnswer.RECOVERED, result_json='{"b":1, "a":2}')
    with pytest.raises(ValueError, match="max_attempts must be >= 1, got 0"):
        RecoverySnapshot("s1", S.RECOVERY, max_attempts=0)
    with pytest.raises(ValueError, match="call ids repeat"):
        RecoverySnapshot("s1", S.RECOVERY, open_calls=(OpenCall("c", "t"),), unknown_calls=("c",))
