"""The seed's refund flow as a settled app (issue 18 item 4): collect an amount, get a supervisor's approval, refund.

``settled worker --app refund_app:app`` with this folder on ``PYTHONPATH`` and the supervisor's Ed25519 public key
(base64 of the raw 32 bytes) in ``REFUND_APPROVER_PUBLIC_KEY``; `run.py` does all of it. Offline: the "model" is a
`ScriptedProvider` that reads a number from the user's text (the extraction) and answers a reply node with a fixed
sentence; no network is used. The refund tool is idempotent: it keys the refund by ``call.idempotency_key``, so a
refund interrupted and run again takes effect once.
"""

from __future__ import annotations

import os
import re
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
    ToolCall,
    action,
    collect,
    reply,
)

APPROVER_KEY_ID = "supervisor-1"


def offline_model(request: ModelRequest) -> list[Any]:
    """The scripted model: an extraction answers the first number of the user's text; a reply node a sentence."""
    system, user = request.messages[0].text, request.messages[-1].text
    if system.startswith("Extract"):
        number = re.search(r"\d+(?:\.\d+)?", user)
        return [ModelResponse("{}" if number is None else f'{{"amount": {number.group()}}}', model="offline")]
    if system.startswith("Tell the customer the refund was processed"):
        return [ModelResponse("Your refund has been approved and processed.", model="offline")]
    return [ModelResponse("A supervisor declined the refund.", model="offline")]


app = App(
    agent=None,
    approver_keys={APPROVER_KEY_ID: os.environ.get("REFUND_APPROVER_PUBLIC_KEY", "")},
)


@app.tool(idempotent=True, description="Issue a refund to the customer")
def process_refund(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Refund ``args["amount"]`` once per idempotency key (a payment provider would dedupe by it)."""
    return {"refunded": args["amount"], "refund_id": f"rf_{call.idempotency_key[:12]}"}


async def issue_refund(state: dict[str, Any], ctx: RunContext) -> Goto | Handoff:
    """Pause for a supervisor's approval (a durable wait), then refund exactly once."""
    amount = state["amount"]
    decision = await ctx.approve(f"Approve a refund of {amount}?", f"The customer asked for a refund of {amount}.")
    if not decision.approved:
        return Goto("declined")
    receipt = await ctx.tool("process_refund", {"amount": amount})
    return Goto("confirmed", {"receipt": receipt})


app.flow(
    Flow(
        "refund",
        description="Collect a refund amount, get a supervisor's approval, then refund",
        start="collect_amount",
        nodes=[
            collect(
                "collect_amount",
                schema={"type": "object", "properties": {"amount": {"type": "number"}}},
                required=["amount"],
                ask=lambda missing: f"What {' and '.join(missing)} should the refund be for?",
                next="issue_refund",
            ),
            action("issue_refund", issue_refund),
            reply("confirmed", "Tell the customer the refund was processed, then end.", next=End("refunded")),
            reply("declined", "Tell the customer a supervisor declined the refund, then end.", next=End("declined")),
        ],
        provider=ScriptedProvider(offline_model),
    )
)
