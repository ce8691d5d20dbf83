"""The flow tests' app (issue 18): the seed's refund flow without its approval, over the engine app's tool doubles.

``collect_amount`` takes ``amount`` from the turn's JSON input or, from a text input, through one recorded model
call (the scripted provider answers ``{"amount": 30}`` to a text naming "thirty", ``{}`` otherwise);
``issue_refund`` calls ``charge_idem`` (counted in the world database of
`tests/integration/engine/engine_app.py`); ``confirmed`` is one recorded model call; the flow ends ``refunded``.
"""

from __future__ import annotations

from typing import Any

from settled.runtime import (
    App,
    End,
    Flow,
    Goto,
    ModelRequest,
    ModelResponse,
    RunContext,
    ScriptedProvider,
    action,
    collect,
    reply,
)
from settled.runtime._model import ScriptStep
from tests.integration.engine import engine_app


def _script(request: ModelRequest) -> list[ScriptStep]:
    system, user = request.messages[0].text, request.messages[-1].text
    if system.startswith("Extract"):
        return [ModelResponse('{"amount": 30}' if "thirty" in user else "{}", model="scripted-1")]
    return [ModelResponse("Your refund is on its way.", model="scripted-1")]


async def _issue_refund(state: dict[str, Any], ctx: RunContext) -> Goto:
    receipt = await ctx.tool("charge_idem", {"amount": state["amount"]})
    return Goto("confirmed", {"receipt": receipt})


refund = Flow(
    "refund",
    description="Collect a refund amount, then refund it",
    start="collect_amount",
    nodes=[
        collect(
            "collect_amount",
            schema={"type": "object", "properties": {"amount": {"type": "integer"}}},
            required=["amount"],
            ask=lambda missing: f"What {' and '.join(missing)} should the refund be for?",
            next="issue_refund",
        ),
        action("issue_refund", _issue_refund),
        reply("confirmed", "Tell the customer the refund was processed.", next=End("refunded")),
    ],
    provider=ScriptedProvider(_script),
)

app = App(
    agent=None,
    resolver_keys={engine_app.RESOLVER_KEY_ID: engine_app.RESOLVER_PUBLIC_B64},
    max_attempts=3,
    tools=engine_app.app.tools,
    options=engine_app.OPTIONS,
)
app.flow(refund)
