"""Request and response bodies of the BFCL tool server's HTTP API, shared by the server and its client.

Arguments travel as JSON and stay JSON: an int stays an int and a float a float (``Any`` fields are not coerced).
Error answers carry ``{"error": <code>, "detail": <text>}`` with one of the codes in :data:`ERROR_CODES`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ERROR_CODES",
    "CallRequest",
    "CallResponse",
    "Capabilities",
    "ConversationInfo",
    "CreateConversationRequest",
    "ErrorBody",
    "ExecutionRecord",
    "LedgerRecord",
    "ToolInfo",
]

#: Error codes and the HTTP status the server answers them with.
ERROR_CODES: dict[str, int] = {
    "unknown_conversation": 404,
    "conversation_conflict": 409,
    "idempotency_key_conflict": 409,
    "stale_epoch": 409,
    "unknown_method": 422,
    "invalid_request": 422,
}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorBody(_Body):
    """An error answer.

    Attributes:
        error: A code from :data:`ERROR_CODES`.
        detail: What went wrong, naming the conversation, key or method.
    """

    error: str
    detail: str


class CreateConversationRequest(_Body):
    """``PUT /conversations/{conversation_id}``: build the conversation's world.

    Attributes:
        entry_id: The BFCL entry the world comes from (recorded; not looked up).
        involved_classes: The backend classes to instantiate.
        initial_config: Class name to scenario dict (the entry's ``initial_config``).
        long_context: BFCL's long-context flag.
    """

    entry_id: str = Field(min_length=1)
    involved_classes: list[str] = Field(min_length=1)
    initial_config: dict[str, Any]
    long_context: bool = False


class ConversationInfo(_Body):
    """A conversation's world, as the server holds it.

    Attributes:
        conversation_id: The conversation.
        entry_id: The BFCL entry the world was built from.
        involved_classes: Its backend classes.
        long_context: BFCL's long-context flag.
        created: True when this request created the world; False when it already existed with the same spec.
        max_epoch: The highest owner epoch seen on a call (-1 before the first call).
        executions: Backend executions so far in this conversation (replays not counted).
    """

    conversation_id: str
    entry_id: str
    involved_classes: list[str]
    long_context: bool
    created: bool = False
    max_epoch: int
    executions: int


class CallRequest(_Body):
    """``POST /conversations/{conversation_id}/calls``: execute one tool call.

    Attributes:
        method: The bare backend method name, e.g. ``"mkdir"``.
        arguments: Named JSON arguments.
        idempotency_key: The runtime's idempotency key for the call (docs/design.md §5).
        owner_epoch: The epoch of the partition owner making the call (docs/design.md §3); a call with an epoch lower
            than one already seen for the conversation is refused.
        call_id: The runtime's call id (recorded in the ledger), e.g. ``multi_turn_base_0/t1/c0``.
    """

    method: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str = Field(min_length=1)
    owner_epoch: int = Field(ge=0)
    call_id: str | None = None


class CallResponse(_Body):
    """The answer to a call.

    Attributes:
        output: The tool's output (BFCL's convention: an exception is ``"Error during execution: <msg>"``).
        replayed: True when the stored result of an earlier execution under the same key was returned.
        execution_count: Backend executions under this key so far (1 after a first call or a replay under dedup).
        idempotent: Whether the server deduplicates this method under its key; False for classes named with
            ``--no-idempotency`` and for every method when dedup is off.
        idempotency_key: The key.
        executed_at: ISO-8601 UTC time of the execution whose output this is.
    """

    output: str
    replayed: bool
    execution_count: int
    idempotent: bool
    idempotency_key: str
    executed_at: str


class ExecutionRecord(_Body):
    """One backend execution (the append-only part of the ledger).

    Attributes:
        seq: Server-wide sequence number.
        call_id: The runtime's call id, if given.
        method: The method.
        arguments: The arguments it ran with.
        output: Its output.
        owner_epoch: The caller's epoch.
        executed_at: ISO-8601 UTC time.
    """

    seq: int
    call_id: str | None
    method: str
    arguments: dict[str, Any]
    output: str
    owner_epoch: int
    executed_at: str


class LedgerRecord(_Body):
    """The ledger's record of one idempotency key in one conversation.

    Attributes:
        conversation_id: The conversation.
        idempotency_key: The key.
        call_id: The call id of the first call under the key.
        method: The method of the first call.
        class_name: Its backend class.
        arguments: The arguments of the first call.
        output: The stored result (the first execution's output).
        owner_epoch: The epoch of the first call.
        executed_at: ISO-8601 UTC time of the first execution.
        execution_count: How many times the backend ran a call under this key.
        replay_count: How many calls under this key got the stored result without running.
        executions: Every execution under this key, in order.
    """

    conversation_id: str
    idempotency_key: str
    call_id: str | None
    method: str
    class_name: str
    arguments: dict[str, Any]
    output: str
    owner_epoch: int
    executed_at: str
    execution_count: int
    replay_count: int
    executions: list[ExecutionRecord]


class ToolInfo(_Body):
    """One method the server can run.

    Attributes:
        method: The method name.
        class_name: Its backend class.
        idempotent: Whether calls are deduplicated under their idempotency key.
    """

    method: str
    class_name: str
    idempotent: bool


class Capabilities(_Body):
    """``GET /capabilities``: what the server promises (settled makes an interrupted non-idempotent call Unknown).

    Attributes:
        dedup: False when started with ``--no-dedup`` (the negative control).
        non_idempotent_classes: Classes named with ``--no-idempotency``.
        tools: Every method with its idempotency.
        bfcl_version: The installed ``bfcl-eval``.
        status: Always ``"ok"``.
    """

    dedup: bool
    non_idempotent_classes: list[str]
    tools: list[ToolInfo]
    bfcl_version: str
    status: Literal["ok"] = "ok"
