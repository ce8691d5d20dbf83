"""Errors agent code and tools see (issue 6; docs/design.md §5)."""

from __future__ import annotations

from settled._errors import ErrorCategory, SettledError
from settled.processors import RunFailedError

__all__ = [
    "APPROVAL_DENIED",
    "ReplayDivergenceError",
    "RunCancelledError",
    "RunSuspended",
    "ToolApprovalDeniedError",
    "ToolCallError",
    "ToolRefusedError",
    "ToolTransportError",
    "ToolUnavailableError",
    "UnknownToolError",
    "UnsafeReplayError",
    "UnsafeToolsError",
    "WaitExpiredError",
]


#: The error type of a denied call (`ToolApprovalDeniedError`), and the reason prefix of a ``ToolCallRefused`` that
#: records a denial by a tool's approval policy.
APPROVAL_DENIED = "approval_denied"


class ReplayDivergenceError(RunFailedError):
    """On re-entry the agent asked for another effect (or payload) than the one recorded at this ordinal.

    The run's code changed under a recorded run, or it is not deterministic between effects. Not retryable: the
    submission settles failed with this error (a new attempt would diverge the same way).

    Attributes:
        ordinal: The callsite ordinal within the run.
        expected: The recorded effect, described.
        actual: The effect the code asked for, described.
    """

    category = ErrorCategory.BROKEN_INVARIANT

    def __init__(self, ordinal: int, expected: str, actual: str) -> None:
        super().__init__(
            "ReplayDivergenceError",
            f"replay diverged at ordinal {ordinal}: the log records {expected}, the code asked for {actual}",
            non_retryable=True,
        )
        self.ordinal = ordinal
        self.expected = expected
        self.actual = actual


class UnsafeReplayError(RunFailedError):
    """A prepared call without a result that no recovery decision or resolution declared safe to run again.

    The runtime never re-runs such a call on its own (DUR-009); reaching this means recovery resumed a run that
    it should have marked Unknown. Not retryable.

    Attributes:
        call_id: The call.
    """

    category = ErrorCategory.BROKEN_INVARIANT

    def __init__(self, call_id: str, tool: str) -> None:
        super().__init__(
            "UnsafeReplayError",
            f"call {call_id!r} of tool {tool!r} was prepared and never settled, and nothing declared it safe to run "
            "again (no safe_retry/reconcile decision, no safe_to_retry resolution): refusing to re-run it (DUR-009)",
            non_retryable=True,
        )
        self.call_id = call_id


class ToolCallError(SettledError):
    """A tool's recorded application error: raised on the live call and re-raised identically on every replay.

    Attributes:
        tool: The tool's name.
        call_id: The call.
        error_type: The error's type name as recorded (e.g. the tool's exception class name).
        message: The recorded message.
        non_retryable: Whether the tool said retrying cannot help.
    """

    category = ErrorCategory.REJECTED

    def __init__(self, tool: str, call_id: str, error_type: str, message: str, *, non_retryable: bool = False) -> None:
        super().__init__(f"tool {tool!r} (call {call_id}) failed: {error_type}: {message}")
        self.tool = tool
        self.call_id = call_id
        self.error_type = error_type
        self.message = message
        self.non_retryable = non_retryable


class ToolRefusedError(ToolCallError):
    """A call to a tool that was not offered for the turn; recorded as ``ToolCallRefused``; nothing ran."""


class UnknownToolError(SettledError, LookupError):
    """Agent code called a tool name that the app has not registered."""

    category = ErrorCategory.BAD_INPUT


class ToolTransportError(SettledError):
    """Raised by a tool whose call got no answer (connection refused, reset, lost): the outcome is in doubt.

    The runtime also treats `ConnectionError` and `TimeoutError` as in doubt; wrap other clients' transport errors
    (e.g. ``httpx.TransportError``) in this. Never recorded as a result (docs/design.md §5).
    """

    category = ErrorCategory.OUTCOME_UNKNOWN


class ToolUnavailableError(SettledError):
    """An idempotent (or reconcilable) call stayed in doubt past its retry budget in this attempt.

    The attempt ends with the call prepared; recovery retries it under the same key in the next attempt.
    """

    category = ErrorCategory.UNAVAILABLE


class RunSuspended(BaseException):
    """Ends a run whose call became Unknown (DUR-009), or that waits (issue 16): it holds no worker meanwhile.

    A `BaseException`, so agent code's ``except Exception`` does not swallow it.
    """


class WaitExpiredError(SettledError):
    """A wait's deadline passed before a delivery (issue 16): raised by ``ctx.signal``, live and on every replay.

    Agent code may catch it; uncaught, it ends the attempt like any error.

    Attributes:
        kind: What was waited for (``"signal"``).
        name: The signal's name.
        wait_id: The wait.
    """

    category = ErrorCategory.PENDING

    def __init__(self, kind: str, name: str, wait_id: str) -> None:
        super().__init__(f"{kind} {name!r} (wait {wait_id}) expired at its deadline before a delivery")
        self.kind = kind
        self.name = name
        self.wait_id = wait_id


class ToolApprovalDeniedError(RunFailedError):
    """A call of a tool that needs approval was denied (issue 16 item 5): by a person, by expiry, or by its policy.

    Raised by ``ctx.tool`` live and identically on every replay; the tool never ran. A denial is not a malfunction:
    action code may catch it and go on (the model-driven agent hands the model a structured denial instead, see
    `settled.runtime.denial_result`). Uncaught, it is not retryable: the submission settles failed at once with
    error type ``approval_denied``, charged no further attempt.

    Attributes:
        tool: The tool's name.
        call_id: The call.
        by: Who denied it: the signing key id of the approver, ``"policy"`` for the tool's approval policy, or None
            for an approval that expired at its deadline.
        reason: Why (the approver's reason, ``"deadline_expired"``, or the policy's), or None.
    """

    category = ErrorCategory.REJECTED

    def __init__(self, tool: str, call_id: str, by: str | None, reason: str | None) -> None:
        who = "nobody before its deadline" if by is None else by
        why = "" if reason is None else f": {reason}"
        super().__init__(APPROVAL_DENIED, f"call {call_id} of tool {tool!r} was denied by {who}{why}")
        self.tool = tool
        self.call_id = call_id
        self.by = by
        self.reason = reason


class RunCancelledError(SettledError):
    """The run was cancelled (an abort became canonical, or the attempt was superseded)."""

    category = ErrorCategory.CONFLICT


class UnsafeToolsError(SettledError, ValueError):
    """A registered tool is neither idempotent nor reconcilable and no resolver key is configured (DUR-017)."""

    category = ErrorCategory.BAD_INPUT
