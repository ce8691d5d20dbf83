"""Typed errors of the BFCL workload (issue 8): each names the entry, call, conversation or key it is about."""

from __future__ import annotations

__all__ = [
    "BfclError",
    "BfclVersionError",
    "CallParseError",
    "ConversationConflictError",
    "CorpusError",
    "IdempotencyConflictError",
    "StaleEpochError",
    "ToolServerError",
    "ToolServerProcessError",
    "UnknownConversationError",
    "UnknownMethodError",
]


class BfclError(Exception):
    """Base class of every error raised by ``settled_bfcl``."""


class BfclVersionError(BfclError):
    """The installed ``bfcl-eval`` is missing or is not the pinned version (the corpus counts depend on it)."""


class CorpusError(BfclError):
    """A corpus file or entry does not have the shape this loader knows (names the file, entry and field)."""


class CallParseError(CorpusError):
    """A ground-truth call string could not be turned into a method name and JSON arguments.

    Attributes:
        entry_id: The BFCL entry the call belongs to.
        source: The call string as written in the corpus.
        reason: What is wrong with it.
    """

    def __init__(self, entry_id: str, source: str, reason: str) -> None:
        super().__init__(f"entry {entry_id!r}: cannot parse ground-truth call {source!r}: {reason}")
        self.entry_id = entry_id
        self.source = source
        self.reason = reason


class UnknownMethodError(BfclError):
    """A method name is not a public method of any backend class involved in the world."""


class ToolServerError(BfclError):
    """The tool server answered with an error; ``code`` is its machine-readable error code.

    Attributes:
        code: The ``error`` field of the server's answer, e.g. ``"stale_epoch"``.
        status_code: The HTTP status of the answer.
        detail: The human-readable explanation.
    """

    def __init__(self, code: str, status_code: int, detail: str) -> None:
        super().__init__(f"{code} (HTTP {status_code}): {detail}")
        self.code = code
        self.status_code = status_code
        self.detail = detail


class UnknownConversationError(ToolServerError):
    """The tool server has no world for the conversation (create it first)."""


class ConversationConflictError(ToolServerError):
    """A conversation id was created again with a different entry, config or class list."""


class IdempotencyConflictError(ToolServerError):
    """An idempotency key was reused with a different method or different arguments; nothing was executed."""


class StaleEpochError(ToolServerError):
    """A call carried an owner epoch lower than one the tool server already saw for the conversation."""


class ToolServerProcessError(BfclError):
    """The tool-server process could not be started or stopped (the message carries the tail of its log)."""
