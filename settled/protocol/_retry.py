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

`retry_submission` decides that signed `RetrySubmission`: the dead letter's payload (its input and offered tools,
which the fold keeps for this) is admitted once more as a new submission (the command's ``new_submission_id``, the
next sequence, ``retry_of`` naming the original, whose failed settlement stands); a second retry of the same original
is a duplicate pointing at the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from settled.protocol._contract import check_command
from settled.protocol._decide import Decision, check_input_undecided, reject_command, reject_invalid
from settled.protocol._errors import IllegalTransitionError, UnknownSubmissionError
from settled.protocol._flows import flow_invocation, flow_run_id_for
from settled.protocol._fold import RETRY_BUDGET_EXHAUSTED, ConversationState
from settled.protocol._states import SubmissionState
from settled.schemas import (
    CommandRejectReason,
    InputRef,
    Receipt,
    ReceiptOutcome,
    RequestKind,
    RetrySubmission,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionReady,
    SubmissionRetryScheduled,
    WaitKind,
    WaitRequested,
)

__all__ = [
    "RETRY_BUDGET_EXHAUSTED",
    "RetryPolicy",
    "backoff_ms",
    "dead_letter_reason",
    "is_retry_wait",
    "retry_submission",
    "retry_wait_id_for",
    "schedule_retry",
]

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


def retry_submission(
    state: ConversationState,
    command: RetrySubmission,
    input_ref: InputRef,
    now: datetime,
    *,
    check_contract: bool = True,
) -> Decision:
    """Decide a `RetrySubmission` whose Ed25519 signature the caller has verified (issue 22 item 4).

    The worker verifies the signature against ``App.resolver_keys`` first, as for a `ResolveUnknown`, and answers an
    unsigned or forged command with `reject_command` (``unsigned``, ``unknown_key``, ``bad_signature``). Then, in
    order:

    * a command that breaks the input contract → ``invalid`` naming the field;
    * no such submission → ``unknown_target``;
    * the target was retried already → `SubmissionDuplicate` (the command's ``new_submission_id``, pointing at the
      first retry, with its key) and a duplicate receipt whose ``original_submission_id`` and ``submission_seq`` are
      the first retry's;
    * the target is not a dead letter (unsettled, completed, aborted, or failed with another error type) →
      ``not_dead_lettered`` naming its state or outcome;
    * ``new_submission_id`` already names a submission, or the command id is already an idempotency key of the dead
      letter's principal → ``invalid`` naming the field;
    * otherwise `SubmissionAdmitted` (``new_submission_id``, the next sequence, the dead letter's principal, input and
      offered tools, idempotency key = the command id, ``retry_of`` = the target; a flow turn's run as `admit` gives
      it: a resumed run again, else a new run minted for the new submission) + `SubmissionReady` + an applied
      receipt naming the new submission (``original_submission_id``) and its sequence: readiness and the receipt
      commit together (DUR-001). The dead letter's failed settlement stands.

    Args:
        state: The conversation's scratch state.
        command: The verified command.
        input_ref: Where it was read.
        now: The decision time.
        check_contract: Whether to check the input contract first; ``False`` only under the fault switch
            ``id_contract_unchecked``.

    Returns:
        The decision.

    Raises:
        WrongConversationError: If ``state`` is not the conversation that files this command (`filing_conversation`).
        InputAlreadyDecidedError: If ``input_ref`` is already decided.
    """
    violation = check_command(command) if check_contract else None
    if violation is not None:
        return reject_invalid(state, command, input_ref, now, violation)
    check_input_undecided(state, command.conversation_id, input_ref)

    def rejected(reason: CommandRejectReason, detail: str) -> Decision:
        return reject_command(state, command, input_ref, now, reason=reason, detail=detail)

    def receipt(outcome: ReceiptOutcome, original: str | None, seq: int, run_id: str | None) -> Receipt:
        return Receipt(
            request_kind=RequestKind.COMMAND,
            request_id=command.command_id,
            outcome=outcome,
            original_submission_id=original,
            submission_seq=seq,
            conversation_id=state.conversation_id,
            decided_at=now,
            run_id=run_id,
        )

    sub = state.submission(command.submission_id)
    if sub is None:
        return rejected(
            CommandRejectReason.UNKNOWN_TARGET,
            f"conversation {state.conversation_id!r} has no submission {command.submission_id!r}",
        )
    if sub.retried_as is not None:
        first = state.submissions[sub.retried_as]
        duplicate = SubmissionDuplicate(
            submission_id=command.new_submission_id,
            original_submission_id=first.submission_id,
            idempotency_key=first.idempotency_key,
            input_ref=input_ref,
        )
        return Decision(
            events=(duplicate,),
            receipt=receipt(ReceiptOutcome.DUPLICATE, first.submission_id, first.submission_seq, None),
        )
    if not sub.dead_lettered or sub.input_json is None:
        if sub.outcome is None:
            what = f"is {sub.state.value}, not settled"
        elif sub.error_type is not None:
            what = f"settled {sub.outcome.value} with error type {sub.error_type!r}"
        else:
            what = f"settled {sub.outcome.value}"
        return rejected(
            CommandRejectReason.NOT_DEAD_LETTERED,
            f"submission {sub.submission_id!r} {what}: only a dead letter (failed {RETRY_BUDGET_EXHAUSTED}) is retried",
        )
    if state.submission(command.new_submission_id) is not None:
        return rejected(
            CommandRejectReason.INVALID,
            f"new_submission_id {command.new_submission_id!r} already names a submission",
        )
    known = state.lookup_key(sub.principal, command.command_id)
    if known is not None:  # the command id is the new submission's key: it must be new in the principal's scope
        return rejected(
            CommandRejectReason.INVALID,
            f"command_id {command.command_id!r} is already the idempotency key of submission {known.submission_id!r}",
        )
    run_id = _retried_flow_run(state, sub.input_json, command.new_submission_id)
    seq = state.last_submission_seq + 1
    admitted = SubmissionAdmitted(
        submission_id=command.new_submission_id,
        conversation_id=state.conversation_id,
        principal=sub.principal,
        idempotency_key=command.command_id,
        payload_digest=sub.payload_digest,
        submission_seq=seq,
        tools_offered=sub.tools_offered,
        input_json=sub.input_json,
        input_ref=input_ref,
        flow_run_id=run_id,
        retry_of=sub.submission_id,
    )
    ready = SubmissionReady(submission_id=command.new_submission_id, submission_seq=seq)
    applied = receipt(ReceiptOutcome.APPLIED, command.new_submission_id, seq, run_id)
    return Decision(events=(admitted, ready), receipt=applied)


def _retried_flow_run(state: ConversationState, input_json: str, new_submission_id: str) -> str | None:
    """The flow run of a retried turn (issue 18), as `settled.protocol.admit` would give the payload under its new id.

    A turn that resumes a run resumes it again; one that opened a run (or an operator's restart) opens a new one,
    minted for the new submission; anything else has none.
    """
    try:
        flow = flow_invocation(input_json)
    except ValueError:
        return None  # never admitted as a flow turn
    if flow is None:
        return None
    if flow.run_id is not None and flow.operator != "restart" and flow.run_id in state.flow_runs:
        return flow.run_id
    return flow_run_id_for(state.conversation_id, new_submission_id)
