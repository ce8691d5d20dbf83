"""settled side of ``bench/side_by_side.py``: a turn of K durable steps, each an identity function on ``"hello"``.

``settled worker --app bench.side_by_side_app:app`` (from the repository root, which must be on ``PYTHONPATH``). The
submission's input is ``{"k": K, "kind": "step" | "pure" | "tool"}``: ``step`` runs K ``ctx.step`` calls, ``pure`` K
``ctx.step(..., pure=True)`` calls (posted, issue 24 item 2), ``tool`` K calls of the idempotent ``identity`` tool
(prepared, then settled). A crash case adds ``"counter"`` (a file each step execution
appends a line to, fsynced), ``"sleep_step"`` and ``"sleep_s"`` (that step sleeps that many seconds before it returns).
"""

from __future__ import annotations

import os
import time
from typing import Any

from settled.runtime import App, RunContext, ToolCall


def step_body(index: int, value: str, counter: str | None, sleep_step: int, sleep_s: float) -> str:
    """One durable step's body: return ``value``; log the execution to ``counter`` (fsynced) and sleep if asked.

    Args:
        index: The step's position in the turn, from 1.
        value: What to return.
        counter: A file that gets one line per execution, or ``None``.
        sleep_step: The step that sleeps (0: none).
        sleep_s: How long it sleeps, in seconds.

    Returns:
        ``value``.
    """
    if counter:
        with open(counter, "a", encoding="utf-8") as out:
            out.write(f"step {index}\n")
            out.flush()
            os.fsync(out.fileno())
    if index == sleep_step:
        time.sleep(sleep_s)
    return value


async def agent(ctx: RunContext) -> dict[str, Any]:
    """Run the turn the input describes (see the module docstring) and reply ``{"out": "hello"}``."""
    req = ctx.input
    value = "hello"
    kind = req.get("kind", "step")
    for index in range(1, int(req["k"]) + 1):
        if kind == "tool":
            value = await ctx.tool("identity", {"value": value, "index": index})
        else:
            value = await ctx.step(
                f"step-{index}",
                step_body,
                index,
                value,
                req.get("counter"),
                int(req.get("sleep_step", 0)),
                float(req.get("sleep_s", 0.0)),
                pure=kind == "pure",
            )
    return {"out": value}


#: Up to 64 runs at once per worker, so 50 turns in flight never queue behind the default of 16.
app = App(agent=agent, concurrency=64)


@app.tool(idempotent=True, timeout_s=30)
def identity(args: dict[str, Any], call: ToolCall) -> Any:
    """Return ``args["value"]``."""
    return args["value"]
