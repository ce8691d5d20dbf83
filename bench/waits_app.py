"""settled side of ``bench/waits.py``: a plain turn, or a turn that waits durably for a signal.

``settled worker --app bench.waits_app:app`` (from the repository root, which must be on ``PYTHONPATH``). The
submission's input is ``{"wait": false}`` (reply at once: the baseline turn) or ``{"wait": true}`` (``await
ctx.signal("go")``, then reply with the delivered payload: the run is suspended, holding no worker slot, until the
signal is canonical).
"""

from __future__ import annotations

from typing import Any

from settled.runtime import App, RunContext

SIGNAL_NAME = "go"
"""The signal a waiting turn waits for."""


async def agent(ctx: RunContext) -> dict[str, Any]:
    """Reply at once, or after the ``go`` signal when the input asks to wait (module doc)."""
    if ctx.input.get("wait"):
        return {"got": await ctx.signal(SIGNAL_NAME)}
    return {"echo": ctx.input}


#: Up to 64 runs at once; a suspended run holds no slot, so 10,000 of them fit.
app = App(agent=agent, concurrency=64)
