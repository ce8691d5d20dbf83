"""`OpenAIChat` through the real ``openai`` SDK against a local streamed Chat Completions server (issue 19 item 1).

The server (`tests/unit/runtime/openai_server.py`) speaks HTTP and SSE; the runs use the in-memory recorder of
``test_context`` for the log. Nothing of the SDK is patched.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import SecretStr

from settled.runtime import (
    OPERATION_ID_HEADER,
    App,
    ModelAgent,
    OpenAIChat,
    OpenAISettings,
    ProviderError,
    RunOptions,
    ToolCall,
)
from settled.runtime._openai import retry_after_s
from settled.schemas import (
    DeltaKind,
    ModelResponseCompleted,
    ModelResponseDelta,
    ModelResponseInterrupted,
    ToolCallSettled,
    Usage,
    canonical_json,
)
from tests._promise import promise
from tests.unit.runtime.openai_server import Status, Stream, chunk, serve, usage_chunk
from tests.unit.runtime.test_context import Recorder, attempt, run


def make_app(base_url: str, **options: Any) -> tuple[App, list[str]]:
    settings = OpenAISettings(base_url=base_url, name="local-1", api_key=SecretStr("sk-test-secret"), timeout_s=10)
    opts = {"model_backoff_s": 0.01, "delta_flush_every": 1, **options}
    app = App(agent=ModelAgent(OpenAIChat(settings)), resolver_keys={"k": "x"}, options=RunOptions(**opts))
    invoked: list[str] = []

    @app.tool(idempotent=True)
    def lookup(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
        """Look a city up."""
        invoked.append(canonical_json(args))
        return {"temp_c": 21}

    return app, invoked


def tool_call_stream() -> Stream:
    """A tool call whose id, name and arguments arrive over four deltas, then usage."""
    return Stream(
        [
            chunk(tool_calls=[{"index": 0, "id": "call_1", "type": "function", "function": {"name": "lookup"}}]),
            chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"ci'}}]),
            chunk(tool_calls=[{"index": 0, "function": {"arguments": 'ty": "Pa'}}]),
            chunk(tool_calls=[{"index": 0, "function": {"arguments": 'ris"}'}}], finish_reason="tool_calls"),
            usage_chunk(12, 7, cached=4, reasoning=2),
        ]
    )


def text_stream(*parts: str, prompt: int = 30, completion: int = 3) -> Stream:
    chunks = [chunk(content=p) for p in parts]
    chunks.append(chunk(finish_reason="stop"))
    chunks.append(usage_chunk(prompt, completion))
    return Stream(chunks)


def test_tool_arguments_split_across_deltas_are_assembled_and_usage_is_recorded() -> None:
    with serve([tool_call_stream(), text_stream("It is ", "21 C.")]) as (url, received):
        app, invoked = make_app(url)
        rec = Recorder()
        assert run(app, attempt(rec)) == canonical_json("It is 21 C.")
    assert invoked == [canonical_json({"city": "Paris"})]
    first, second = rec.of(ModelResponseCompleted)
    assert first.tool_calls[0].call_id == "call_1" and first.tool_calls[0].tool == "lookup"
    assert first.usage == Usage(input_tokens=12, output_tokens=7, cached_input_tokens=4, reasoning_tokens=2)
    assert (first.provider, first.model, first.request_id) == ("openai", "local-1", "req-1")
    assert (
        second.usage == Usage(input_tokens=30, output_tokens=3, cached_input_tokens=0, reasoning_tokens=0)
        and second.text == "It is 21 C."
    )
    assert [d.text for d in rec.of(ModelResponseDelta)] == ["It is ", "21 C."]
    assert len(rec.of(ToolCallSettled)) == 1
    # The request: streamed with usage, tools offered, the operation id in its header, the key never elsewhere.
    body = received[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert [t["function"]["name"] for t in body["tools"]] == ["lookup"]
    assert received[0].headers["authorization"] == "Bearer sk-test-secret"
    ops = [r.headers[OPERATION_ID_HEADER.lower()] for r in received]
    assert len(set(ops)) == 2 and all(len(op) == 64 for op in ops)
    assert [first.operation_id, second.operation_id] == ops, "the operation id sent is the one recorded"
    # The second prompt answers the call with its result.
    tool_message = received[1].body["messages"][-1]
    assert tool_message == {"role": "tool", "tool_call_id": "call_1", "content": canonical_json({"temp_c": 21})}


def test_a_429_with_retry_after_is_retried_once_and_the_server_sees_one_request_per_attempt() -> None:
    with serve([Status(429, {"retry-after": "0.2"}), text_stream("ok")]) as (url, received):
        app, _ = make_app(url, model_backoff_s=5.0)  # a retry not honouring retry-after would wait 5 s
        rec = Recorder()
        started_s = time.monotonic()
        assert run(app, attempt(rec)) == canonical_json("ok")
        elapsed_s = time.monotonic() - started_s
    assert len(received) == 2
    assert 0.2 <= elapsed_s < 4.0, f"the retry waited {elapsed_s:.2f} s, not the server's retry-after of 0.2 s"
    assert received[0].headers[OPERATION_ID_HEADER.lower()] == received[1].headers[OPERATION_ID_HEADER.lower()]


def test_a_429_past_the_budget_sends_exactly_one_request_per_allowed_attempt() -> None:
    answers: list[Stream | Status] = [Status(429, {"retry-after": "0"}) for _ in range(10)]
    with serve(answers) as (url, received):
        app, _ = make_app(url, model_retries=1)
        result = _run_expecting_failure(app)
    promise(
        "DUR-008.one-request-per-attempt",
        len(received) == 2,
        f"model_retries=1 allows 2 attempts, so the server must see 2 requests; it saw {len(received)} "
        "(the SDK retried behind settled's budget)",
    )
    assert "429" in result


def test_a_400_is_not_retried() -> None:
    with serve([Status(400), text_stream("never")]) as (url, received):
        app, _ = make_app(url, model_retries=3)
        result = _run_expecting_failure(app)
    assert len(received) == 1
    assert "400" in result


def test_a_stream_cut_mid_way_leaves_its_deltas_and_is_asked_again_as_a_new_response() -> None:
    cut = Stream([chunk(content="Half "), chunk(content="an ans")], cut=True)
    with serve([cut, text_stream("Whole answer.", prompt=40, completion=5)]) as (url, received):
        app, _ = make_app(url)
        rec = Recorder()
        assert run(app, attempt(rec)) == canonical_json("Whole answer.")
    assert len(received) == 2
    deltas = rec.of(ModelResponseDelta)
    assert [(d.kind, d.text) for d in deltas] == [
        (DeltaKind.TEXT, "Half "),
        (DeltaKind.TEXT, "an ans"),
        (DeltaKind.TEXT, "Whole answer."),
    ]
    (completed,) = rec.of(ModelResponseCompleted)
    assert completed.usage == Usage(input_tokens=40, output_tokens=5, cached_input_tokens=0, reasoning_tokens=0)


def test_retry_after_reads_milliseconds_seconds_and_dates() -> None:
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_s({"retry-after": "2"}) == 2.0
    assert retry_after_s({"retry-after": "Thu, 01 Jan 1970 00:00:10 GMT"}, now_s=4.0) == 6.0
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({}) is None


def test_a_client_that_retries_on_its_own_is_refused() -> None:
    import openai

    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="k", max_retries=2)
    with pytest.raises(ValueError, match=r"client\.max_retries must be 0 .*got 2"):
        OpenAIChat(client=client)


def test_the_key_is_never_shown() -> None:
    settings = OpenAISettings(base_url="http://127.0.0.1:1/v1", api_key=SecretStr("sk-very-secret"))
    assert "sk-very-secret" not in repr(settings) + repr(OpenAIChat(settings)) + str(settings)


def _run_expecting_failure(app: App) -> str:
    """Run once; the attempt must fail with a `ProviderError`. Returns its text."""
    with pytest.raises(ProviderError) as caught:
        run(app, attempt(Recorder()))
    return str(caught.value)


def test_a_cut_stream_is_recorded_as_interrupted_and_its_retry_numbers_its_deltas_on() -> None:
    """Issue 19: the cut try's cost is recorded (usage unknown, the output that came), the retry's usage in full,
    and the retry's deltas continue the call's delta_index (before: it restarted at 0, so two deltas shared
    (attempt, ordinal, delta_index) and a reader could not tell the tries apart)."""
    cut = Stream([chunk(content="Half "), chunk(content="an ans")], cut=True)
    with serve([cut, text_stream("Whole answer.", prompt=40, completion=5)]) as (url, received):
        app, _ = make_app(url, delta_flush_every=2)
        rec = Recorder()
        assert run(app, attempt(rec)) == canonical_json("Whole answer.")
    assert len(received) == 2
    deltas = rec.of(ModelResponseDelta)
    assert [(d.response_ordinal, d.delta_index, d.text) for d in deltas] == [
        (0, 0, "Half "),
        (0, 1, "an ans"),
        (0, 2, "Whole answer."),
    ]
    (interrupted,) = rec.of(ModelResponseInterrupted)
    assert (interrupted.attempt_id, interrupted.response_ordinal, interrupted.provider, interrupted.model) == (
        "a1",
        0,
        "openai",
        "default",
    )
    assert (interrupted.first_delta_index, interrupted.delta_count, interrupted.output_chars) == (0, 2, 11)
    assert interrupted.usage is None  # the usage chunk comes last: unknown, not zero
    assert "connection failed" in interrupted.error
    (completed,) = rec.of(ModelResponseCompleted)
    assert completed.usage == Usage(input_tokens=40, output_tokens=5, cached_input_tokens=0, reasoning_tokens=0)
    assert interrupted.operation_id == completed.operation_id == received[1].headers[OPERATION_ID_HEADER.lower()]
    events = rec.events
    assert events.index(interrupted) < events.index(deltas[2]) < events.index(completed)


def test_a_429_before_any_output_records_no_interrupted_try() -> None:
    with serve([Status(429, {"retry-after": "0"}), text_stream("Fine.")]) as (url, received):
        app, _ = make_app(url)
        rec = Recorder()
        assert run(app, attempt(rec)) == canonical_json("Fine.")
    assert len(received) == 2
    assert rec.of(ModelResponseInterrupted) == []
