"""settled side of ``bench/workflows.py`` (issue 17): a 5-step workflow, and a plain turn calling the same functions.

``settled worker --app bench.workflows_app:app`` (from the repository root, which must be on ``PYTHONPATH``). The
workflow ``five-steps`` runs `STEPS` as durable workflow steps; the agent (a plain turn, the baseline) calls the same
five functions in-process and replies with the same dict.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from settled.runtime import App, RunContext, Step, StepContext, Workflow


def _work(name: str, previous: dict[str, Any], value: Any) -> dict[str, Any]:
    """A small step body: a digest of its input and the results before it (microseconds of CPU, no I/O)."""
    digest = hashlib.sha256(json.dumps([name, previous, value], sort_keys=True).encode()).hexdigest()
    return {"step": name, "digest": digest[:16]}


STEP_NAMES = ("extract", "validate", "enrich", "save", "notify")


def _step(name: str) -> Any:
    def body(ctx: StepContext) -> dict[str, Any]:
        return _work(name, ctx.previous, ctx.input)

    return body


def run_in_process(value: Any) -> dict[str, Any]:
    """The same five functions called in-process, in order (the in-process figure)."""
    results: dict[str, Any] = {}
    for name in STEP_NAMES:
        results[name] = _work(name, dict(results), value)
    return results


async def agent(ctx: RunContext) -> dict[str, Any]:
    """A plain turn: the five functions in-process, no durable steps (the baseline turn)."""
    return run_in_process(ctx.input)


app = App(agent=agent, concurrency=16)
app.workflow(Workflow("five-steps", steps=[Step(n, _step(n)) for n in STEP_NAMES]))
