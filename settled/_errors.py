"""settled's error root: every error settled raises is a `SettledError` with a category.

The category says what the caller can do about it — send again, fix the input, wait, look for the other actor — so
the command line maps it to an exit code with one table lookup (`EXIT_CODES`, `exit_code`), and a future HTTP front
end to a status the same way, instead of ladders of ``except`` clauses. Each class keeps its standard-library base
where callers rely on it (``ValueError`` for bad input, ``TimeoutError`` for waits that ran out).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import ClassVar, Final

__all__ = ["EXIT_CODES", "BadInputError", "ErrorCategory", "SettledError", "exit_code"]


class ErrorCategory(StrEnum):
    """What went wrong, from the caller's side.

    Attributes:
        REJECTED: The owner decided against the request (a duplicate key with another payload, an abort too late, a
            tool not offered); the decision is final and recorded.
        OUTCOME_UNKNOWN: The request may or may not have been applied (no reply in time); send it again with the
            same idempotency key or command id.
        UNAVAILABLE: A service (Kafka, PostgreSQL, a tool, a model) did not answer; nothing is pending.
        BAD_INPUT: The request, a record or the configuration is malformed; the message names the field and value.
        CONFLICT: Another actor holds or already decided it (a newer owner epoch, a rebuild in progress, another
            terminal outcome).
        NOT_FOUND: Nothing is known under that id.
        PENDING: Accepted, but not done yet within the wait (no settlement yet, not projected yet); wait again.
        BROKEN_INVARIANT: The log or the code broke one of settled's invariants (a chain break, an illegal
            transition): a bug or a corrupted log, never retried silently.
    """

    REJECTED = "rejected"
    OUTCOME_UNKNOWN = "outcome_unknown"
    UNAVAILABLE = "unavailable"
    BAD_INPUT = "bad_input"
    CONFLICT = "conflict"
    NOT_FOUND = "not_found"
    PENDING = "pending"
    BROKEN_INVARIANT = "broken_invariant"


#: The command line's exit code per category (README "Operating": 1 rejected, 2 bad input or no broker, 3 outcome
#: unknown — send again —, and a rebuild or check already running exits 3; ``--wait`` without a settlement in time 4).
EXIT_CODES: Final[Mapping[ErrorCategory, int]] = {
    ErrorCategory.REJECTED: 1,
    ErrorCategory.NOT_FOUND: 1,
    ErrorCategory.BROKEN_INVARIANT: 1,
    ErrorCategory.BAD_INPUT: 2,
    ErrorCategory.UNAVAILABLE: 2,
    ErrorCategory.OUTCOME_UNKNOWN: 3,
    ErrorCategory.CONFLICT: 3,
    ErrorCategory.PENDING: 4,
}


class SettledError(Exception):
    """Base of every error settled raises; each subclass sets `category`.

    Attributes:
        category: What the caller can do about it (`ErrorCategory`), a class attribute.
    """

    category: ClassVar[ErrorCategory]


class BadInputError(SettledError, ValueError):
    """A request, an option or a setting is malformed; the message names the field and the value."""

    category = ErrorCategory.BAD_INPUT


def exit_code(error: SettledError) -> int:
    """Return the command line's exit code for ``error``.

    Args:
        error: The error.

    Returns:
        ``EXIT_CODES[error.category]``.
    """
    return EXIT_CODES[error.category]
