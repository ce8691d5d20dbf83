"""Errors as RFC 9457 problem details (``application/problem+json``), one status per `ErrorCategory`.

Every error the API answers with is a `ProblemError`: ``type`` (a stable URN per kind), ``title``, ``status``,
``detail`` (the message, naming the field and the value), and where known the extension members ``category`` (the
`settled.ErrorCategory`), ``field``, ``value``, ``idempotency_key`` / ``command_id`` (what to send again with) and
``receipt`` (a rejection's receipt: a command's rejection is still its answer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from fastapi.responses import JSONResponse

from settled._errors import ErrorCategory, SettledError

__all__ = ["PROBLEM_MEDIA_TYPE", "STATUS_OF_CATEGORY", "ProblemError", "problem_of_error"]

PROBLEM_MEDIA_TYPE: Final = "application/problem+json"

#: The HTTP status of each error category (the HTTP counterpart of `settled.EXIT_CODES`).
STATUS_OF_CATEGORY: Final[Mapping[ErrorCategory, int]] = {
    ErrorCategory.REJECTED: 409,
    ErrorCategory.CONFLICT: 409,
    ErrorCategory.OUTCOME_UNKNOWN: 504,
    ErrorCategory.UNAVAILABLE: 503,
    ErrorCategory.BAD_INPUT: 422,
    ErrorCategory.NOT_FOUND: 404,
    ErrorCategory.PENDING: 503,
    ErrorCategory.BROKEN_INVARIANT: 500,
}

_TITLES: Final[Mapping[ErrorCategory, str]] = {
    ErrorCategory.REJECTED: "Rejected",
    ErrorCategory.CONFLICT: "Conflict",
    ErrorCategory.OUTCOME_UNKNOWN: "Outcome unknown",
    ErrorCategory.UNAVAILABLE: "Service unavailable",
    ErrorCategory.BAD_INPUT: "Bad input",
    ErrorCategory.NOT_FOUND: "Not found",
    ErrorCategory.PENDING: "Not done yet",
    ErrorCategory.BROKEN_INVARIANT: "Broken invariant",
}


class ProblemError(SettledError):
    """An error answered as an RFC 9457 problem detail.

    The class's `category` is a default for the error taxonomy; each problem's own is `problem_category`.

    Attributes:
        problem_category: What went wrong from the caller's side (gives the default status, kind and title).
        status: The HTTP status.
        kind: The last part of the ``type`` URN (``urn:settled:problem:<kind>``).
        title: A short, fixed summary of the kind.
        detail: The explanation, naming the field and the value.
        extensions: Further members (``field``, ``value``, ``idempotency_key``, ``receipt``, ...).
        headers: Response headers (``WWW-Authenticate``, ``Retry-After``).
    """

    category = ErrorCategory.BAD_INPUT

    def __init__(
        self,
        category: ErrorCategory,
        detail: str,
        *,
        kind: str | None = None,
        status: int | None = None,
        title: str | None = None,
        headers: Mapping[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        """Build a problem.

        Args:
            category: What went wrong from the caller's side; gives the default status, kind and title.
            detail: The explanation, naming the field and the value.
            kind: The ``type`` URN's last part (default: the category).
            status: The HTTP status (default: `STATUS_OF_CATEGORY`).
            title: The title (default: the category's).
            headers: Response headers.
            **extensions: Further members; ``None`` values are left out.
        """
        super().__init__(detail)
        self.problem_category = category
        self.status = status if status is not None else STATUS_OF_CATEGORY[category]
        self.kind = kind if kind is not None else category.value
        self.title = title if title is not None else _TITLES[category]
        self.detail = detail
        self.extensions = {k: v for k, v in extensions.items() if v is not None}
        self.headers = dict(headers or {})

    def body(self, instance: str) -> dict[str, Any]:
        """The problem document.

        Args:
            instance: The request's path (RFC 9457 ``instance``).

        Returns:
            The JSON object.
        """
        return {
            "type": f"urn:settled:problem:{self.kind}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "instance": instance,
            "category": self.problem_category.value,
            **self.extensions,
        }

    def response(self, instance: str) -> JSONResponse:
        """The HTTP response.

        Args:
            instance: The request's path.

        Returns:
            A JSON response with media type ``application/problem+json``.
        """
        return JSONResponse(
            self.body(instance), status_code=self.status, headers=self.headers, media_type=PROBLEM_MEDIA_TYPE
        )


def problem_of_error(error: SettledError) -> ProblemError:
    """The problem for any settled error: its category's status, and what the error names.

    Args:
        error: The error (a client error carries ``receipt``, ``idempotency_key``, ``command_id``, ``field``).

    Returns:
        The problem (``error`` itself when it is one).
    """
    if isinstance(error, ProblemError):
        return error
    receipt = getattr(error, "receipt", None)
    kind = getattr(error, "reason_code", None) or error.category.value
    headers = {"Retry-After": "1"} if error.category in (ErrorCategory.UNAVAILABLE, ErrorCategory.PENDING) else None
    return ProblemError(
        error.category,
        str(error),
        kind=kind,
        headers=headers,
        field=getattr(error, "field", None),
        idempotency_key=getattr(error, "idempotency_key", None),
        command_id=getattr(error, "command_id", None),
        receipt=None if receipt is None else receipt.model_dump(mode="json"),
    )
