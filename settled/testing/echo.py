"""The echo app of tests and benchmarks: replies with its input after an optional delay (issue 5's run body).

Run it with ``settled worker --app settled.testing.echo:app`` (`ECHO_APP`). It is a test app: crafted input makes
it raise or end its process (see `EchoAgent`), so a production worker never runs it by default.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from settled._failpoints import failpoint
from settled.runtime._app import App
from settled.runtime._context import RunContext

__all__ = ["ECHO_APP", "EchoAgent", "app"]

#: The ``--app`` reference of this module's `app`.
ECHO_APP = "settled.testing.echo:app"


class EchoAgent:
    """Reply ``{"echo": <input>, "attempt": n}``; wait ``delay_s`` first (an abort cancels the wait).

    A test may make it misbehave through its input: ``{"raise": "message"}`` raises every attempt, and
    ``{"exit": code}`` ends the whole process (``os._exit``), as a poison submission would.

    Args:
        delay_s: Seconds to wait before replying (read per run from ``SETTLED_ECHO_DELAY_S`` when None).
    """

    def __init__(self, delay_s: float | None = None) -> None:
        self.delay_s = delay_s

    async def __call__(self, ctx: RunContext) -> Any:
        """Run once; see the class docstring."""
        value = ctx.input
        if isinstance(value, dict) and "exit" in value:
            os._exit(int(value["exit"]))
        if isinstance(value, dict) and "raise" in value:
            raise RuntimeError(str(value["raise"]))
        delay_s = self.delay_s if self.delay_s is not None else float(os.environ.get("SETTLED_ECHO_DELAY_S", "0"))
        if isinstance(value, dict) and "delay_s" in value:
            delay_s = float(value["delay_s"])
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        failpoint("echo.before_reply")  # on the run's thread: the reply is ready, the worker has not seen it yet
        return {"echo": value, "attempt": ctx.attempt}


#: ``settled worker --app settled.testing.echo:app``
app = App(agent=EchoAgent())
