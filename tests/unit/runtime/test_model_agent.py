"""The model-driven agent and ``ctx.model`` without Kafka (issue 6 item 2; docs/semantics.md §9, §10; DUR-008).

Effects go to the in-memory recorder of ``test_context``; a scripted provider answers deterministically from the
request and keeps every prompt it was shown.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from settled.processors import HistoryTurn
from settled.runtime import (
    App,
    Message,
    ModelAgent,
    ModelRequest,
    ModelResponse,
    ProviderError,
    ReasoningDelta,
    RunOptions,
    ScriptedProvider,
    TextDelta,
    ToolArgumentsDelta,
    ToolCall,
    declared_call,
    history_messages,
)
from settled.runtime._model import ScriptStep
from settled.schemas import (
    DeltaKind,
    ModelResponseCompleted,
    ModelResponseDelta,
    SettlementOutcome,
    ToolCallPrepared,
    ToolCallRefused,
    ToolCallSettled,
    Usage,
    canonical_json,
    json_digest,
)
from tests.unit.runtime.test_context import Recorder, attempt, run


def assistant_turns(request: ModelRequest) -> int:
    """How many model answers this run already has (the script's position)."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    return sum(1 for m in request.messages[last_user:] if m.role == "assistant")


def tool_then_text(request: ModelRequest) -> list[ScriptStep]:
    if assistant_turns(request) == 0:
        return [
            ReasoningDelta("need a charge"),
            ToolArgumentsDelta("c1", '{"amo'),
            ModelResponse(
                "",
                (declared_call("c1", "charge", {"amount": 5}), declared_call("c2", "send", {"to": "bob"})),
                model="m1",
                request_id="req-1",
                usage=Usage(input_tokens=10, output_tokens=3),
            ),
        ]
    return [TextDelta("Do"), TextDelta("ne"), TextDelta("."), ModelResponse("Done.", model="m1", request_id="req-2")]


def make_app(provider: ScriptedProvider, invoked: list[str], **options: Any) -> App:
    app = App(agent=ModelAgent(provider, model="m1"), resolver_keys={"k": "x"}, options=RunOptions(**options))

    @app.tool(idempotent=True)
    def charge(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
        """Charge an amount."""
        invoked.append("charge")
        return {"charged": args["amount"]}

    @app.tool
    def send(args: dict[str, Any], call: ToolCall) -> str:
        """Send a message."""
        invoked.append("send")
        return "sent"

    return app


def test_the_loop_runs_declared_tools_in_order_and_ends_on_a_text_answer() -> None:
    provider, rec = ScriptedProvider(tool_then_text), Recorder()
    invoked: list[str] = []
    # A settlement lingers for the run's next record: 5 s instead of the default 2 ms, so the batches below do not
    # depend on how fast this machine schedules the tool threads.
    app = make_app(provider, invoked, delta_flush_every=2, settle_linger_s=5.0)
    assert run(app, attempt(rec)) == canonical_json("Done.")
    assert invoked == ["charge", "send"]
    second = provider.prompts[1].messages
    assert [m.role for m in second] == ["user", "assistant", "tool", "tool"]
    assert second[1].tool_calls[0].call_id == "c1"
    assert [(m.call_id, m.text) for m in second[2:]] == [("c1", canonical_json({"charged": 5})), ("c2", '"sent"')]
    kinds = [(type(e).__name__, getattr(e, "response_ordinal", getattr(e, "ordinal", None))) for e in rec.events]
    assert kinds == [
        ("ModelResponseDelta", 0),
        ("ModelResponseCompleted", 0),
        ("ToolCallPrepared", 1),
        ("ToolCallSettled", None),
        ("ToolCallPrepared", 2),
        ("ToolCallSettled", None),
        ("ModelResponseDelta", 3),
        ("ModelResponseDelta", 3),
        ("ModelResponseDelta", 3),
        ("ModelResponseCompleted", 3),
    ]
    # Deltas are flushed every two; tool-argument deltas are never recorded (DUR-008). The completed response
    # commits with the first call it declares (one commit before that tool runs, docs/design.md §3); the second call is
    # not prepared until it starts (the tools are not parallel-safe). A settlement is not waited for: it lingers
    # for the run's next record and shares its commit.
    shapes = [[type(e).__name__ for e in b] for b in rec.batches]
    assert shapes == [
        ["ModelResponseDelta", "ModelResponseCompleted", "ToolCallPrepared"],
        ["ToolCallSettled", "ToolCallPrepared"],
        ["ToolCallSettled", "ModelResponseDelta", "ModelResponseDelta"],
        ["ModelResponseDelta", "ModelResponseCompleted"],
    ]
    deltas = rec.of(ModelResponseDelta)
    assert [(d.kind, d.text) for d in deltas] == [
        (DeltaKind.REASONING, "need a charge"),
        (DeltaKind.TEXT, "Do"),
        (DeltaKind.TEXT, "ne"),
        (DeltaKind.TEXT, "."),
    ]
    first = rec.of(ModelResponseCompleted)[0]
    assert (first.provider, first.model, first.request_id, first.usage) == (
        "scripted",
        "m1",
        "req-1",
        Usage(input_tokens=10, output_tokens=3),
    )


def test_replay_calls_neither_the_model_nor_the_tools() -> None:
    provider, rec = ScriptedProvider(tool_then_text), Recorder()
    invoked: list[str] = []
    app = make_app(provider, invoked)
    first = run(app, attempt(rec))
    again = Recorder()
    assert run(app, attempt(again, rec.events, n=2)) == first
    assert len(provider.prompts) == 2 and invoked == ["charge", "send"] and again.batches == []


def test_a_committed_response_without_prepared_calls_resumes_from_its_declaration() -> None:
    provider, rec = ScriptedProvider(tool_then_text), Recorder()
    invoked: list[str] = []
    app = make_app(provider, invoked)
    run(app, attempt(rec))
    declared_only = [e for e in rec.events if isinstance(e, ModelResponseCompleted) and e.tool_calls]
    provider.prompts.clear()
    invoked.clear()
    assert run(app, attempt(Recorder(), declared_only, n=2)) == canonical_json("Done.")
    assert invoked == ["charge", "send"]
    assert len(provider.prompts) == 1, "only the second model call is made again, not the committed first"


def test_a_cut_stream_is_retried_as_a_new_response_and_never_shows_as_a_turn() -> None:
    provider, rec = ScriptedProvider(tool_then_text), Recorder()
    invoked: list[str] = []
    app = make_app(provider, invoked)
    partial = ModelResponseDelta(
        submission_id="s1", attempt_id="a1", response_ordinal=0, delta_index=0, kind=DeltaKind.TEXT, text="I will"
    )
    assert run(app, attempt(rec, [partial], n=2)) == canonical_json("Done.")
    first_prompt = provider.prompts[0]
    assert [m.role for m in first_prompt.messages] == ["user"]
    assert all("I will" not in m.text for p in provider.prompts for m in p.messages)


def test_the_operation_id_is_stable_per_run_attempt_and_ordinal() -> None:
    ids: list[str] = []

    def script(request: ModelRequest) -> list[ScriptStep]:
        ids.append(request.operation_id)
        return [ModelResponse("ok")]

    app = App(agent=ModelAgent(ScriptedProvider(script)))
    run(app, attempt(Recorder()))
    run(app, attempt(Recorder()))
    run(app, attempt(Recorder(), n=2))
    assert ids[0] == ids[1] != ids[2]


def test_a_tool_not_offered_is_refused_and_answered_as_an_error() -> None:
    invoked: list[str] = []

    def script(request: ModelRequest) -> list[ScriptStep]:
        if assistant_turns(request) == 0:
            return [ModelResponse("", (declared_call("x", "send", {"to": "eve"}),))]
        return [ModelResponse("ok")]

    provider, rec = ScriptedProvider(script), Recorder()
    app = make_app(provider, invoked)
    run(app, attempt(rec, tools_offered=("charge",)))
    assert invoked == []
    (refused,) = rec.of(ToolCallRefused)
    assert refused.tool == "send" and not rec.of(ToolCallPrepared)
    tool_message = provider.prompts[1].messages[-1]
    assert tool_message.is_error and "not_offered" in tool_message.text
    assert [d.name for d in provider.prompts[0].tools] == ["charge"]


def test_retryable_provider_errors_are_retried_within_the_budget() -> None:
    calls: list[int] = []

    def script(request: ModelRequest) -> list[ScriptStep]:
        calls.append(1)
        if len(calls) < 3:
            return [ProviderError("overloaded", retryable=True, retry_after_s=0.01)]
        return [ModelResponse("ok")]

    app = App(agent=ModelAgent(ScriptedProvider(script)), options=RunOptions(model_retries=2))
    assert run(app, attempt(Recorder())) == '"ok"'
    assert len(calls) == 3

    def refuse(request: ModelRequest) -> list[ScriptStep]:
        return [ProviderError("invalid api key", retryable=False)]

    rec = Recorder()
    with pytest.raises(ProviderError, match="invalid api key"):
        run(App(agent=ModelAgent(ScriptedProvider(refuse))), attempt(rec))
    assert rec.events == []


def test_history_shows_complete_turns_only() -> None:
    completed_run = HistoryTurn(
        submission_id="s0",
        input_json=json.dumps("hello"),
        outcome=SettlementOutcome.COMPLETED,
        events=(
            ModelResponseCompleted(
                submission_id="s0",
                attempt_id="a",
                response_ordinal=0,
                provider="p",
                model="m",
                text="",
                tool_calls=(declared_call("c1", "charge", {"amount": 1}),),
            ),
            ToolCallSettled(
                submission_id="s0",
                attempt_id="a",
                call_id="s0#1",
                result_json='"ok"',
                result_digest="a" * 64
                if False
                else __import__("settled.schemas", fromlist=["json_digest"]).json_digest('"ok"'),
            ),
            ModelResponseCompleted(
                submission_id="s0",
                attempt_id="a",
                response_ordinal=2,
                provider="p",
                model="m",
                text="hi",
                tool_calls=(),
            ),
        ),
    )
    aborted_run = HistoryTurn(
        submission_id="s1",
        input_json=json.dumps("pay twice"),
        outcome=SettlementOutcome.ABORTED,
        events=(
            ModelResponseDelta(
                submission_id="s1", attempt_id="a", response_ordinal=0, delta_index=0, kind=DeltaKind.TEXT, text="part"
            ),
            ModelResponseCompleted(
                submission_id="s1",
                attempt_id="b",
                response_ordinal=0,
                provider="p",
                model="m",
                text="",
                tool_calls=(declared_call("d1", "charge", {"amount": 1}), declared_call("d2", "send", {"to": "x"})),
            ),
            ToolCallSettled(
                submission_id="s1",
                attempt_id="b",
                call_id="s1#1",
                result_json='"ok"',
                result_digest=json_digest('"ok"'),
            ),
        ),
    )
    messages = history_messages([completed_run, aborted_run])
    assert [(m.role, m.text) for m in messages] == [
        ("user", "hello"),
        ("assistant", ""),
        ("tool", '"ok"'),
        ("assistant", "hi"),
        ("user", "pay twice"),
    ]
    assert all(m.call_id not in ("d1", "d2") for m in messages)
    assert Message("tool", "x", call_id="c").to_json()["call_id"] == "c"
