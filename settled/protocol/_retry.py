"""A submission's retry budget (issue 22 item 4; docs/semantics.md §16, DUR-014). Pure.

A charged attempt (a death, an uncaught retryable error; `settled.protocol.Submission.charged_attempts`) that ends
within ``max_attempts`` is retried after a backoff: the owner appends `SubmissionRetryScheduled` (the retry's number,
the attempt's cause, the backoff drawn and the absolute wake-up) and, in the same batch, a timed wait of the generic
wait machinery (`WaitRequested`, deadline = the wake-up). The fold takes the submission Ready → Waiting: it holds its
conversation's lane and no worker slot, and the wait is not charged as a death. The owner's sweeper expires the wait
at its deadline (`settled.protocol.expired_waits`), the fold takes it Waiting → Ready and the scheduler starts the
next attempt, whose `AttemptStarted` (the attempt count) is canonical before it runs.

The backoff doubles from `RetryPolicy.backoff_base_ms` per retry, capped at `RetryPolicy.backoff_max_ms`, plus up to
`RetryPolicy.jitter_ratio` of itself (the caller draws the jitter fraction: nothing here is random), and never more
than the cap. After the budget the submission settles failed with error type `RETRY_BUDGET_EXHAUSTED` and a reason
naming the attempts and the last cause (`dead_letter_reason`): a dead letter, which ``settled retry`` may admit again
as a new submission. A call in doubt still makes it Unknown instead (`settled.protocol.classify`, rule 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from settled.protocol._decide import Decision
from settled.protocol._errors import IllegalTransitionError, UnknownSubmissionError
from settled.protocol._fold import ConversationState
from settled.protocol._states import SubmissionState
from settled.schemas import SubmissionRetryScheduled, WaitKind, WaitRequested

__all__ = [
    "RETRY_BUDGET_EXHAUSTED",
    "RetryPolicy",
    "backoff_ms",
    "dead_letter_reason",
    "is_retry_wait",
    "retry_wait_id_for",
    "schedule_retry",
]

#: The error type of a submission that settled failed because its retry budget was spent (a dead letter).
RETRY_BUDGET_EXHAUSTED = "retry_budget_exhausted"

_RETRY_WAIT_MARK = "#retry"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A submission's retry budget and backoff (issue 22 item 4).

    Attributes:
        max_attempts: Charged attempts before the submission settles failed (docs/design.md §5).
        backoff_base_ms: The backoff before the first retry, in milliseconds; doubled for each later retry.
        backoff_max_ms: The longest backoff, jitter included, in milliseconds.
        jitter_ratio: Up to this fraction of the backoff is added at random (0: none).

    Raises:
        ValueError: ``max_attempts`` < 1, a negative backoff, ``backoff_max_ms`` < ``backoff_base_ms``, or
            ``jitter_ratio`` outside [0, 1].
    """

    max_attempts: int = 3
    backoff_base_ms: int = 100
    backoff_max_ms: int = 60_000
    jitter_ratio: float = 0.2

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.backoff_base_ms < 0:
            raise ValueError(f"RetryPolicy.backoff_base_ms must be >= 0, got {self.backoff_base_ms}")
        if self.backoff_max_ms < self.backoff_base_ms:
            raise ValueError(
                f"RetryPolicy.backoff_max_ms must be >= backoff_base_ms ({self.backoff_base_ms}), "
                f"got {self.backoff_max_ms}"
            )
        if not 0.0 <= self.jitter_ratio <= 1.0:
            raise ValueError(f"RetryPolicy.jitter_ratio must be within [0, 1], got {self.jitter_ratio}")


def backoff_ms(policy: RetryPolicy, retry: int, jitter_fraction: float) -> int:
    """Return the backoff before retry ``retry``, in milliseconds.

    Args:
        policy: The budget.
        retry: Which retry (1, 2, ...).
        jitter_fraction: A draw from [0, 1) (the caller's randomness); 0 adds no jitter.

    Returns:
        ``min(max, base * 2**(retry-1) * (1 + jitter_ratio * jitter_fraction))``.

    Raises:
        ValueError: ``retry`` < 1 or ``jitter_fraction`` outside [0, 1].
    """
    if retry < 1:
        raise ValueError(f"retry must be >= 1, got {retry}")
    if not 0.0 <= jitter_fraction <= 1.0:
        raise ValueError(f"jitter_fraction must be within [0, 1], got {jitter_fraction}")
    doubled = min(policy.backoff_base_ms * 2 ** min(retry - 1, 62), policy.backoff_max_ms)
    return min(int(doubled * (1.0 + policy.jitter_ratio * jitter_fraction)), policy.backoff_max_ms)


def retry_wait_id_for(submission_id: str, retry: int) -> str:
    """Return the id of a submission retry's timed wait.

    Args:
        submission_id: The submission.
        retry: Which retry (1, 2, ...).

    Returns:
        ``<submission_id>#retry<retry>`` (a run's own waits are ``<run_id>#w<ordinal>``).
    """
    return f"{submission_id}{_RETRY_WAIT_MARK}{retry}"


def is_retry_wait(wait_id: str) -> bool:
    """Tell whether a wait id is a submission retry's timed wait (`retry_wait_id_for`), not one the run asked for.

    Args:
        wait_id: A wait id.

    Returns:
        True for a retry's wait: the run never replays it.
    """
    _, mark, tail = wait_id.rpartition(_RETRY_WAIT_MARK)
    return bool(mark) and tail.isdigit()


def schedule_retry(
    state: ConversationState,
    submission_id: str,
    now: datetime,
    policy: RetryPolicy,
    cause: str,
    jitter_fraction: float,
) -> Decision:
    """Schedule the next attempt of a Ready submission whose charged attempt ended: its backoff as a timed wait.

    Args:
        state: The conversation's scratch state, with the attempt's end (an interruption, a resuming recovery
            decision) already folded in.
        submission_id: The submission.
        now: The owner's clock reading (aware).
        policy: The budget.
        cause: Why the attempt ended, bounded by the caller.
        jitter_fraction: A draw from [0, 1) (`backoff_ms`).

    Returns:
        `SubmissionRetryScheduled` and its `WaitRequested` (kind signal, name ``settled.retry#<n>``, deadline = the
        wake-up), one batch.

    Raises:
        UnknownSubmissionError: The conversation holds no such submission.
        IllegalTransitionError: It is not Ready with an attempt behind it.
    """
    sub = state.submission(submission_id)
    if sub is None:
        raise UnknownSubmissionError(state.conversation_id, submission_id)
    if sub.state is not SubmissionState.READY or sub.attempt_id is None:
        raise IllegalTransitionError(
            submission_id,
            sub.state,
            SubmissionState.WAITING,
            "SubmissionRetryScheduled",
            "a retry is scheduled for a Ready submission after an attempt",
        )
    retry = sub.retries + 1
    wait_ms = backoff_ms(policy, retry, jitter_fraction)
    wake_at = now + timedelta(milliseconds=wait_ms)
    wait_id = retry_wait_id_for(submission_id, retry)
    scheduled = SubmissionRetryScheduled(
        submission_id=submission_id,
        attempt_id=sub.attempt_id,
        retry=retry,
        cause=cause,
        backoff_ms=wait_ms,
        wake_at=wake_at,
        wait_id=wait_id,
    )
    wait = WaitRequested(
        submission_id=submission_id,
        attempt_id=sub.attempt_id,
        wait_id=wait_id,
        kind=WaitKind.SIGNAL,
        name=f"settled.retry#{retry}",
        ordinal=0,
        deadline=wake_at,
    )
    return Decision(events=(scheduled, wait))


def dead_letter_reason(attempts: int, max_attempts: int, last_cause: str) -> str:
    """Return a dead letter's settlement reason: the attempts charged and the last cause.

    Args:
        attempts: Charged attempts.
        max_attempts: The budget.
        last_cause: Why the last attempt ended.

    Returns:
        The reason, e.g. ``"3 attempts charged (max_attempts 3); last cause: WorkerDied: ..."``.
    """
    return f"{attempts} attempts charged (max_attempts {max_attempts}); last cause: {last_cause}"
