"""Joining at the model boundary without Kafka (issue 22 item 2): what each model call sees of the joined inputs.

The owner's side (`AgentRun.join`) is a stand-in that answers each request from a list: the runtime asks it before
each model call it makes live, waits for its answer (the committed `SubmissionsJoined`), and shows every joined input
from then on, once each; the inputs earlier attempts joined come in `AgentRun.joined`.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from typing import Any

from settled.processors import AgentRun
from settled.processors._conductor import JoinedInputs
from settled.runtime import App, ModelAgent, ModelRequest, ModelResponse, RunOptions, ScriptedProvider, ToolCall
from settled.runtime import declared_call as declared
from settled.runtime._model import ScriptStep
from settled.schemas import ToolCallSettled, canonical_json
from tests.unit.runtime.test_context import Recorder, attempt, run

B = ("B", canonical_json("also: and B"))
D = ("D", canonical_json({"d": 1}))


def _script(request: ModelRequest) -> list[ScriptStep]:
    if not any(m.role == "assistant" for m in request.messages):
        return [ModelResponse("", (declared("c1", "charge", {"amount": 5}),), model="m1")]
    return [ModelResponse("Done.", model="m1")]


def _app(provider: ScriptedProvider) -> App:
    app = App(agent=ModelAgent(provider, model="m1"), resolver_keys={"k": "x"}, options=RunOptions())

    @app.tool(idempotent=True)
    def charge(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
        """Charge an amount."""
        return {"charged": args["amount"]}

    return app


class Owner:
    """Answers the run's join requests in order from ``answers``, and remembers the ordinals asked."""

    def __init__(self, *answers: JoinedInputs) -> None:
        self.answers = list(answers)
        self.asked: list[int] = []

    def __call__(self, response_ordinal: int) -> Future[JoinedInputs]:
        self.asked.append(response_ordinal)
        fut: Future[JoinedInputs] = Future()
        fut.set_result(self.answers.pop(0) if self.answers else ())
        return fut


def _joining(run_: AgentRun, owner: Owner, joined: JoinedInputs = ()) -> AgentRun:
    return dataclasses.replace(run_, joinable=lambda: bool(owner.answers), join=owner, joined=joined)


def _user_texts(request: ModelRequest) -> list[str]:
    return [m.text for m in request.messages if m.role == "user"]


def test_joined_inputs_reach_the_call_they_were_joined_at_and_every_later_one_once_each_in_order() -> None:
    provider, rec, owner = ScriptedProvider(_script), Recorder(), Owner((B,), (D,))
    assert run(_app(provider), _joining(attempt(rec), owner)) == canonical_json("Done.")
    first, second = provider.prompts
    assert owner.asked == [0, 2]  # before each live model call (ordinal 1 is the tool call)
    assert _user_texts(first) == [canonical_json({"x": 1}), "also: and B"]
    assert _user_texts(second) == [canonical_json({"x": 1}), "also: and B", canonical_json({"d": 1})]
    assert [m.role for m in second.messages] == ["user", "assistant", "tool", "user", "user"]


def test_replay_asks_no_join_and_calls_no_model() -> None:
    provider, rec, owner = ScriptedProvider(_script), Recorder(), Owner((B,))
    first = run(_app(provider), _joining(attempt(rec), owner))
    again, later = Recorder(), Owner((D,))
    assert run(_app(provider), _joining(attempt(again, rec.events, n=2), later, joined=(B,))) == first
    assert later.asked == [] and len(provider.prompts) == 2 and again.batches == []


def test_a_call_made_again_after_a_crash_shows_what_earlier_attempts_joined_once() -> None:
    provider, rec, owner = ScriptedProvider(_script), Recorder(), Owner((), (B,))  # B queued behind the second call
    run(_app(provider), _joining(attempt(rec), owner))
    # The crash came after B's join (at the second call) was canonical and before that call's response was.
    settled_at = next(i for i, e in enumerate(rec.events) if isinstance(e, ToolCallSettled))
    journal = rec.events[: settled_at + 1]
    provider.prompts.clear()
    again, later = Recorder(), Owner()
    assert run(_app(provider), _joining(attempt(again, journal, n=2), later, joined=(B,))) == canonical_json("Done.")
    (retried,) = provider.prompts
    assert later.asked == []  # nothing new is queued: the call made again asks nothing
    assert _user_texts(retried) == [canonical_json({"x": 1}), "also: and B"]
