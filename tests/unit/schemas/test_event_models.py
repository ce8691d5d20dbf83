"""Validation rules of the event models (issue 4 item 1)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from settled.schemas import (
    RESULT_TOO_LARGE,
    CanonicalJsonError,
    InputRef,
    Receipt,
    ReceiptOutcome,
    RequestKind,
    ResolutionKind,
    ResolveUnknown,
    SettlementOutcome,
    SubmissionPayload,
    ToolCallSettled,
    ToolError,
    canonical_json,
    canonicalize_json_text,
    json_digest,
    payload_digest,
)


def test_canonical_json_is_rfc8785() -> None:
    assert canonical_json({"b": 1.0, "a": [1e21, "é"]}) == '{"a":[1e+21,"é"],"b":1}'
    assert canonicalize_json_text('{ "b" : 2, "a" : 1 }') == '{"a":1,"b":2}'
    assert json_digest("{}") == "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2**60, {1: "x"}, object()])
def test_canonical_json_refuses_what_rfc8785_cannot_represent(value: object) -> None:
    with pytest.raises(CanonicalJsonError):
        canonical_json(value)


def test_non_canonical_json_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as info:
        SubmissionPayload(input_json='{"b":1, "a":2}', tools_offered=())
    assert "input_json" in str(info.value)


def test_payload_digest_is_the_digest_of_the_canonical_payload_object() -> None:
    payload = SubmissionPayload(input_json='{"q":[1,2.5]}', tools_offered=("search", "add"))
    expected = canonical_json({"input": {"q": [1, 2.5]}, "tools_offered": ["search", "add"]})
    assert payload_digest(payload) == json_digest(expected)


def test_times_become_utc_milliseconds_and_naive_times_are_refused() -> None:
    local = datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=timezone(timedelta(hours=2)))
    receipt = Receipt(
        request_kind=RequestKind.SUBMISSION,
        request_id="s",
        outcome=ReceiptOutcome.ADMITTED,
        conversation_id="c",
        decided_at=local,
    )
    assert receipt.decided_at == datetime(2026, 1, 2, 1, 4, 5, 678_000, tzinfo=UTC)
    with pytest.raises(ValidationError, match="timezone-aware"):
        Receipt(
            request_kind=RequestKind.SUBMISSION,
            request_id="s",
            outcome=ReceiptOutcome.ADMITTED,
            conversation_id="c",
            decided_at=datetime(2026, 1, 2),
        )


def test_models_are_frozen_and_refuse_unknown_fields() -> None:
    ref = InputRef(topic="t", partition=0, offset=1)
    with pytest.raises(ValidationError):
        ref.offset = 2  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        InputRef(topic="t", partition=0, offset=1, key="x")  # type: ignore[call-arg]


def test_tool_call_settled_result_xor_error_and_digests() -> None:
    result = canonical_json({"ok": True})
    digest = json_digest(result)
    ToolCallSettled(submission_id="s", attempt_id="a", call_id="c", result_json=result, result_digest=digest)
    with pytest.raises(ValidationError, match="result_digest"):
        ToolCallSettled(submission_id="s", attempt_id="a", call_id="c", result_json=result, result_digest="0" * 64)
    with pytest.raises(ValidationError, match="exactly one"):
        ToolCallSettled(submission_id="s", attempt_id="a", call_id="c")
    too_large = ToolError(type=RESULT_TOO_LARGE, message="2 MiB > 1 MiB", non_retryable=True)
    with pytest.raises(ValidationError, match="result_too_large"):
        ToolCallSettled(submission_id="s", attempt_id="a", call_id="c", error=too_large)
    ToolCallSettled(submission_id="s", attempt_id="a", call_id="c", error=too_large, result_digest=json_digest(result))


def test_resolve_unknown_kind_rules_and_signing_bytes() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    common = {
        "command_id": "cmd",
        "principal": "ops",
        "conversation_id": "c",
        "submission_id": "s",
        "call_id": "call",
        "key_id": "k1",
        "signature": b"\x00" * 64,
        "requested_at": at,
    }
    with pytest.raises(ValidationError, match="outcome is required"):
        ResolveUnknown(kind=ResolutionKind.OUTCOME_FOR_SUBMISSION, **common)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="result_json is required"):
        ResolveUnknown(kind=ResolutionKind.CALL_OUTCOME, **common)  # type: ignore[arg-type]
    record = ResolveUnknown(
        kind=ResolutionKind.OUTCOME_FOR_SUBMISSION,
        outcome=SettlementOutcome.FAILED,
        **common,  # type: ignore[arg-type]
    )
    message = record.signing_bytes()
    assert message == (
        b'{"call_id":"call","command_id":"cmd","conversation_id":"c","key_id":"k1","kind":"outcome_for_submission",'
        b'"outcome":"failed","principal":"ops","requested_at":1767225600000,"result_json":null,"submission_id":"s"}'
    )
    assert record.model_copy(update={"signature": b"\x01" * 64}).signing_bytes() == message
