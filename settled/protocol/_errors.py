"""Typed errors of the pure core (docs/design.md §1b, §3).

Every error names what it is about (submission, conversation, states, event, epochs) so that a fencing or
ordering bug shows up as a precise error, never as silent corruption (docs/design.md §3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from settled._errors import ErrorCategory, SettledError

if TYPE_CHECKING:
    from settled.protocol._states import SubmissionState
    from settled.schemas import InputRef, SettlementOutcome

__all__ = [
    "IllegalTransitionError",
    "InputAlreadyDecidedError",
    "LogInconsistencyError",
    "ProtocolError",
    "StaleEpochError",
    "TerminalOutcomeConflictError",
    "UnknownSubmissionError",
    "WrongConversationError",
]


class ProtocolError(SettledError):
    """Base of every error raised by `settled.protocol`."""

    category = ErrorCategory.BROKEN_INVARIANT


class IllegalTransitionError(ProtocolError):
    """An event would move a submission along a path that is not an edge of the state table (docs/semantics.md §3).

    Raised by the fold for a canonical event the table does not allow, and by a decision asked to do something the
    submission's state does not allow.

    Attributes:
        submission_id: The submission.
        from_state: Its state before the event (`SubmissionState.PROPOSED` when the submission is not admitted).
        to_state: The state the event would lead to; None when the event changes no state but is not permitted in
            ``from_state`` (e.g. a tool record for a submission that is not running).
        event: The causing event's type name, e.g. ``"AttemptStarted"``.
        reason: Why, in words, with the rule it breaks (e.g. "DUR-005").
    """

    def __init__(
        self,
        submission_id: str,
        from_state: SubmissionState,
        to_state: SubmissionState | None,
        event: str,
        reason: str,
    ) -> None:
        target = "(no change)" if to_state is None else to_state.value
        super().__init__(
            f"illegal transition of submission {submission_id!r}: {from_state.value} -> {target} on {event}: {reason}"
        )
        self.submission_id = submission_id
        self.from_state = from_state
        self.to_state = to_state
        self.event = event
        self.reason = reason


class StaleEpochError(ProtocolError):
    """A batch's owner epoch is below the latest preceding `OwnershipClaimed` of its partition (docs/design.md §3).

    Raised by the fold (`settled.protocol.apply`) and by the partition owner replaying its log
    (`settled.processors.PartitionOwner`): a fencing bug, surfaced.

    Attributes:
        conversation_id: The batch's conversation.
        batch_epoch: The batch's owner epoch.
        claim_epoch: The latest claim's epoch before the batch.
        detail: What exactly was stale.
    """

    category = ErrorCategory.CONFLICT

    def __init__(self, conversation_id: str, batch_epoch: int, claim_epoch: int, detail: str) -> None:
        super().__init__(
            f"stale owner epoch in a batch of conversation {conversation_id!r}: batch epoch {batch_epoch}, "
            f"latest claim {claim_epoch}: {detail}"
        )
        self.conversation_id = conversation_id
        self.batch_epoch = batch_epoch
        self.claim_epoch = claim_epoch
        self.detail = detail


class LogInconsistencyError(ProtocolError):
    """A canonical event contradicts the folded state without being a state transition (docs/design.md §3, §4).

    Examples: an inbox input decided twice, an idempotency key admitted twice, a gap in the submission sequence,
    an attempt number that does not follow the attempt count.

    Attributes:
        conversation_id: The conversation.
        event: The event's type name.
        field: The event field at fault.
        value: Its value.
        reason: Why, with the rule it breaks.
    """

    def __init__(self, conversation_id: str, event: str, field: str, value: object, reason: str) -> None:
        super().__init__(f"inconsistent log in conversation {conversation_id!r}: {event}.{field}={value!r}: {reason}")
        self.conversation_id = conversation_id
        self.event = event
        self.field = field
        self.value = value
        self.reason = reason


class TerminalOutcomeConflictError(ProtocolError):
    """A second terminal outcome for a submission that has (or has reserved) one (docs/semantics.md §12, DUR-002/012).

    Attributes:
        submission_id: The submission.
        winning_outcome: The outcome already settled or reserved.
        attempted_outcome: The outcome that was asked for.
        settled: True when the winning outcome is settled, False when only reserved (Terminalizing).
    """

    category = ErrorCategory.CONFLICT

    def __init__(
        self,
        submission_id: str,
        winning_outcome: SettlementOutcome,
        attempted_outcome: SettlementOutcome,
        *,
        settled: bool,
    ) -> None:
        how = "settled" if settled else "reserved"
        super().__init__(
            f"submission {submission_id!r} already {how} {winning_outcome.value}; "
            f"{attempted_outcome.value} is rejected (docs/semantics.md §12: conflicting terminal outcomes are rejected)"
        )
        self.submission_id = submission_id
        self.winning_outcome = winning_outcome
        self.attempted_outcome = attempted_outcome
        self.settled = settled


class InputAlreadyDecidedError(ProtocolError):
    """A decision was asked for an inbox input whose decision is already canonical (docs/design.md §3).

    The caller must skip inputs for which `ConversationState.is_decided` is true.

    Attributes:
        input_ref: The input.
    """

    category = ErrorCategory.CONFLICT

    def __init__(self, input_ref: InputRef) -> None:
        super().__init__(
            f"inbox input {input_ref.topic}[{input_ref.partition}]@{input_ref.offset} is already decided; "
            "a re-read input must be skipped (docs/design.md §3)"
        )
        self.input_ref = input_ref


class UnknownSubmissionError(ProtocolError):
    """A worker-side decision (start, terminalize, interrupt) named a submission the conversation does not hold.

    Attributes:
        conversation_id: The conversation.
        submission_id: The unknown id.
    """

    category = ErrorCategory.NOT_FOUND

    def __init__(self, conversation_id: str, submission_id: str) -> None:
        super().__init__(f"conversation {conversation_id!r} holds no submission {submission_id!r}")
        self.conversation_id = conversation_id
        self.submission_id = submission_id


class WrongConversationError(ProtocolError):
    """An input was handed to the state of another conversation (a routing bug in the caller).

    Attributes:
        expected: The state's conversation id.
        got: The input's conversation id.
    """

    category = ErrorCategory.BAD_INPUT

    def __init__(self, expected: str, got: str) -> None:
        super().__init__(f"input for conversation {got!r} handed to the state of conversation {expected!r}")
        self.expected = expected
        self.got = got
