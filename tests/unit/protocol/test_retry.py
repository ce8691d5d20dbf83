"""A submission's retry budget in the pure core (issue 22 item 4): backoff, Ready → Waiting → Ready, not charged."""

from __future__ import annotations

from datetime import timedelta

import pytest

from settled.protocol import (
    ConversationState,
    IllegalTransitionError,
    LogInconsistencyError,
    RetryPolicy,
    StartAttempt,
    Submission,
    SubmissionState,
    admit,
    backoff_ms,
    interrupt,
    is_retry_wait,
    resolve_wait,
    retry_wait_id_for,
    schedule,
    schedule_retry,
    start_attempt,
    wait_id_for,
)
from settled.schemas import SubmissionRetryScheduled, WaitKind, WaitOutcome, WaitRequested

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
