"""Restate side of ``bench/side_by_side.py``: one workflow of K durable steps (``ctx.run_typed``), served by hypercorn.

Runs in the peers' venv (``bench/peers/install.sh``), never in settled's: ``hypercorn restate_app:app``. The request is
``{"k": K}``; a crash case adds ``"counter"`` (a file each step execution appends a line to, fsynced),
``"sleep_step"`` and ``"sleep_s"`` (that step sleeps that many seconds before returning).
"""

from __future__ import annotations

import os
import time
from typing import Any

import restate

turn = restate.Workflow("Turn")


def step_body(index: int, value: str, counter: str | None, sleep_step: int, sleep_s: float) -> str:
    """One durable step: an identity function on ``value``; see the module docstring for the crash-case fields."""
    if counter:
        with open(counter, "a", encoding="utf-8") as out:
            out.write(f"step {index}\n")
            out.flush()
            os.fsync(out.fileno())
    if index == sleep_step:
        time.sleep(sleep_s)
    return value


@turn.main()
async def run(ctx: restate.WorkflowContext, req: dict[str, Any]) -> str:
    """A turn: K steps, each journaled by Restate before the next starts."""
    value = "hello"
    for index in range(1, int(req["k"]) + 1):
        value = await ctx.run_typed(
            f"step-{index}",
            step_body,
            restate.RunOptions(),
            index=index,
            value=value,
            counter=req.get("counter"),
            sleep_step=int(req.get("sleep_step", 0)),
            sleep_s=float(req.get("sleep_s", 0.0)),
        )
    return value


app = restate.app([turn])
