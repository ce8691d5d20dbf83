"""The apps of the tool-approval engine tests (issue 16 item 5): tools that need approval, counted in the world.

Every invocation of a tool here is a row in the engine tests' world database (``invocations``, as the engine app's
doubles write it), so a test counts how often each tool ran across killed and restarted worker processes.

* ``refund`` needs approval for every call (``needs_approval=True``); ``refund_capped`` asks only above 100
  (``approval_policy``); ``close_account`` is denied by its policy; ``lookup`` (``sleep_s`` optional) needs none.
* ``app`` is action code following a plan in its input (``{"plan": [op, ...]}``): ``{"tool": name, "args": {...}}``
  → the result, or ``{"denied": [tool, by, reason]}`` for a caught `ToolApprovalDeniedError` (with
  ``"uncaught": true`` the denial propagates); ``{"gather": [op, ...]}`` → those calls in parallel.
* ``model_app`` is the `ModelAgent` over the engine model app's scripted provider (its script in the input).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from settled.runtime import (
    App,
    ModelAgent,
    RunContext,
    RunOptions,
    ScriptedProvider,
    ToolApprovalDeniedError,
    ToolCall,
)
from tests.integration.engine import model_app as engine_model_app
from tests.integration.engine.engine_app import APPROVER_KEY_ID, RESOLVER_KEY_ID, RESOLVER_PUBLIC_B64, world

OPTIONS = RunOptions(abort_grace_s=1.0, retry_backoff_s=0.05, settle_linger_s=0)


def _invoked(tool: str, call: ToolCall) -> None:
    with world() as db:
        db.execute(
            "INSERT INTO invocations VALUES (?, ?, ?, ?, ?)",
            (tool, call.idempotency_key, call.owner_epoch, call.submission_id, call.attempt),
        )


async def _plan_agent(ctx: RunContext) -> Any:
    plan = ctx.input.get("plan", []) if isinstance(ctx.input, dict) else []
    results: list[Any] = []
    for op in plan:
        if "gather" in op:
            results.append(list(await asyncio.gather(*(_call(ctx, o) for o in op["gather"]))))
        else:
            results.append(await _call(ctx, op))
    return {"results": results}


def _call(ctx: RunContext, op: dict[str, Any]) -> Any:
    call = ctx.tool(op["tool"], op.get("args", {}))  # the ordinal is taken here, in plan order

    async def outcome() -> Any:
        try:
            return await call
        except ToolApprovalDeniedError as exc:
            if op.get("uncaught"):
                raise
            return {"denied": [exc.tool, exc.by, exc.reason]}

    return outcome()


app = App(
    agent=_plan_agent,
    resolver_keys={RESOLVER_KEY_ID: RESOLVER_PUBLIC_B64},
    approver_keys={APPROVER_KEY_ID: RESOLVER_PUBLIC_B64},
    max_attempts=3,
    options=OPTIONS,
)


@app.tool(timeout_s=10, needs_approval=True, parallel_safe=True)
def refund(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Refund an amount to the customer (not idempotent; every call needs a person's approval)."""
    _invoked("refund", call)
    return {"refunded": int(args["amount"])}


@app.tool(timeout_s=10, approval_policy=lambda args: "ask" if int(args["amount"]) > 100 else "allow")
def refund_capped(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Refund an amount; a person approves amounts above 100."""
    _invoked("refund_capped", call)
    return {"refunded": int(args["amount"])}


@app.tool(timeout_s=10, approval_policy=lambda args: "deny")
def close_account(args: dict[str, Any], call: ToolCall) -> str:
    """Close the customer's account (denied by policy)."""
    _invoked("close_account", call)
    return "closed"


@app.tool(idempotent=True, timeout_s=10, parallel_safe=True)
def lookup(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Look an order up (read-only; sleeps ``sleep_s`` first when given)."""
    time.sleep(float(args.get("sleep_s", 0)))
    _invoked("lookup", call)
    return {"order": args["order"]}


model_app = App(
    agent=ModelAgent(ScriptedProvider(engine_model_app._script), model="scripted-1"),
    resolver_keys=app.resolver_keys,
    approver_keys=app.approver_keys,
    tools=app.tools,
    options=RunOptions(abort_grace_s=1.0),
)
