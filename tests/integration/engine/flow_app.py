"""The flow tests' app (issue 18): the seed's refund flow, over the engine app's tool doubles.

``collect_amount`` takes ``amount`` from the turn's JSON input or, from a text input, through one recorded model
call (the scripted provider answers ``{"amount": 30}`` to a text naming "thirty", ``{}`` otherwise);
``issue_refund`` calls ``charge_idem`` (counted in the world database of
`tests/integration/engine/engine_app.py`); ``confirmed`` is one recorded model call; the flow ends ``refunded``.
The flow ``refund`` has no approval (issue 18 item 1's tests); ``refund-approval`` is the seed's: its
``issue_refund`` asks a supervisor first (``ctx.approve``, decided with the engine app's approver key) and hands
the conversation to a human when denied.

``FLOW_VARIANT`` (the worker's environment) deploys a variant of both flows (issue 18 item 3): ``changed`` raises
``issue_refund``'s version (another digest), ``described`` changes only their descriptions (the same digest).
"""

from __future__ import annotations

import os
from typing import Any

from settled.runtime import (
    App,
    End,
    Flow,
    Goto,
    Handoff,
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


async def _approved_refund(state: dict[str, Any], ctx: RunContext) -> Goto | Handoff:
    decision = await ctx.approve(f"Approve a refund of {state['amount']}?", "The customer asked for a refund.")
    if not decision.approved:
        return Handoff("human", "declined")
    receipt = await ctx.tool("charge_idem", {"amount": state["amount"]})
    return Goto("confirmed", {"receipt": receipt})


def _collect_amount(next_node: str) -> Any:
    return collect(
        "collect_amount",
        schema={"type": "object", "properties": {"amount": {"type": "integer"}}},
        required=["amount"],
        ask=lambda missing: f"What {' and '.join(missing)} should the refund be for?",
        next=next_node,
    )


def flows(variant: str = "") -> tuple[Flow, Flow]:
    """Build the two flows of a deployment variant (module docstring): ``refund`` and ``refund-approval``.

    Args:
        variant: ``""``, ``changed`` or ``described``.

    Returns:
        The flows.
    """
    version = 2 if variant == "changed" else 1
    said = " (described again)" if variant == "described" else ""
    refund = Flow(
        "refund",
        description="Collect a refund amount, then refund it" + said,
        start="collect_amount",
        nodes=[
            _collect_amount("issue_refund"),
            action("issue_refund", _issue_refund, version=version),
            reply("confirmed", "Tell the customer the refund was processed.", next=End("refunded")),
        ],
        provider=ScriptedProvider(_script),
    )
    refund_approval = Flow(
        "refund-approval",
        description="Collect a refund amount, get a supervisor's approval, then refund" + said,
        start="collect_amount",
        nodes=[
            _collect_amount("issue_refund"),
            action("issue_refund", _approved_refund, version=version),
            reply("confirmed", "Tell the customer the refund was processed.", next=End("refunded")),
        ],
        provider=ScriptedProvider(_script),
    )
    return refund, refund_approval


app = App(
    agent=None,
    resolver_keys={engine_app.RESOLVER_KEY_ID: engine_app.RESOLVER_PUBLIC_B64},
    approver_keys={engine_app.APPROVER_KEY_ID: engine_app.RESOLVER_PUBLIC_B64},
    max_attempts=3,
    tools=engine_app.app.tools,
    options=engine_app.OPTIONS,
)
for _flow in flows(os.environ.get("FLOW_VARIANT", "")):
    app.flow(_flow)
