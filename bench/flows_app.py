"""settled side of ``bench/flows.py`` (issue 18): a 3-node flow, and a plain turn calling the same node bodies.

``settled worker --app bench.flows_app:app`` (from the repository root, which must be on ``PYTHONPATH``). The flow
``three-nodes`` is ``collect`` (the order id and amount from the JSON input) → ``action`` (`work` as one durable
``ctx.step``) → ``reply`` (one recorded model call to a scripted provider); the agent (a plain turn, the baseline)
calls the same bodies in-process and replies with the same dict.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from settled.runtime import (
    App,
    End,
    Flow,
    Goto,
    Message,
    ModelRequest,
    ModelResponse,
    RunContext,
    ScriptedProvider,
    action,
    collect,
    reply,
)
from settled.runtime._model import ScriptStep

SCHEMA = {"type": "object", "properties": {"order": {"type": "integer"}, "amount": {"type": "number"}}}
REQUIRED = ("order", "amount")
INSTRUCTIONS = "Tell the customer the refund was processed."
ANSWER = "Your refund is on its way."


def work(state: dict[str, Any]) -> dict[str, Any]:
    """The action's body: a digest of the state (microseconds of CPU, no I/O)."""
    return {"digest": hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]}


def script(request: ModelRequest) -> list[ScriptStep]:
    """The scripted model: one fixed answer."""
    return [ModelResponse(ANSWER, model="scripted-1")]


def run_in_process(value: Any) -> dict[str, Any]:
    """The three nodes' bodies called in-process (the in-process figure): the flow's reply, without durability."""
    state = {name: value[name] for name in SCHEMA["properties"] if name in value}
    state["receipt"] = work(dict(state))
    (response,) = script(ModelRequest("in-process", "default", (Message("system", INSTRUCTIONS),)))
    assert isinstance(response, ModelResponse)
    return {
        "flow": "three-nodes",
        "status": "completed",
        "outcome": "refunded",
        "node": "confirmed",
        "messages": [response.text],
        "state": state,
    }


async def _refund(state: dict[str, Any], ctx: RunContext) -> Goto:
    receipt = await ctx.step("work", work, state)
    return Goto("confirmed", {"receipt": receipt})


async def agent(ctx: RunContext) -> dict[str, Any]:
    """A plain turn: the same bodies in-process, no durable step or model call (the baseline turn)."""
    return run_in_process(ctx.input)


app = App(agent=agent, concurrency=16)
app.flow(
    Flow(
        "three-nodes",
        description="collect, action, reply",
        start="collect",
        nodes=[
            collect("collect", SCHEMA, REQUIRED, "Which order, and how much?", next="refund"),
            action("refund", _refund),
            reply("confirmed", INSTRUCTIONS, next=End("refunded")),
        ],
        provider=ScriptedProvider(script),
    )
)
