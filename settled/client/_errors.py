"""The client's typed errors (docs/design.md §4; issue 5 item 8).

Every error says what is known about the request: `SubmissionOutcomeUnknownError` is raised only when the proposal
may have reached the inbox and no receipt was read in time (never a false success, never a false failure);
`BrokerUnavailableError` and `PayloadTooLargeError` only when nothing was produced.
"""

from __future__ import annotations

from settled._errors import ErrorCategory, SettledError
from settled.schemas import Receipt

__all__ = [
    "AbortOutcomeUnknownError",
    "AbortRejectedError",
    "AccessOutcomeUnknownError",
    "AccessRejectedError",
    "ApprovalOutcomeUnknownError",
    "ApprovalRejectedError",
    "BrokerUnavailableError",
    "ClientError",
    "CommandOutcomeUnknownError",
    "CommandRejectedError",
    "IdempotencyConflictError",
    "InboxProduceError",
    "LaneOutcomeUnknownError",
    "LaneRejectedError",
    "OutcomeUnknownError",
    "PayloadTooLargeError",
    "ResolveOutcomeUnknownError",
    "ResolveRejectedError",
    "RetryOutcomeUnknownError",
    "RetryRejectedError",
    "SettlementTimeoutError",
    "SignalOutcomeUnknownError",
    "SignalRejectedError",
    "SigningKeyError",
    "SteerOutcomeUnknownError",
    "SteerRejectedError",
    "SubmissionOutcomeUnknownError",
    "SubmissionRejectedError",
    "UnexpectedReceiptError",
    "reason_parts",
]


def reason_parts(reason: str | None) -> tuple[str, str]:
    """Split a receipt's ``reason`` (``"<code>: <detail>"``, docs/design.md §4) into its code and detail.

    Args:
        reason: The receipt's ``reason``, or ``None``.

    Returns:
        ``(code, detail)``; ``("", "")`` for ``None``, ``(reason, "")`` when there is no ``": "``.
    """
    if not reason:
        return "", ""
    code, _, detail = reason.partition(":")
    return code.strip(), detail.strip()


#: The offending field a submission rejection code implies, where the code alone names it (docs/design.md §4).
_FIELD_OF_CODE = {
    "idempotency_conflict": "idempotency_key",
    "digest_mismatch": "payload_digest",
    "misrouted": "conversation_id",
    "unknown_target": "run_id",
}


class ClientError(SettledError):
    """Base of every error `settled.client` raises."""

    category = ErrorCategory.UNAVAILABLE


class SubmissionRejectedError(ClientError):
    """The owner rejected the submission (receipt outcome ``rejected``; docs/design.md §4).

    Attributes:
        receipt: The rejection receipt.
        reason_code: The reason code, e.g. ``"invalid"`` or ``"misrouted"``.
        detail: The owner's detail, naming the field or key.
        field: The offending field when the code implies it (``idempotency_conflict`` → ``idempotency_key``,
            ``digest_mismatch`` → ``payload_digest``, ``misrouted`` → ``conversation_id``, ``unknown_target`` →
            ``run_id``), else ``None``: the
            receipt schema carries no field of its own, the detail names it.
    """

    category = ErrorCategory.REJECTED

    def __init__(self, receipt: Receipt) -> None:
        """Build the error from its receipt.

        Args:
            receipt: The rejection receipt.
        """
        self.receipt = receipt
        self.reason_code, self.detail = reason_parts(receipt.reason)
        self.field = _FIELD_OF_CODE.get(self.reason_code)
        super().__init__(
            f"submission {receipt.request_id} to conversation {receipt.conversation_id!r} was rejected: "
            f"{self.reason_code or 'no reason given'}"
            + (f" (field {self.field})" if self.field else "")
            + (f": {self.detail}" if self.detail else "")
        )


class IdempotencyConflictError(SubmissionRejectedError):
    """The idempotency key was admitted earlier with another payload (``idempotency_conflict``, docs/design.md §4)."""


class OutcomeUnknownError(ClientError, TimeoutError):
    """No reply was read within the deadline, and the request may have reached the inbox."""

    category = ErrorCategory.OUTCOME_UNKNOWN


class SubmissionOutcomeUnknownError(OutcomeUnknownError):
    """No receipt was read within ``submit()``'s deadline: the submission may or may not be admitted.

    See docs/design.md §4.

    Attributes:
        idempotency_key: The key to submit again with.
        conversation_id: The conversation.
        submission_id: The id of the proposal that timed out.
        timeout_s: The deadline that passed, in seconds.
    """

    def __init__(self, idempotency_key: str, conversation_id: str, submission_id: str, timeout_s: float) -> None:
        """Build the error.

        Args:
            idempotency_key: The key to submit again with.
            conversation_id: The conversation.
            submission_id: The id of the proposal that timed out.
            timeout_s: The deadline that passed, in seconds.
        """
        self.idempotency_key = idempotency_key
        self.conversation_id = conversation_id
        self.submission_id = submission_id
        self.timeout_s = timeout_s
        super().__init__(
            f"no receipt within {timeout_s:g} s for submission {submission_id} to conversation {conversation_id!r} "
            f"with idempotency key {idempotency_key!r}: its outcome is unknown (it may or may not be admitted). "
            f"Submitting again with the same idempotency key {idempotency_key!r} and the same payload returns the "
            "original receipt if it was admitted, and admits it once if it was not."
        )


class CommandOutcomeUnknownError(OutcomeUnknownError):
    """No reply to an inbox command (an abort, a resolution) was read within the deadline (docs/design.md §4).

    Sending the command again with the same command id is safe: the owner answers a command id it already applied
    as a duplicate (DUR-012).

    Attributes:
        command_id: The command id to send the command again with.
        conversation_id: The conversation.
        submission_id: The submission the command targets.
        timeout_s: The deadline that passed, in seconds.
    """

    #: What the command is called in messages ("abort", "resolution").
    command_name = "command"

    def __init__(
        self, command_id: str, conversation_id: str, submission_id: str, timeout_s: float, *, target: str = ""
    ) -> None:
        """Build the error.

        Args:
            command_id: The command id to send the command again with.
            conversation_id: The conversation.
            submission_id: The submission the command targets.
            timeout_s: The deadline that passed, in seconds.
            target: What the command targets, for the message (default: ``"submission <id>"``).
        """
        self.command_id = command_id
        self.conversation_id = conversation_id
        self.submission_id = submission_id
        self.timeout_s = timeout_s
        what = self.command_name
        super().__init__(
            f"no reply within {timeout_s:g} s to {what} command {command_id} for "
            f"{target or f'submission {submission_id}'} of conversation {conversation_id!r}: its outcome is unknown. "
            f"Sending the {what} again with the same command id {command_id!r} is answered as a duplicate if the "
            "first one was applied."
        )


class AbortOutcomeUnknownError(CommandOutcomeUnknownError):
    """No reply to an abort was read within the deadline (DUR-012).

    Attributes:
        command_id: The command id to send the abort again with.
        conversation_id: The conversation.
        submission_id: The submission to abort.
        timeout_s: The deadline that passed, in seconds.
    """

    command_name = "abort"


class ResolveOutcomeUnknownError(CommandOutcomeUnknownError):
    """No reply to a `ResolveUnknown` was read within the deadline (DUR-009, docs/design.md §5).

    ``Client.resolve_unknown(..., command_id=err.command_id)`` sends it again; a resolution already applied is
    answered as a duplicate.

    Attributes:
        command_id: The command id to send the resolution again with.
        conversation_id: The conversation.
        submission_id: The submission whose call is Unknown.
        call_id: The Unknown call.
        timeout_s: The deadline that passed, in seconds.
    """

    command_name = "resolution"

    def __init__(
        self, command_id: str, conversation_id: str, submission_id: str, call_id: str, timeout_s: float
    ) -> None:
        """Build the error.

        Args:
            command_id: The command id to send the resolution again with.
            conversation_id: The conversation.
            submission_id: The submission whose call is Unknown.
            call_id: The Unknown call.
            timeout_s: The deadline that passed, in seconds.
        """
        self.call_id = call_id
        super().__init__(
            command_id,
            conversation_id,
            submission_id,
            timeout_s,
            target=f"call {call_id} of submission {submission_id}",
        )


class RetryOutcomeUnknownError(CommandOutcomeUnknownError):
    """No reply to a `RetrySubmission` was read within the deadline (issue 22 item 4).

    ``Client.retry_submission(..., command_id=err.command_id)`` sends it again; a retry already applied is answered
    as a duplicate pointing at the submission it admitted.

    Attributes:
        command_id: The command id to send the retry again with.
        conversation_id: The conversation.
        submission_id: The dead letter to retry.
        timeout_s: The deadline that passed, in seconds.
    """

    command_name = "retry"


class CommandRejectedError(ClientError):
    """The owner rejected an inbox command (receipt outcome ``rejected``, request kind ``command``; docs/design.md §4).

    Attributes:
        receipt: The rejection receipt (request kind ``command``).
        reason_code: The reason code (e.g. ``unknown_target``, ``already_terminal``, ``not_unknown``,
            ``unsigned``, ``unknown_key``, ``bad_signature``).
        detail: The owner's detail.
    """

    category = ErrorCategory.REJECTED

    #: What the command is called in messages ("abort", "resolution").
    command_name = "command"

    def __init__(self, receipt: Receipt) -> None:
        """Build the error from its receipt.

        Args:
            receipt: The rejection receipt.
        """
        self.receipt = receipt
        self.reason_code, self.detail = reason_parts(receipt.reason)
        super().__init__(
            f"{self.command_name} command {receipt.request_id} in conversation {receipt.conversation_id!r} was "
            f"rejected: {self.reason_code or 'no reason given'}" + (f": {self.detail}" if self.detail else "")
        )


class SignalRejectedError(CommandRejectedError):
    """The owner rejected a signal (issue 16): ``unknown_target`` (no such run) or ``already_terminal`` (settled).

    Attributes:
        receipt: The rejection receipt (request kind ``command``).
        reason_code: The reason code.
        detail: The owner's detail.
    """

    command_name = "signal"


class SignalOutcomeUnknownError(CommandOutcomeUnknownError):
    """No reply to a signal was read within the deadline (issue 16).

    ``Client.signal(..., signal_id=err.command_id)`` sends it again; a signal already accepted is answered as a
    duplicate.

    Attributes:
        command_id: The signal id to send it again with.
        conversation_id: The conversation.
        submission_id: The run.
        timeout_s: The deadline that passed, in seconds.
    """

    command_name = "signal"


class SteerRejectedError(CommandRejectedError):
    """The owner rejected a steering message (issue 22 item 3).

    Reasons: ``unknown_target`` (no such run), ``already_terminal`` (the run settled first: the detail names its
    outcome) or ``invalid``.

    Attributes:
        receipt: The rejection receipt (request kind ``command``).
        reason_code: The reason code.
        detail: The owner's detail.
    """

    command_name = "steer"


class SteerOutcomeUnknownError(CommandOutcomeUnknownError):
    """No reply to a steering message was read within the deadline (issue 22 item 3).

    ``Client.steer(..., command_id=err.command_id)`` sends it again; one already accepted is answered as a
    duplicate and stays in the run's steering stream once.

    Attributes:
        command_id: The command id to send it again with.
        conversation_id: The conversation.
        submission_id: The run.
        timeout_s: The deadline that passed, in seconds.
    """

    command_name = "steer"


class ApprovalRejectedError(CommandRejectedError):
    """The owner rejected an approval decision (issue 16): the wait stays open.

    Reasons: ``unsigned``, ``unknown_key``, ``bad_signature`` (not signed by a key in ``App.approver_keys``);
    ``other_run``, ``unknown_target`` (no such approval of that run); ``stale`` (already decided or expired);
    ``digest_mismatch`` (bound to other arguments); ``already_terminal``; ``invalid``.

    Attributes:
        receipt: The rejection receipt (request kind ``command``).
        reason_code: The reason code.
        detail: The owner's detail.
    """

    command_name = "approval"


class ApprovalOutcomeUnknownError(CommandOutcomeUnknownError):
    """No reply to an approval decision was read within the deadline (issue 16).

    ``Client.approve|deny(..., command_id=err.command_id)`` sends it again; one already applied is answered as a
    duplicate.

    Attributes:
        command_id: The command id to send it again with.
        conversation_id: The conversation.
        submission_id: The run.
        timeout_s: The deadline that passed, in seconds.
    """

    command_name = "approval"


class AbortRejectedError(CommandRejectedError):
    """The owner rejected an abort (e.g. ``unknown_target``, or ``already_terminal`` naming the outcome that won).

    Attributes:
        receipt: The rejection receipt (request kind ``command``).
        reason_code: The reason code.
        detail: The owner's detail (for ``already_terminal``, the winning outcome).
    """

    command_name = "abort"


class ResolveRejectedError(CommandRejectedError):
    """The owner rejected a `ResolveUnknown` (DUR-009, docs/design.md §4, §5).

    Reason codes the worker uses: ``unsigned``, ``unknown_key`` (a key id not among the workers' resolver keys),
    ``bad_signature`` (it does not verify with that key), ``not_unknown`` (the call is not Unknown),
    ``unknown_target`` (no such submission), ``already_terminal`` (the submission settled first), ``invalid`` (the
    command id was applied to another submission).

    Attributes:
        receipt: The rejection receipt (request kind ``command``).
        reason_code: The reason code.
        detail: The owner's detail.
    """

    command_name = "resolution"


class RetryRejectedError(CommandRejectedError):
    """The owner rejected a `RetrySubmission` (issue 22 item 4).

    Reason codes: ``unsigned``, ``unknown_key``, ``bad_signature`` (as for a resolution: the workers'
    ``App.resolver_keys``), ``unknown_target`` (no such submission), ``not_dead_lettered`` (it is unsettled,
    completed, aborted, or failed with another error type than ``retry_budget_exhausted``), ``invalid`` (the new
    submission id or the command id is taken, or a field breaks the input contract).

    Attributes:
        receipt: The rejection receipt (request kind ``command``).
        reason_code: The reason code.
        detail: The owner's detail.
    """

    command_name = "retry"


class AccessRejectedError(CommandRejectedError):
    """The owner rejected a grant or revocation of access (issue 20).

    Reasons: ``unknown_target`` (no such conversation, or a revoked principal holding no grant), ``invalid`` (the
    grantee is the opener), ``unauthorized`` (a signed record of a principal that is not its opener).

    Attributes:
        receipt: The rejection receipt (request kind ``command``).
        reason_code: The reason code.
        detail: The owner's detail.
    """

    command_name = "access"


class AccessOutcomeUnknownError(CommandOutcomeUnknownError):
    """No reply to a grant or revocation of access was read within the deadline (issue 20).

    ``Client.grant_access(..., command_id=err.command_id)`` (or ``revoke_access``) sends it again; one already applied
    is answered as a duplicate.

    Attributes:
        command_id: The command id to send it again with.
        conversation_id: The conversation.
        submission_id: Empty (an access command names a principal, not a submission).
        grantee: The principal whose access it changes.
        timeout_s: The deadline that passed, in seconds.
    """

    command_name = "access"

    def __init__(self, command_id: str, conversation_id: str, grantee: str, timeout_s: float) -> None:
        """Build the error.

        Args:
            command_id: The command id to send it again with.
            conversation_id: The conversation.
            grantee: The principal whose access it changes.
            timeout_s: The deadline that passed, in seconds.
        """
        self.grantee = grantee
        super().__init__(command_id, conversation_id, "", timeout_s, target=f"the access of principal {grantee!r}")


class LaneRejectedError(CommandRejectedError):
    """The owner rejected a change of a conversation's lane policy (issue 22 item 1).

    Reasons: ``unknown_target`` (no such conversation: its opening submission chooses its first lane),
    ``unauthorized`` (the principal neither opened it nor holds an ``act`` grant), ``invalid`` (the command id was
    applied to something else).

    Attributes:
        receipt: The rejection receipt (request kind ``command``).
        reason_code: The reason code.
        detail: The owner's detail.
    """

    command_name = "lane"


class LaneOutcomeUnknownError(CommandOutcomeUnknownError):
    """No reply to a change of a conversation's lane policy was read within the deadline (issue 22 item 1).

    ``Client.set_lane(..., command_id=err.command_id)`` sends it again; one already applied is answered as a
    duplicate.

    Attributes:
        command_id: The command id to send it again with.
        conversation_id: The conversation.
        submission_id: Empty (a lane command names no submission).
        timeout_s: The deadline that passed, in seconds.
    """

    command_name = "lane"

    def __init__(self, command_id: str, conversation_id: str, timeout_s: float) -> None:
        """Build the error.

        Args:
            command_id: The command id to send it again with.
            conversation_id: The conversation.
            timeout_s: The deadline that passed, in seconds.
        """
        super().__init__(command_id, conversation_id, "", timeout_s, target="the lane policy")


class SigningKeyError(ClientError, ValueError):
    """A resolver signing key file cannot be read or is not an Ed25519 private key (docs/design.md §4).

    Attributes:
        path: The key file.
    """

    category = ErrorCategory.BAD_INPUT

    def __init__(self, path: str, problem: str) -> None:
        """Build the error.

        Args:
            path: The key file.
            problem: What is wrong with it.
        """
        self.path = path
        super().__init__(f"signing key file {path!r}: {problem}")


class UnexpectedReceiptError(ClientError):
    """A receipt whose outcome does not answer its request kind (e.g. ``applied`` for a submission).

    Attributes:
        receipt: The receipt.
    """

    category = ErrorCategory.BROKEN_INVARIANT

    def __init__(self, receipt: Receipt) -> None:
        """Build the error.

        Args:
            receipt: The receipt.
        """
        self.receipt = receipt
        super().__init__(
            f"receipt for {receipt.request_kind.value} {receipt.request_id} has outcome {receipt.outcome.value!r}, "
            "which does not answer that kind of request"
        )


class PayloadTooLargeError(ClientError, ValueError):
    """The encoded record exceeds the inbox's hard size limit; nothing was produced (docs/design.md §4).

    Attributes:
        size_bytes: The encoded record's size.
        limit_bytes: The limit.
    """

    category = ErrorCategory.BAD_INPUT

    def __init__(self, conversation_id: str, size_bytes: int, limit_bytes: int, *, request: str = "submission") -> None:
        """Build the error.

        Args:
            conversation_id: The conversation.
            size_bytes: The encoded record's size.
            limit_bytes: The limit.
            request: What was refused, for the message (``"submission"``, ``"resolution"``).
        """
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes
        record = "proposal" if request == "submission" else "command"
        super().__init__(
            f"{request} to conversation {conversation_id!r} refused before producing: the encoded {record} is "
            f"{size_bytes} bytes, over the inbox limit of {limit_bytes} bytes (max_payload_bytes); nothing was sent"
        )


class BrokerUnavailableError(ClientError):
    """Kafka could not be reached before anything was produced; the request was not sent."""

    category = ErrorCategory.UNAVAILABLE


class InboxProduceError(ClientError):
    """The broker refused the record on every try with a permanent error (e.g. a topic limit below the client's).

    Attributes:
        request_id: The submission or command id.
        error: The last Kafka error, as text.
    """

    category = ErrorCategory.UNAVAILABLE

    def __init__(self, request_id: str, conversation_id: str, error: str, tries: int) -> None:
        """Build the error.

        Args:
            request_id: The submission or command id.
            conversation_id: The conversation.
            error: The last Kafka error, as text.
            tries: How many times it was produced.
        """
        self.request_id = request_id
        self.error = error
        super().__init__(
            f"the inbox refused request {request_id} of conversation {conversation_id!r} {tries} times: {error}"
        )


class SettlementTimeoutError(ClientError, TimeoutError):
    """No settlement for the submission was read within ``wait()``'s deadline (docs/design.md §4).

    Attributes:
        submission_id: The submission waited for.
        conversation_id: Its conversation.
        timeout_s: The deadline that passed, in seconds.
    """

    category = ErrorCategory.PENDING

    def __init__(self, submission_id: str, conversation_id: str, topic: str, partition: int, timeout_s: float) -> None:
        """Build the error.

        Args:
            submission_id: The submission waited for.
            conversation_id: Its conversation.
            topic: The settlements topic read.
            partition: The partition read.
            timeout_s: The deadline that passed, in seconds.
        """
        self.submission_id = submission_id
        self.conversation_id = conversation_id
        self.timeout_s = timeout_s
        super().__init__(
            f"no settlement of submission {submission_id} (conversation {conversation_id!r}) on {topic}[{partition}] "
            f"within {timeout_s:g} s; it may still be running: wait again"
        )
