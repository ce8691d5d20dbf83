"""`OpenAIChat`: a model provider on the official ``openai`` SDK, streamed Chat Completions (issue 19 item 1).

Any OpenAI-compatible server works, a local one included. Settings come from ``SETTLED_MODEL_*``
(`OpenAISettings`): base URL, model and API key (a `pydantic.SecretStr`, never logged or shown in ``repr``).

Promises (docs/semantics.md §9):

* The SDK's own retries are off (``max_retries=0``): settled's per-operation budget
  (`settled.runtime.RunOptions.model_retries`) is the one retry layer, so the server sees one request per allowed
  attempt.
* The request's operation id (stable per run, attempt and model-call ordinal) travels in the
  ``Idempotency-Key`` header (`OPERATION_ID_HEADER`), for servers that dedupe.
* Errors are classified at the boundary: 408, 409, 429 and 5xx, timeouts and lost connections (a stream cut
  mid-way included) are a retryable `ProviderError` carrying the server's ``retry-after`` (``retry-after-ms``
  first) as ``retry_after_s``; any other 4xx is not retryable.
* Tool calls are assembled from their argument deltas (arguments split across chunks); usage comes from the
  final usage chunk (``stream_options={"include_usage": True}``).

The ``openai`` package is an optional extra (``pip install 'settled[openai]'``); it is imported when an
`OpenAIChat` is built.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from settled._faults import fault_enabled
from settled.runtime._model import (
    Message,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    ProviderError,
    ReasoningDelta,
    TextDelta,
    ToolArgumentsDelta,
    ToolDeclaration,
    declared_call,
)
from settled.schemas import Usage

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["OPERATION_ID_HEADER", "OpenAIChat", "OpenAISettings", "retry_after_s"]

#: The request header carrying the model call's operation id.
OPERATION_ID_HEADER = "Idempotency-Key"

#: Statuses a retry may cure (besides timeouts and lost connections).
_RETRYABLE_STATUSES = frozenset({408, 409, 429})


class OpenAISettings(BaseSettings):
    """Where an `OpenAIChat` sends its requests, read from ``SETTLED_MODEL_*``.

    Attributes:
        base_url: The server's base URL (``SETTLED_MODEL_BASE_URL``), e.g. ``https://api.openai.com/v1``.
        model: The model name (``SETTLED_MODEL_NAME``).
        api_key: The API key (``SETTLED_MODEL_API_KEY``): hidden in ``repr`` and logs.
        timeout_s: Timeout of one request, in seconds (``SETTLED_MODEL_TIMEOUT_S``).
    """

    model_config = SettingsConfigDict(env_prefix="SETTLED_MODEL_", frozen=True, extra="ignore")

    base_url: str = "https://api.openai.com/v1"
    name: str = "gpt-4o-mini"
    api_key: SecretStr = SecretStr("")
    timeout_s: float = 60.0


def retry_after_s(headers: Mapping[str, str], *, now_s: float | None = None) -> float | None:
    """The delay a response asks for before a retry: ``retry-after-ms``, else ``retry-after`` (seconds or a date).

    Args:
        headers: The response's headers (case-insensitive mapping, e.g. ``httpx.Headers``).
        now_s: The current time, in seconds since the epoch, for an HTTP-date value (default: now).

    Returns:
        The delay in seconds (never negative), or None when the response gives none or an unreadable one.
    """
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))


def _message_json(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.call_id or "", "content": message.text}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.text or None,
            "tool_calls": [
                {"id": c.call_id, "type": "function", "function": {"name": c.tool, "arguments": c.args_json}}
                for c in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.text}


def _tool_json(tool: ToolDeclaration) -> dict[str, Any]:
    parameters = dict(tool.parameters) or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": parameters},
    }


@dataclass
class _PartialCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def _usage(raw: Any) -> Usage:
    prompt_details = getattr(raw, "prompt_tokens_details", None)
    completion_details = getattr(raw, "completion_tokens_details", None)
    cached = getattr(prompt_details, "cached_tokens", None)
    reasoning = getattr(completion_details, "reasoning_tokens", None)
    return Usage(
        input_tokens=int(raw.prompt_tokens or 0),
        output_tokens=int(raw.completion_tokens or 0),
        cached_input_tokens=None if cached is None else int(cached),
        reasoning_tokens=None if reasoning is None else int(reasoning),
    )


class OpenAIChat:
    """A `ModelProvider` on the ``openai`` SDK's streamed Chat Completions (module docstring).

    Args:
        settings: Base URL, model and key (default: read from ``SETTLED_MODEL_*``).
        client: An SDK client to use instead of building one from ``settings`` (it must have ``max_retries=0``).

    Attributes:
        settings: The settings.
        model: The model name requests use when the agent asks for ``"default"``.

    Raises:
        ModuleNotFoundError: The ``openai`` extra is not installed.
        ValueError: ``client`` retries on its own (``client.max_retries`` is not 0).
    """

    name = "openai"

    def __init__(self, settings: OpenAISettings | None = None, *, client: AsyncOpenAI | None = None) -> None:
        import openai

        if client is not None and client.max_retries != 0:
            raise ValueError(
                f"OpenAIChat client.max_retries must be 0 (settled's retry budget is the one retry layer), "
                f"got {client.max_retries}"
            )
        self.settings = settings or OpenAISettings()
        self.model = self.settings.name
        # settled's retry budget is the one retry layer; the fault switch turns the SDK's own retries back on.
        max_retries = 2 if fault_enabled("sdk_retries_on") else 0
        self._client = client or openai.AsyncOpenAI(
            base_url=self.settings.base_url,
            api_key=self.settings.api_key.get_secret_value() or "unset",
            max_retries=max_retries,
            timeout=self.settings.timeout_s,
        )

    def __repr__(self) -> str:
        return f"OpenAIChat(base_url={self.settings.base_url!r}, model={self.model!r})"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream one Chat Completion: text and reasoning deltas, tool-argument deltas, then the `ModelResponse`.

        Args:
            request: The request; ``request.model == "default"`` means the settings' model.

        Yields:
            The response's events, the `ModelResponse` last.

        Raises:
            ProviderError: The call failed (classified: see the module docstring).
        """
        import openai

        model = self.model if request.model == "default" else request.model
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": [_message_json(m) for m in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "extra_headers": {OPERATION_ID_HEADER: request.operation_id},
        }
        if request.tools:
            kwargs["tools"] = [_tool_json(t) for t in request.tools]
        text: list[str] = []
        calls: dict[int, _PartialCall] = {}
        usage: Usage | None = None
        answered_model = model
        request_id: str | None = None
        finished = False
        try:
            stream = await self._client.chat.completions.create(**kwargs)
            request_id = stream.response.headers.get("x-request-id")
            try:
                async for chunk in stream:
                    if chunk.model:
                        answered_model = chunk.model
                    if chunk.usage is not None:
                        usage = _usage(chunk.usage)
                    for choice in chunk.choices:
                        finished = finished or choice.finish_reason is not None
                        delta = choice.delta
                        reasoning = getattr(delta, "reasoning_content", None)
                        if isinstance(reasoning, str) and reasoning:
                            yield ReasoningDelta(reasoning)
                        if delta.content:
                            text.append(delta.content)
                            yield TextDelta(delta.content)
                        for tc in delta.tool_calls or ():
                            partial = calls.setdefault(tc.index, _PartialCall())
                            if tc.id:
                                partial.call_id = tc.id
                            if tc.function is not None:
                                if tc.function.name:
                                    partial.name += tc.function.name
                                if tc.function.arguments:
                                    partial.arguments.append(tc.function.arguments)
                                    yield ToolArgumentsDelta(partial.call_id, tc.function.arguments)
            finally:
                await stream.close()
        except openai.APIStatusError as exc:
            status = exc.status_code
            retryable = status in _RETRYABLE_STATUSES or status >= 500
            raise ProviderError(
                f"{self.name} answered HTTP {status} for operation {request.operation_id}: {exc.message}",
                retryable=retryable,
                retry_after_s=retry_after_s(exc.response.headers) if retryable else None,
            ) from exc
        except openai.APIConnectionError as exc:
            # APITimeoutError is an APIConnectionError, and so is a stream cut mid-way (the SDK wraps the transport
            # error it meets while reading the body).
            raise ProviderError(
                f"{self.name} connection failed for operation {request.operation_id}: {type(exc).__name__}: {exc}",
                retryable=True,
                usage=usage,
            ) from exc
        if not finished:
            raise ProviderError(
                f"{self.name} ended the stream of operation {request.operation_id} without a finish reason",
                retryable=True,
                usage=usage,
            )
        tool_calls = []
        for index in sorted(calls):
            partial = calls[index]
            raw = "".join(partial.arguments) or "{}"
            try:
                args = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ProviderError(
                    f"{self.name} declared tool call {partial.call_id!r} ({partial.name}) with arguments that are "
                    f"not JSON: {raw[:200]!r}",
                    retryable=False,
                ) from exc
            if not isinstance(args, dict):
                raise ProviderError(
                    f"{self.name} declared tool call {partial.call_id!r} ({partial.name}) with arguments that are "
                    f"not a JSON object: {raw[:200]!r}",
                    retryable=False,
                )
            tool_calls.append(declared_call(partial.call_id or f"call_{index}", partial.name, args))
        yield ModelResponse("".join(text), tuple(tool_calls), model=answered_model, request_id=request_id, usage=usage)
