"""A submission's retry budget in the pure core (issue 22 item 4): backoff, Ready → Waiting → Ready, not charged."""

from __future__ import annotations

from datetime import timedelta

import pytest

from settled.protocol import (
    RETRY_BUDGET_EXHAUSTED,
    ConversationState,
    Decision,
    IllegalTransitionError,
    LogInconsistencyError,
    RetryPolicy,
    StartAttempt,
    Submission,
    SubmissionState,
    admit,
    backoff_ms,
    dead_letter_reason,
    flow_input,
    flow_resume_input,
    flow_run_id_for,
    interrupt,
    is_retry_wait,
    resolve_wait,
    retry_submission,
    retry_wait_id_for,
    schedule,
    schedule_retry,
    start_attempt,
    terminalize,
    wait_id_for,
)
from settled.schemas import (
    CommandKind,
    CommandRejected,
    CommandRejectReason,
    ReceiptOutcome,
    RequestKind,
    RetrySubmission,
    SettlementOutcome,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionReady,
    SubmissionRetryScheduled,
    WaitKind,
    WaitOutcome,
    WaitRequested,
)

from ._sim import T0, Log, at, proposal

S = SubmissionState
POLICY = RetryPolicy(max_attempts=3, backoff_base_ms=1_000, backoff_max_ms=5_000)


def _conv(log: Log) -> ConversationState:
    return log.state.conversation("c1")


def _sub(log: Log) -> Submission:
    sub = _conv(log).submission("s1")
    assert sub is not None
    return sub


def _failed_once() -> Log:
    """s1 admitted, its attempt 1 started and interrupted by an uncaught error (Ready, charged once)."""
    log = Log()
    log.claim()
    log.commit("c1", admit(_conv(log), proposal("s1", "k1"), log.ref(), T0))
    log.commit("c1", start_attempt(_conv(log), "s1", "a1", 1))
    log.commit("c1", interrupt(_conv(log), "s1", "attempt 1 raised ValueError"))
    return log


def test_the_backoff_doubles_from_its_base_takes_its_jitter_and_never_passes_the_cap() -> None:
    assert [backoff_ms(POLICY, n, 0.0) for n in (1, 2, 3, 4)] == [1_000, 2_000, 4_000, 5_000]
    assert backoff_ms(POLICY, 1, 0.5) == 1_100  # 20% jitter at most: half of it here
    assert backoff_ms(POLICY, 3, 0.99) == 4_792
    assert backoff_ms(POLICY, 3, 1.0) == 4_800
    assert backoff_ms(POLICY, 60, 0.9) == 5_000
    with pytest.raises(ValueError, match="retry must be >= 1, got 0"):
        backoff_ms(POLICY, 0, 0.0)
    with pytest.raises(ValueError, match="backoff_max_ms must be >= backoff_base_ms"):
        RetryPolicy(backoff_base_ms=10, backoff_max_ms=5)


def test_a_scheduled_retry_waits_until_its_wake_up_then_the_next_attempt_starts_uncharged_by_the_wait() -> None:
    log = _failed_once()
    assert (_sub(log).state, _sub(log).charged_attempts) == (S.READY, 1)
    decision = schedule_retry(_conv(log), "s1", T0, POLICY, "ValueError: no", 0.0)
    retry, wait = decision.events
    assert isinstance(retry, SubmissionRetryScheduled) and isinstance(wait, WaitRequested)
    assert (retry.retry, retry.attempt_id, retry.backoff_ms, retry.wake_at) == (1, "a1", 1_000, at(1))
    assert (wait.wait_id, wait.deadline, wait.kind) == (retry_wait_id_for("s1", 1), at(1), WaitKind.SIGNAL)
    assert is_retry_wait(wait.wait_id) and not is_retry_wait(wait_id_for("s1", 3))
    log.commit("c1", decision)
    sub = _sub(log)
    assert (sub.state, sub.waits, sub.retries, sub.charged_attempts) == (S.WAITING, {wait.wait_id}, 1, 1)
    assert schedule(_conv(log)) is None  # the backoff holds the lane: no attempt starts
    log.commit("c1", resolve_wait(_conv(log), "s1", wait.wait_id, WaitOutcome.EXPIRED, at(1) + timedelta(seconds=1)))
    assert _sub(log).state is S.READY
    assert schedule(_conv(log)) == StartAttempt("s1", 2)
    log.commit("c1", start_attempt(_conv(log), "s1", "a2", 1))
    log.commit("c1", interrupt(_conv(log), "s1", "attempt 2 raised ValueError"))
    second = schedule_retry(_conv(log), "s1", at(5), POLICY, "ValueError: no", 0.0)
    assert isinstance(second.events[0], SubmissionRetryScheduled)
    assert (second.events[0].retry, second.events[0].wake_at) == (2, at(7))


def test_the_fold_refuses_a_ready_wait_that_is_not_the_scheduled_retrys() -> None:
    log = _failed_once()
    stray = WaitRequested(
        submission_id="s1", attempt_id="a1", wait_id="s1#retry1", kind=WaitKind.SIGNAL, name="x", ordinal=0
    )
    with pytest.raises(LogInconsistencyError, match="wait_id"):
        log.append("c1", [stray])
    retry, _ = schedule_retry(_conv(log), "s1", T0, POLICY, "c", 0.0).events
    with pytest.raises(LogInconsistencyError, match="retry"):
        log.append("c1", [retry.model_copy(update={"retry": 2})])


def test_a_retry_is_scheduled_only_for_a_ready_submission() -> None:
    log = _failed_once()
    log.commit("c1", start_attempt(_conv(log), "s1", "a2", 1))
    with pytest.raises(IllegalTransitionError):
        schedule_retry(_conv(log), "s1", T0, POLICY, "c", 0.0)


# ------------------------------------------------------------------------------- settled retry (RetrySubmission)


def _retry_cmd(target: str, new_id: str, command_id: str = "r1", conversation_id: str = "c1") -> RetrySubmission:
    """A RetrySubmission as the ledger hands it over once its signature verified (the signature is the ledger's)."""
    return RetrySubmission(
        command_id=command_id,
        principal="ops",
        conversation_id=conversation_id,
        submission_id=target,
        new_submission_id=new_id,
        key_id="ops-1",
        signature=b"verified by the ledger",
        requested_at=T0,
    )


def _dead_letter() -> Log:
    """s1 (input "hello", tool "t") ran once and settled failed retry_budget_exhausted; s2 is queued behind it."""
    log = Log()
    log.claim()
    log.commit("c1", admit(_conv(log), proposal("s1", "k1", tools=("t",)), log.ref(), T0))
    log.commit("c1", admit(_conv(log), proposal("s2", "k2"), log.ref(), T0))
    log.commit("c1", start_attempt(_conv(log), "s1", "a1", 1))
    reason = dead_letter_reason(1, 1, "ValueError: no")
    log.commit(
        "c1",
        terminalize(
            _conv(log), "s1", SettlementOutcome.FAILED, at(1), error_type=RETRY_BUDGET_EXHAUSTED, error_reason=reason
        ),
    )
    return log


def _rejection(decision: Decision) -> tuple[CommandRejectReason, str]:
    (event,) = decision.events
    assert isinstance(event, CommandRejected) and event.command_kind is CommandKind.RETRY
    assert decision.receipt is not None and decision.receipt.outcome is ReceiptOutcome.REJECTED
    assert decision.receipt.reason is not None and decision.receipt.reason.startswith(event.reason.value)
    return event.reason, event.detail


def test_a_retry_admits_the_dead_letters_payload_as_a_new_submission_whose_failed_settlement_stands() -> None:
    log = _dead_letter()
    original = _conv(log).submission("s1")
    assert original is not None and original.dead_lettered and original.input_json is not None  # payload kept
    decision = retry_submission(_conv(log), _retry_cmd("s1", "s1-retry"), log.ref(), at(2))
    admitted, ready = decision.events
    assert isinstance(admitted, SubmissionAdmitted) and isinstance(ready, SubmissionReady)
    assert (admitted.submission_id, admitted.submission_seq, admitted.retry_of) == ("s1-retry", 3, "s1")
    assert (admitted.input_json, admitted.tools_offered, admitted.principal) == (
        original.input_json,
        ("t",),
        original.principal,
    )
    assert (admitted.idempotency_key, admitted.payload_digest) == ("r1", original.payload_digest)
    receipt = decision.receipt
    assert receipt is not None
    assert (receipt.request_kind, receipt.request_id, receipt.outcome) == (
        RequestKind.COMMAND,
        "r1",
        ReceiptOutcome.APPLIED,
    )
    assert (receipt.original_submission_id, receipt.submission_seq) == ("s1-retry", 3)
    log.commit("c1", decision)
    conv = _conv(log)
    retried, new = conv.submission("s1"), conv.submission("s1-retry")
    assert retried is not None and new is not None
    assert (retried.state, retried.outcome, retried.retried_as, retried.input_json) == (
        S.FAILED,
        SettlementOutcome.FAILED,
        "s1-retry",
        None,  # its payload was kept for this retry only
    )
    assert (new.state, new.retry_of, new.submission_seq) == (S.READY, "s1", 3)
    assert schedule(conv) == StartAttempt("s2", 1)  # it is queued behind s2, in sequence order


def test_a_second_retry_of_the_same_dead_letter_is_a_duplicate_pointing_at_the_first() -> None:
    log = _dead_letter()
    log.commit("c1", retry_submission(_conv(log), _retry_cmd("s1", "s1-retry"), log.ref(), at(2)))
    for command in (_retry_cmd("s1", "s1-again", "r2"), _retry_cmd("s1", "s1-retry")):  # another id; the same again
        decision = retry_submission(_conv(log), command, log.ref(), at(3))
        (event,) = decision.events
        assert isinstance(event, SubmissionDuplicate)
        assert (event.original_submission_id, event.idempotency_key) == ("s1-retry", "r1")
        receipt = decision.receipt
        assert receipt is not None
        assert (receipt.request_id, receipt.outcome, receipt.original_submission_id, receipt.submission_seq) == (
            command.command_id,
            ReceiptOutcome.DUPLICATE,
            "s1-retry",
            3,
        )
        log.commit("c1", decision)
    conv = _conv(log)
    assert conv.submission("s1-again") is None and conv.last_submission_seq == 3


def test_a_retry_of_a_missing_running_completed_or_otherwise_failed_submission_is_rejected_with_its_reason() -> None:
    log = _dead_letter()
    conv = _conv(log)
    reason, detail = _rejection(retry_submission(conv, _retry_cmd("nope", "n1"), log.ref(), at(2)))
    assert (reason, detail) == (CommandRejectReason.UNKNOWN_TARGET, "conversation 'c1' has no submission 'nope'")
    log.commit("c1", start_attempt(conv, "s2", "a2", 1))
    reason, detail = _rejection(retry_submission(_conv(log), _retry_cmd("s2", "n1"), log.ref(), at(2)))
    assert reason is CommandRejectReason.NOT_DEAD_LETTERED and "'s2' is running, not settled" in detail
    log.commit("c1", terminalize(_conv(log), "s2", SettlementOutcome.COMPLETED, at(2), reply_json='"ok"'))
    reason, detail = _rejection(retry_submission(_conv(log), _retry_cmd("s2", "n1"), log.ref(), at(2)))
    assert reason is CommandRejectReason.NOT_DEAD_LETTERED and "'s2' settled completed:" in detail
    log.commit("c1", admit(_conv(log), proposal("s3", "k3"), log.ref(), T0))
    log.commit("c1", start_attempt(_conv(log), "s3", "a3", 1))
    failed = terminalize(
        _conv(log), "s3", SettlementOutcome.FAILED, at(3), error_type="RunFailedError", error_reason="x"
    )
    log.commit("c1", failed)
    reason, detail = _rejection(retry_submission(_conv(log), _retry_cmd("s3", "n1"), log.ref(), at(3)))
    assert reason is CommandRejectReason.NOT_DEAD_LETTERED
    assert "'s3' settled failed with error type 'RunFailedError'" in detail
    other = _conv(log).submission("s3")
    assert other is not None and other.input_json is None  # only a dead letter keeps its payload


def test_a_retry_naming_an_existing_submission_or_breaking_the_contract_is_invalid() -> None:
    log = _dead_letter()
    reason, detail = _rejection(retry_submission(_conv(log), _retry_cmd("s1", "s2"), log.ref(), at(2)))
    assert (reason, detail) == (CommandRejectReason.INVALID, "new_submission_id 's2' already names a submission")
    reason, detail = _rejection(retry_submission(_conv(log), _retry_cmd("s1", "n1", "k1"), log.ref(), at(2)))
    assert reason is CommandRejectReason.INVALID and "command_id 'k1' is already the idempotency key" in detail
    reason, detail = _rejection(retry_submission(_conv(log), _retry_cmd("s1", "bad\x00id"), log.ref(), at(2)))
    assert reason is CommandRejectReason.INVALID and "new_submission_id" in detail
    assert _conv(log).submission("s1") is not None and _conv(log).last_submission_seq == 2  # nothing admitted


def test_the_fold_refuses_a_retry_admission_of_a_submission_that_is_not_a_dead_letter() -> None:
    log = _dead_letter()
    admitted, _ = retry_submission(_conv(log), _retry_cmd("s1", "s1-retry"), log.ref(), at(2)).events
    assert isinstance(admitted, SubmissionAdmitted)
    with pytest.raises(LogInconsistencyError, match="retry_of"):
        log.append("c1", [admitted.model_copy(update={"retry_of": "s2"})])


def test_a_retried_flow_turn_opens_a_new_run_or_resumes_the_run_it_resumed() -> None:
    """Issue 18's flow runs: the retry's run is the one `admit` would give the payload under the new id."""
    log = Log()
    log.claim()
    opened = admit(_conv(log), proposal("f1", "kf1", value=flow_input("refund", {"x": 1})), log.ref(), T0)
    log.commit("c1", opened)
    run = opened.events[0].flow_run_id if isinstance(opened.events[0], SubmissionAdmitted) else None
    assert run == flow_run_id_for("c1", "f1")
    log.commit("c1", start_attempt(_conv(log), "f1", "a1", 1))
    log.commit("c1", terminalize(_conv(log), "f1", SettlementOutcome.FAILED, at(1), error_type=RETRY_BUDGET_EXHAUSTED))
    log.commit("c1", admit(_conv(log), proposal("f2", "kf2", value=flow_resume_input(run, {"y": 2})), log.ref(), T0))
    log.commit("c1", start_attempt(_conv(log), "f2", "a2", 1))
    log.commit("c1", terminalize(_conv(log), "f2", SettlementOutcome.FAILED, at(2), error_type=RETRY_BUDGET_EXHAUSTED))
    again = retry_submission(_conv(log), _retry_cmd("f1", "f1-retry"), log.ref(), at(3))
    admitted = again.events[0]
    assert isinstance(admitted, SubmissionAdmitted) and again.receipt is not None
    assert admitted.flow_run_id == again.receipt.run_id == flow_run_id_for("c1", "f1-retry") != run  # a new run
    log.commit("c1", again)
    resumed = retry_submission(_conv(log), _retry_cmd("f2", "f2-retry", "r2"), log.ref(), at(3))
    admitted = resumed.events[0]
    assert isinstance(admitted, SubmissionAdmitted) and admitted.flow_run_id == run  # the run it resumed
    log.commit("c1", resumed)
