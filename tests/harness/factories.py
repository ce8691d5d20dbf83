"""The tests' one factories module: inbox records with fresh ids, as a client or an operator would send them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from settled.schemas import AbortRequested, SubmissionPayload, SubmissionProposed, canonical_json, payload_digest


def proposal(
    conversation: str,
    key: str | None = None,
    value: Any = "hello",
    tools: tuple[str, ...] = (),
    *,
    principal: str = "tester",
) -> SubmissionProposed:
    """A `SubmissionProposed` of ``value`` with a fresh submission id, proposed now.

    Args:
        conversation: The conversation id (the inbox key).
        key: The idempotency key; a fresh one when None.
        value: The input (canonical JSON of it is the payload).
        tools: The tools offered to the run.
        principal: Who proposes it.

    Returns:
        The proposal.
    """
    payload = SubmissionPayload(input_json=canonical_json(value), tools_offered=tools)
    return SubmissionProposed(
        submission_id=str(uuid.uuid4()),
        principal=principal,
        conversation_id=conversation,
        idempotency_key=key or str(uuid.uuid4()),
        payload=payload,
        payload_digest=payload_digest(payload),
        proposed_at=datetime.now(UTC),
    )


def abort_command(
    conversation_id: str, submission_id: str, command_id: str | None = None, *, reason: str = "test abort"
) -> AbortRequested:
    """An `AbortRequested` of ``submission_id``, requested now.

    Args:
        conversation_id: The submission's conversation.
        submission_id: The submission to abort.
        command_id: The command id; a fresh one when None.
        reason: The operator's reason.

    Returns:
        The command.
    """
    return AbortRequested(
        command_id=command_id or f"abort-{uuid.uuid4().hex[:12]}",
        principal="tester",
        conversation_id=conversation_id,
        submission_id=submission_id,
        reason=reason,
        requested_at=datetime.now(UTC),
    )
