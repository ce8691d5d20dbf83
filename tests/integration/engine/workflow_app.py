"""The workflow tests' app (issue 17): the seed's invoice workflow, with steps that count what they do.

Every run of a step body is a row in ``step_runs`` of the world database (path in ``ENGINE_WORLD_DB``, shared with
`tests/integration/engine/engine_app.py`), with what the body saw: ``previous``, ``last_checkpoint`` and
``get_state()``. Each body logs a line, commits a checkpoint ``{"at": <step>}``, then hits the failpoint
``wftest.in_<step>`` (a test kills the worker there: inside the step, after its checkpoint, before its result) and
returns its result.

Retries (issue 17 item 3): ``flaky`` fails its first two executions then passes; ``broken`` always fails (one retry
allowed); ``hung``'s first execution blocks until the test creates the file ``<world db>.release`` (past its 1 s
``step_timeout``), then tries to log and returns "late", writing what happened to ``wf_runs`` as step ``hung-late``.

Approvals and pauses (issue 17 item 2): the seed's ``send-payment`` (``calculate``, then ``send-money`` which
requires approval; each body writes a run as in the invoice) in four variants: ``pay-yes`` and ``pay-no`` (fail on
denial) answered by an ``on_approval_needed`` that writes its call to ``wf_runs`` as step ``ask`` and answers True /
False; ``pay-person`` whose callback answers None (a person decides); ``pay-cli`` without a callback. ``paused``
has three steps; ``first`` blocks until the test creates ``<world db>.go-<task>`` (so a pause sent meanwhile takes
effect at the boundary after it).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from settled._failpoints import failpoint
from settled.runtime import App, Step, StepContext, Workflow
from tests.integration.engine.engine_app import APPROVER_KEY_ID, RESOLVER_PUBLIC_B64, WORLD_ENV

_SCHEMA = "CREATE TABLE IF NOT EXISTS wf_runs (task TEXT, step TEXT, seen TEXT)"

#: Each step's result, by step name.
RESULTS: dict[str, Any] = {
    "extract": {"total": 120, "vendor": "acme"},
    "validate": {"valid": True},
    "save": {"saved": True, "id": "inv_123"},
    "notify": {"notified": True},
}


def _world() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ[WORLD_ENV], timeout=30, isolation_level=None)
    db.execute(_SCHEMA)
    return db


def runs(path: str, task_id: str) -> list[tuple[str, dict[str, Any]]]:
    """Return the step bodies' runs of a task, in order: (step, what it saw).

    Args:
        path: The world database.
        task_id: The task.

    Returns:
        The runs.
    """
    db = sqlite3.connect(path, timeout=30)
    try:
        db.execute(_SCHEMA)
        rows = db.execute("SELECT step, seen FROM wf_runs WHERE task = ? ORDER BY rowid", (task_id,)).fetchall()
    finally:
        db.close()
    return [(step, json.loads(seen)) for step, seen in rows]


def _body(name: str) -> Any:
    async def body(ctx: StepContext) -> Any:
        state = ctx.get_state()
        seen = {
            "previous": ctx.previous,
            "last_checkpoint": ctx.last_checkpoint,
            "state": [state.step, state.current_step, state.total_steps, state.attempt],
            "input": ctx.input,
        }
        db = _world()
        try:
            db.execute("INSERT INTO wf_runs VALUES (?, ?, ?)", (ctx.task_id, name, json.dumps(seen)))
        finally:
            db.close()
        ctx.log(f"{name} running")
        await ctx.checkpoint({"at": name})
        failpoint(f"wftest.in_{name}")
        return RESULTS[name]

    return body


def _note(task_id: str, step: str, seen: Any) -> int:
    """Write a run of a body; return how many runs of that step the task had before."""
    db = _world()
    try:
        (before,) = db.execute("SELECT count(*) FROM wf_runs WHERE task = ? AND step = ?", (task_id, step)).fetchone()
        db.execute("INSERT INTO wf_runs VALUES (?, ?, ?)", (task_id, step, json.dumps(seen)))
    finally:
        db.close()
    return int(before)


def flaky(ctx: StepContext) -> Any:
    if _note(ctx.task_id, "flaky", {"retry": ctx.get_state().retry}) < 2:
        raise ValueError("flaky: not yet")
    return {"flaky": "ok"}


def broken(ctx: StepContext) -> Any:
    _note(ctx.task_id, "broken", {"retry": ctx.get_state().retry})
    raise KeyError("broken: always")


def hung(ctx: StepContext) -> Any:
    if _note(ctx.task_id, "hung", {"retry": ctx.get_state().retry}) == 0:
        release = Path(os.environ[WORLD_ENV] + ".release")
        while not release.exists():  # the test's barrier: it creates the file once the run settled
            time.sleep(0.05)
        try:
            ctx.log("too late")
            outcome = "logged"
        except RuntimeError as exc:
            outcome = str(exc)
        _note(ctx.task_id, "hung-late", {"log": outcome})
        return "late"
    return "on time"


retries = Workflow(
    "retries",
    steps=[Step("flaky", flaky)],
    retry_backoff=timedelta(milliseconds=200),
)
exhausted = Workflow("exhausted", steps=[Step("broken", broken)], max_retries=1, retry_backoff=timedelta(0))
timeouts = Workflow(
    "timeouts", steps=[Step("hung", hung)], step_timeout=timedelta(seconds=1), retry_backoff=timedelta(0)
)

invoice = Workflow("process-invoice", steps=[Step(n, _body(n), description=f"{n} the invoice") for n in RESULTS])

PAYMENT: dict[str, Any] = {"calculate": {"amount": 10000, "recipient": "vendor@acme.com"}, "send-money": {"txn": "abc"}}


def _pay(name: str) -> Any:
    def body(ctx: StepContext) -> Any:
        _note(ctx.task_id, name, {"previous": ctx.previous, "state": ctx.get_state().attempt})
        failpoint(f"wftest.in_{name}")
        return PAYMENT[name]

    return body


def _answer(value: bool | None) -> Any:
    def on_approval_needed(step: Step) -> bool | None:
        _note("ask", step.name, {"description": step.description, "answer": value})
        return value

    return on_approval_needed


def _payment(name: str, answer: Any, on_denial: Any = "pause") -> Workflow:
    steps = [
        Step("calculate", _pay("calculate")),
        Step("send-money", _pay("send-money"), description="Send $10,000 to vendor@acme.com", requires_approval=True),
    ]
    return Workflow(name, steps=steps, on_approval_needed=answer, on_denial=on_denial)


def _blocked(ctx: StepContext) -> Any:
    _note(ctx.task_id, "first", None)
    go = Path(f"{os.environ[WORLD_ENV]}.go-{ctx.task_id}")
    while not go.exists():  # the test's barrier: it creates the file once its pause is applied
        time.sleep(0.05)
    return 1


def _plain(name: str) -> Any:
    def body(ctx: StepContext) -> Any:
        _note(ctx.task_id, name, None)
        return name

    return body


paused = Workflow(
    "paused", steps=[Step("first", _blocked), Step("second", _plain("second")), Step("third", _plain("third"))]
)

#: Two attempts: a death is charged (the kill tests need one more attempt), a retry's wake-up is not, so ``flaky``'s
#: three executions (two retries) within ``max_attempts=2`` show that only deaths count.
app = App(agent=None, max_attempts=2, approver_keys={APPROVER_KEY_ID: RESOLVER_PUBLIC_B64})
app.workflow(invoice)
app.workflow(retries)
app.workflow(exhausted)
app.workflow(timeouts)
app.workflow(_payment("pay-yes", _answer(True)))
app.workflow(_payment("pay-no", _answer(False), on_denial="fail"))
app.workflow(_payment("pay-person", _answer(None)))
app.workflow(_payment("pay-cli", None))
app.workflow(paused)
