"""Workflows without Kafka (issue 17 item 1): records go to an in-memory recorder; a new attempt gets them back.

The recorder stands where the conductor stands (`AgentRun.record`), as in `tests/unit/runtime/test_context.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import pytest

from settled.processors import AgentRun, CancelSignal, RunFailedError
from settled.protocol import workflow_input
from settled.runtime import App, Step, StepContext, Workflow
from settled.schemas import LogEvent, StepRecorded, canonical_json


class Recorder:
    """Commits every batch at once; ``batches`` is the log in order."""

    def __init__(self) -> None:
        self.batches: list[tuple[LogEvent, ...]] = []

    def __call__(self, events: Sequence[LogEvent]) -> Future[None]:
        self.batches.append(tuple(events))
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @property
    def events(self) -> list[LogEvent]:
        return [e for b in self.batches for e in b]

    def names(self) -> list[str]:
        return [e.name for e in self.events if isinstance(e, StepRecorded)]


def attempt(recorder: Recorder, n: int, input_value: Any, journal: Sequence[LogEvent] = ()) -> AgentRun:
    return AgentRun(
        conversation_id="wf:w:t",
        submission_id="s1",
        attempt_id=f"a{n}",
        attempt=n,
        input_json=canonical_json(input_value),
        owner_epoch=1,
        cancelled=CancelSignal(),
        run_id="s1",
        tools_offered=(),
        journal=tuple(journal),
        record=recorder,
    )


def test_a_resumed_run_skips_recorded_steps_and_sees_previous_and_its_last_checkpoint() -> None:
    seen: list[tuple[str, Any, Any, int]] = []
    crash = {"on": True}

    async def first(ctx: StepContext) -> Any:
        seen.append(("first", ctx.previous, ctx.last_checkpoint, ctx.get_state().attempt))
        return {"n": 1}

    async def second(ctx: StepContext) -> Any:
        seen.append(("second", ctx.previous, ctx.last_checkpoint, ctx.get_state().attempt))
        start = (ctx.last_checkpoint or {}).get("page", 0)
        for page in range(start, 3):
            ctx.log(f"page {page}")
            await ctx.checkpoint({"page": page + 1})
            if crash["on"] and page == 1:
                raise RuntimeError("crash")
        return {"pages": 3}

    app = App(agent=None, max_attempts=3)
    app.workflow(Workflow("w", steps=[Step("first", first), Step("second", second)]))
    envelope = workflow_input("w", "t", {"x": 1})
    recorder = Recorder()
    with pytest.raises(RuntimeError, match="crash"):
        app.runner()(attempt(recorder, 1, envelope))
    assert recorder.names() == [
        "step:first",
        "log:second",
        "checkpoint:second",
        "log:second",
        "checkpoint:second",
    ]
    crash["on"] = False
    reply = app.runner()(attempt(recorder, 2, envelope, recorder.events))
    assert reply == canonical_json({"first": {"n": 1}, "second": {"pages": 3}})
    assert seen == [
        ("first", {}, None, 1),
        ("second", {"first": {"n": 1}}, None, 1),
        ("second", {"first": {"n": 1}}, {"page": 2}, 2),  # resumed at its last checkpoint; first never ran again
    ]
    steps = [e for e in recorder.events if isinstance(e, StepRecorded)]
    assert len({e.ordinal for e in steps}) == len(steps), "every record has its own ordinal"
    assert [e.name for e in steps][-3:] == ["log:second", "checkpoint:second", "step:second"]


def test_sync_bodies_and_state() -> None:
    def only(ctx: StepContext) -> Any:
        state = ctx.get_state()
        return [ctx.input, state.step, state.current_step, state.total_steps, ctx.task_id, ctx.workflow]

    app = App(agent=None)
    app.workflow(Workflow("w", steps=[Step("a", lambda ctx: 1), Step("b", only)]))
    reply = app.runner()(attempt(Recorder(), 1, workflow_input("w", "t", "in")))
    assert reply == canonical_json({"a": 1, "b": ["in", "b", 2, 2, "t", "w"]})


def test_an_unknown_workflow_or_a_missing_agent_fails_without_retry() -> None:
    app = App(agent=None)
    with pytest.raises(RunFailedError, match="'nope'") as unknown:
        app.runner()(attempt(Recorder(), 1, workflow_input("nope", "t", None)))
    assert unknown.value.error_type == "unknown_workflow" and unknown.value.non_retryable
    with pytest.raises(RunFailedError, match="no agent") as no_agent:
        app.runner()(attempt(Recorder(), 1, "hello"))
    assert no_agent.value.error_type == "no_agent"
    with pytest.raises(RunFailedError, match=r"input\.settled_workflow\.name") as bad:
        app.runner()(attempt(Recorder(), 1, {"settled_workflow": {"task_id": "t"}}))
    assert bad.value.error_type == "bad_workflow_input"


def test_the_agent_still_runs_what_names_no_workflow() -> None:
    async def agent(ctx: Any) -> Any:
        return {"agent": ctx.input}

    app = App(agent=agent)
    app.workflow(Workflow("w", steps=[Step("a", lambda ctx: 1)]))
    assert app.runner()(attempt(Recorder(), 1, "hi")) == canonical_json({"agent": "hi"})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": []}, "steps must not be empty"),
        ({"steps": [Step("a", print), Step("a", print)]}, r"step names \['a'\] repeat"),
        ({"max_retries": -1}, "max_retries must be >= 0, got -1"),
        ({"step_timeout": timedelta(0)}, "step_timeout must be positive"),
        ({"on_denial": "ignore"}, "on_denial must be 'pause' or 'fail', got 'ignore'"),
    ],
)
def test_workflow_refuses_bad_values_naming_them(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"steps": [Step("a", print)], **kwargs}
    with pytest.raises(ValueError, match=message):
        Workflow("w", **args)


def test_names_and_registration() -> None:
    with pytest.raises(ValueError, match=r"Step\.name 'a b'"):
        Step("a b", print)
    app = App(agent=None)
    app.workflow(Workflow("w", steps=[Step("a", print)]))
    with pytest.raises(ValueError, match="'w' is already registered"):
        app.workflow(Workflow("w", steps=[Step("a", print)]))
