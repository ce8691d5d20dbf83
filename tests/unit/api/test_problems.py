"""Errors as RFC 9457 problem details (issue 20 item 1): one status per error category, naming what to send again."""

from __future__ import annotations

from datetime import UTC, datetime

from settled._errors import ErrorCategory
from settled.api._problems import STATUS_OF_CATEGORY, problem_of_error
from settled.client import AbortRejectedError, SubmissionOutcomeUnknownError
from settled.schemas import Receipt, ReceiptOutcome, RequestKind


def test_every_category_has_a_status() -> None:
    assert set(STATUS_OF_CATEGORY) == set(ErrorCategory)
    assert STATUS_OF_CATEGORY[ErrorCategory.OUTCOME_UNKNOWN] == 504
    assert STATUS_OF_CATEGORY[ErrorCategory.NOT_FOUND] == 404
    assert STATUS_OF_CATEGORY[ErrorCategory.REJECTED] == 409


def test_an_unknown_outcome_names_the_key_and_is_never_a_success() -> None:
    problem = problem_of_error(SubmissionOutcomeUnknownError("k-1", "c", "s", 3.0))
    body = problem.body("/v1/conversations/c/submissions")
    assert problem.status == 504
    assert body["idempotency_key"] == "k-1" and "'k-1'" in body["detail"]
    assert body["type"] == "urn:settled:problem:outcome_unknown" and body["category"] == "outcome_unknown"
    assert problem.response("/x").media_type == "application/problem+json"


def test_a_rejection_carries_its_receipt_and_reason_code() -> None:
    receipt = Receipt(
        request_kind=RequestKind.COMMAND,
        request_id="cmd-1",
        outcome=ReceiptOutcome.REJECTED,
        reason="already_terminal: completed",
        conversation_id="c",
        decided_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    body = problem_of_error(AbortRejectedError(receipt)).body("/x")
    assert body["status"] == 409 and body["type"] == "urn:settled:problem:already_terminal"
    assert body["receipt"]["request_id"] == "cmd-1" and "completed" in body["detail"]
