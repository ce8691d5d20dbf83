"""Steering at the model boundary without Kafka (issue 22 item 3): what each model call sees, recorded and replayed.

Effects go to the in-memory recorder of ``test_context``; the run's committed journal is a list the test (or a tool,
standing in for the owner committing a steering message mid-run) appends to.
"""

from __future__ import annotations

from typing import Any

from settled.processors import AgentRun
from settled.runtime import App, ModelAgent, ModelRequest, ModelResponse, RunOptions, ScriptedProvider, ToolCall
from settled.runtime import declared_call as declared
from settled.runtime._model import ScriptStep
from settled.schemas import (
    LogEvent,
    ModelResponseCompleted,
    SteeringDelivered,
    SteeringReceived,
    ToolCallSettled,
    canonical_json,
)
from tests.unit.runtime.test_context import Recorder, attempt, run


def _script(request: ModelRequest) -> list[ScriptStep]:
    if not any(m.role == "assistant" for m in request.messages):
        return [ModelResponse("", (declared("c1", "charge", {"amount": 5}),), model="m1")]
    return [ModelResponse("Done.", model="m1")]


def _steering(command_id: str) -> SteeringReceived:
    return SteeringReceived(command_id=command_id, submission_id="s1", text=f"say {command_id}", principal="bob")


def _app(provider: ScriptedProvider, committed: list[LogEvent]) -> App:
    app = App(agent=ModelAgent(provider, model="m1"), resolver_keys={"k": "x"}, options=RunOptions())

    @app.tool(idempotent=True)
    def charge(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
        """Charge an amount; a steering message becomes canonical while it runs."""
        committed.append(_steering("m3"))
        return {"charged": args["amount"]}

    return app


def _with_committed(run_: AgentRun, committed: list[LogEvent]) -> AgentRun:
    return AgentRun(
        conversation_id=run_.conversation_id,
        submission_id=run_.submission_id,
        attempt_id=run_.attempt_id,
        attempt=run_.attempt,
        input_json=run_.input_json,
        owner_epoch=run_.owner_epoch,
        cancelled=run_.cancelled,
        run_id=run_.run_id,
        journal=run_.journal,
        record=run_.record,
        committed=lambda: tuple(committed),
    )


def _user_texts(request: ModelRequest) -> list[str]:
    return [m.text for m in request.messages if m.role == "user"]


def test_each_model_call_sees_the_canonical_steering_no_earlier_call_saw_in_log_order() -> None:
    provider, rec = ScriptedProvider(_script), Recorder()
    committed: list[LogEvent] = [_steering("m1"), _steering("m2")]
    assert run(_app(provider, committed), _with_committed(attempt(rec, committed), committed)) == canonical_json(
        "Done."
    )
    first, second = provider.prompts
    assert _user_texts(first) == [canonical_json({"x": 1}), "say m1", "say m2"]
    # Every later call shows the earlier ones again (they are part of the conversation), each once, then the new.
    assert _user_texts(second) == [canonical_json({"x": 1}), "say m1", "say m2", "say m3"]
    assert [m.role for m in second.messages] == ["user", "assistant", "tool", "user", "user", "user"]
    delivered = rec.of(SteeringDelivered)
    assert [(d.response_ordinal, d.command_ids) for d in delivered] == [(0, ("m1", "m2")), (2, ("m3",))]
    # Each rides with its call's response: recorded in the same commit, just before it.
    for d in delivered:
        batch = next(b for b in rec.batches if d in b)
        after = batch[batch.index(d) + 1]
        assert isinstance(after, ModelResponseCompleted) and after.response_ordinal == d.response_ordinal


def test_replay_shows_a_recorded_call_the_same_steering_and_calls_nothing() -> None:
    provider, rec = ScriptedProvider(_script), Recorder()
    committed: list[LogEvent] = [_steering("m1"), _steering("m2")]
    first = run(_app(provider, committed), _with_committed(attempt(rec, committed), committed))
    journal = [*committed[:2], *rec.events[:-2], committed[2], *rec.events[-2:]]
    again = Recorder()
    later: list[LogEvent] = [*journal, _steering("m4")]  # arrives after the run's last call: nothing shows it
    assert run(_app(provider, later), _with_committed(attempt(again, journal, n=2), later)) == first
    assert len(provider.prompts) == 2 and again.batches == []


def test_a_call_made_again_after_a_crash_sees_its_undelivered_steering_once() -> None:
    provider, rec = ScriptedProvider(_script), Recorder()
    committed: list[LogEvent] = [_steering("m1"), _steering("m2")]
    run(_app(provider, committed), _with_committed(attempt(rec, committed), committed))
    # The crash came before the second response was canonical: the log holds the first call and the tool's result.
    settled_at = next(i for i, e in enumerate(rec.events) if isinstance(e, ToolCallSettled))
    journal = [*committed, *rec.events[: settled_at + 1]]
    provider.prompts.clear()
    again = Recorder()
    assert run(_app(provider, list(journal)), _with_committed(attempt(again, journal, n=2), journal)) == (
        canonical_json("Done.")
    )
    (retried,) = provider.prompts
    assert _user_texts(retried) == [canonical_json({"x": 1}), "say m1", "say m2", "say m3"]
    assert [(d.response_ordinal, d.command_ids) for d in again.of(SteeringDelivered)] == [(2, ("m3",))]
