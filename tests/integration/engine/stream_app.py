"""The provisional-stream test app (issue 19 item 2): steps, each followed by a ``ctx.emit`` part.

Input ``{"steps": n}``: emits ``{"at": "start"}``, then for each step ``i`` runs ``ctx.step`` and emits
``{"after": i}``; replies ``{"steps": n}``. A kill at ``engine.after_step_commit`` leaves some steps recorded: the
next attempt replays them without publishing, and publishes from its first live position on.
"""

from __future__ import annotations

from typing import Any

from settled.runtime import App, RunContext


def _work(i: int) -> int:
    return i * i


async def agent(ctx: RunContext) -> dict[str, Any]:
    n = int(ctx.input["steps"])
    ctx.emit({"at": "start"})
    for i in range(n):
        await ctx.step(f"s{i}", _work, i)
        ctx.emit({"after": i})
    return {"steps": n}


app = App(agent=agent)
