"""Model providers: the interface, a scripted provider for tests, how errors are classified (docs/semantics.md §9).

A provider streams a response to a `ModelRequest`: text and reasoning deltas (which the runtime may record as
canonical audit content), tool-argument deltas (provisional only: never recorded, DUR-008), then one
`ModelResponse`. Every request carries a stable operation id derived from (run, attempt, model-call ordinal), for
providers that dedupe (docs/semantics.md §9).

Errors are classified at the boundary: a `ProviderError` says whether retrying can help (and after how long);
`ConnectionError` and `TimeoutError` are retryable; anything else is not. The runtime has one retry layer, with a
per-operation budget (`settled.runtime.RunOptions.model_retries`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from settled._errors import ErrorCategory, SettledError
from settled.schemas import DeclaredToolCall, ModelResponseCompleted, Usage, canonical_json, json_digest

__all__ = [
    "Message",
    "ModelEvent",
    "ModelProvider",
    "ModelRequest",
    "ModelResponse",
    "ProviderError",
    "ReasoningDelta",
    "ScriptedProvider",
    "TextDelta",
    "ToolArgumentsDelta",
    "ToolDeclaration",
    "declared_call",
    "user_text",
]


@dataclass(frozen=True)
class ToolDeclaration:
    """A tool as a model sees it.

    Attributes:
        name: The tool's name.
        description: What it does.
        parameters: JSON Schema of its arguments (empty: any object).
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Message:
    """One message of a prompt.

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        text: The text (for a tool message: the result as canonical JSON, or the error text).
        tool_calls: For an assistant message: the tool calls it declares.
        call_id: For a tool message: the declared call it answers.
        is_error: For a tool message: whether it carries an error.

    Raises:
        ValueError: An unknown role.
    """

    role: str
    text: str = ""
    tool_calls: tuple[DeclaredToolCall, ...] = ()
    call_id: str | None = None
    is_error: bool = False

    def __post_init__(self) -> None:
        if self.role not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"Message.role must be system, user, assistant or tool, got {self.role!r}")

    def to_json(self) -> dict[str, Any]:
        """A JSON form (for logs and prompt captures)."""
        out: dict[str, Any] = {"role": self.role, "text": self.text}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.call_id, "tool": c.tool, "args": c.args_json} for c in self.tool_calls]
        if self.call_id is not None:
            out["call_id"] = self.call_id
            out["is_error"] = self.is_error
        return out


@dataclass(frozen=True)
class ModelRequest:
    """One model call.

    Attributes:
        operation_id: Stable per (run, attempt, model-call ordinal): a provider that dedupes by it never charges a
            repeated delivery of the same call twice.
        model: The model name.
        messages: The prompt.
        tools: The tools offered.
    """

    operation_id: str
    model: str
    messages: tuple[Message, ...]
    tools: tuple[ToolDeclaration, ...] = ()


@dataclass(frozen=True)
class TextDelta:
    """A piece of the response's text (may be recorded for audit)."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """A piece of the response's reasoning (may be recorded for audit)."""

    text: str


@dataclass(frozen=True)
class ToolArgumentsDelta:
    """A piece of a tool call's arguments: provisional, never recorded (DUR-008)."""

    call_id: str
    text: str


@dataclass(frozen=True)
class ModelResponse:
    """A complete response.

    Attributes:
        text: Its text.
        tool_calls: The tool calls it declares (arguments as canonical JSON with their digest).
        model: The model that answered.
        request_id: The provider's request id, when given.
        usage: Token usage, when given.
    """

    text: str
    tool_calls: tuple[DeclaredToolCall, ...] = ()
    model: str = ""
    request_id: str | None = None
    usage: Usage | None = None

    @classmethod
    def from_record(cls, record: ModelResponseCompleted) -> ModelResponse:
        """The response a committed `ModelResponseCompleted` records (what a replay returns)."""
        return cls(record.text, record.tool_calls, record.model, record.request_id, record.usage)


#: What a provider's stream yields.
ModelEvent = TextDelta | ReasoningDelta | ToolArgumentsDelta | ModelResponse


class ProviderError(SettledError):
    """A provider call failed; says whether retrying can help.

    Attributes:
        retryable: True when a retry may succeed (rate limit, overload, lost connection).
        retry_after_s: How long to wait first, when the provider said.
        usage: Token usage the provider reported before the failure (recorded with the interrupted try), if any.
        non_retryable: True once the model call's own retry layer gave up on it (`RunOptions.model_retries` spent,
            or not retryable): the run's submission then settles failed without another attempt, so the
            per-operation budget and the submission's (``App.max_attempts``) never stack (issue 22 item 4).
    """

    category = ErrorCategory.UNAVAILABLE

    def __init__(
        self, message: str, *, retryable: bool, retry_after_s: float | None = None, usage: Usage | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.usage = usage
        self.non_retryable = False


class ModelProvider(Protocol):
    """A model provider (see the module docstring)."""

    @property
    def name(self) -> str:
        """The provider's name (recorded with every response)."""
        ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream the response to ``request``: deltas, then exactly one `ModelResponse`.

        Raises:
            ProviderError: The call failed (classified).
        """
        ...


def declared_call(call_id: str, tool: str, args: Mapping[str, Any]) -> DeclaredToolCall:
    """Build a declared tool call with canonical arguments and their digest.

    Args:
        call_id: The provider's call id.
        tool: The tool's name.
        args: The arguments, a JSON object.

    Returns:
        The call.

    Raises:
        CanonicalJsonError: ``args`` is not representable as canonical JSON.
    """
    args_json = canonical_json(dict(args))
    return DeclaredToolCall(call_id=call_id, tool=tool, args_json=args_json, args_digest=json_digest(args_json))


#: One step of a script: an event to yield, an error to raise, or a pause in seconds.
ScriptStep = ModelEvent | ProviderError | float


@dataclass
class ScriptedProvider:
    """A deterministic provider for tests: ``script(request)`` returns the steps of the response.

    Attributes:
        script: Maps a request to its steps; deterministic in the request, so a retried or replayed call gets the
            same answer.
        name: The provider's name.
        prompts: Every request received, in order (a test inspects what the model was shown).
    """

    script: Callable[[ModelRequest], Sequence[ScriptStep]]
    name: str = "scripted"
    prompts: list[ModelRequest] = field(default_factory=list)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Yield the scripted steps (sleeping on a float, raising an error)."""
        self.prompts.append(request)
        for step in self.script(request):
            if isinstance(step, ProviderError):
                raise step
            if isinstance(step, float | int):
                await asyncio.sleep(float(step))
                continue
            yield step


def user_text(input_json: str) -> str:
    """Return the user message of a submission's input: the string itself, else its canonical JSON.

    Args:
        input_json: The input, canonical JSON.

    Returns:
        The message text.
    """
    value = json.loads(input_json)
    return value if isinstance(value, str) else input_json
