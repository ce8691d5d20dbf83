"""Workflows without Kafka (issue 17 item 1): records go to an in-memory recorder; a new attempt gets them back.

The recorder stands where the conductor stands (`AgentRun.record`), as in `tests/unit/runtime/test_context.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from settled.processors import AgentRun, CancelSignal, RunFailedError
from settled.protocol import PAUSE_SIGNAL, pause_wait_id, step_approval_id, workflow_input
from settled.runtime import App, RunCancelledError, RunOptions, Step, StepContext, Workflow
from settled.schemas import (
    InputRef,
    LogEvent,
    SignalReceived,
    StepRecorded,
    StepRetryScheduled,
    WaitKind,
    WaitOutcome,
    WaitRequested,
    WaitResolved,
    canonical_json,
)
from tests._promise import promise

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


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
        """The names of the step records, the run's plan (``workflow``, one per run) left out."""
        return [e.name for e in self.events if isinstance(e, StepRecorded) and e.name != "workflow"]

    def plans(self) -> list[Any]:
        return [json.loads(e.result_json) for e in self.events if isinstance(e, StepRecorded) and e.name == "workflow"]


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


def expired(recorder: Recorder) -> list[LogEvent]:
    """The journal of the next attempt: the record so far plus the expiry of every open wait (the sweeper's)."""
    decided = {e.wait_id for e in recorder.events if isinstance(e, WaitResolved)}
    out = list(recorder.events)
    for e in recorder.events:
        if isinstance(e, WaitRequested) and e.wait_id not in decided:
            out.append(WaitResolved(submission_id="s1", wait_id=e.wait_id, outcome=WaitOutcome.EXPIRED, decided_at=T0))
    return out


def test_a_resumed_run_skips_recorded_steps_and_sees_previous_and_its_last_checkpoint() -> None:
    seen: list[tuple[str, Any, Any, int, int]] = []
    crash = {"on": True}

    async def first(ctx: StepContext) -> Any:
        state = ctx.get_state()
        seen.append(("first", ctx.previous, ctx.last_checkpoint, state.attempt, state.retry))
        return {"n": 1}

    async def second(ctx: StepContext) -> Any:
        state = ctx.get_state()
        seen.append(("second", ctx.previous, ctx.last_checkpoint, state.attempt, state.retry))
        start = (ctx.last_checkpoint or {}).get("page", 0)
        for page in range(start, 3):
            ctx.log(f"page {page}")
            await ctx.checkpoint({"page": page + 1})
            if crash["on"] and page == 1:
                raise RuntimeError("crash")
        return {"pages": 3}

    app = App(agent=None, max_attempts=3, options=RunOptions(clock=lambda: T0))
    app.workflow(Workflow("w", steps=[Step("first", first), Step("second", second)]))
    envelope = workflow_input("w", "t", {"x": 1})
    recorder = Recorder()
    with pytest.raises(RunCancelledError, match="retry:second#1"):
        app.runner()(attempt(recorder, 1, envelope))
    assert recorder.names() == [
        "step:first",
        "log:second",
        "checkpoint:second",
        "log:second",
        "checkpoint:second",
    ]
    crash["on"] = False
    reply = app.runner()(attempt(recorder, 2, envelope, expired(recorder)))
    assert reply == canonical_json({"first": {"n": 1}, "second": {"pages": 3}})
    assert seen == [
        ("first", {}, None, 1, 0),
        ("second", {"first": {"n": 1}}, None, 1, 0),
        ("second", {"first": {"n": 1}}, {"page": 2}, 2, 1),  # resumed at its last checkpoint; first never ran again
    ]
    ordinals = [e.ordinal for e in recorder.events if isinstance(e, (StepRecorded, StepRetryScheduled))]
    assert len(set(ordinals)) == len(ordinals), "every record has its own ordinal (a retry's wait shares its retry's)"
    assert recorder.names()[-3:] == ["log:second", "checkpoint:second", "step:second"]
    # The plan, once per run, committed with the first attempt's first record (the projection's total steps).
    assert recorder.plans() == [{"steps": ["first", "second"], "workflow": "w"}]
    assert recorder.batches[0][0].name == "workflow"  # type: ignore[union-attr]


def test_a_step_failing_twice_then_passing_has_two_canonical_retries_and_one_result() -> None:
    runs: list[int] = []

    def flaky(ctx: StepContext) -> Any:
        runs.append(ctx.get_state().retry)
        if len(runs) <= 2:
            raise ValueError(f"flaky {len(runs)}")
        return "ok"

    wf = Workflow("w", steps=[Step("flaky", flaky)], retry_backoff=timedelta(seconds=2))
    app = App(agent=None, options=RunOptions(clock=lambda: T0))
    app.workflow(wf)
    envelope = workflow_input("w", "t", None)
    recorder = Recorder()
    for n in (1, 2):
        with pytest.raises(RunCancelledError, match=f"retry:flaky#{n}"):
            app.runner()(attempt(recorder, n, envelope, expired(recorder)))
        # the retry and its timed wait are one batch, the run's last (the first also carries the run's plan)
        retry, wait = [e for e in recorder.batches[-1] if not (isinstance(e, StepRecorded) and e.name == "workflow")]
        assert isinstance(retry, StepRetryScheduled) and isinstance(wait, WaitRequested)
        assert (retry.step, retry.retry, retry.error_type, retry.error_message) == (
            "flaky",
            n,
            "ValueError",
            f"flaky {n}",
        )
        backoff_s = 2.0 * 2 ** (n - 1)
        assert T0 + timedelta(seconds=backoff_s) <= retry.wake_at <= T0 + timedelta(seconds=backoff_s * 1.2)
        assert (wait.wait_id, wait.deadline, wait.kind) == (retry.wait_id, retry.wake_at, WaitKind.SIGNAL)
    reply = app.runner()(attempt(recorder, 3, envelope, expired(recorder)))
    assert reply == canonical_json({"flaky": "ok"})
    assert runs == [0, 1, 2]
    assert len([e for e in recorder.events if isinstance(e, StepRetryScheduled)]) == 2
    assert recorder.names() == ["step:flaky"]


def test_exhausted_retries_settle_the_run_failed_with_the_last_error() -> None:
    def broken(ctx: StepContext) -> Any:
        raise KeyError(f"missing {ctx.get_state().retry}")

    app = App(agent=None, options=RunOptions(clock=lambda: T0))
    app.workflow(Workflow("w", steps=[Step("broken", broken)], max_retries=1, retry_backoff=timedelta(0)))
    envelope = workflow_input("w", "t", None)
    recorder = Recorder()
    with pytest.raises(RunCancelledError):
        app.runner()(attempt(recorder, 1, envelope))
    with pytest.raises(RunFailedError, match="missing 1") as failed:
        app.runner()(attempt(recorder, 2, envelope, expired(recorder)))
    assert failed.value.error_type == "KeyError" and failed.value.non_retryable
    assert [e.retry for e in recorder.events if isinstance(e, StepRetryScheduled)] == [1]
    assert recorder.names() == []


def test_a_hung_step_times_out_is_retried_and_its_late_return_changes_nothing() -> None:
    release, finished = threading.Event(), threading.Event()
    late: list[BaseException] = []

    def hung(ctx: StepContext) -> Any:
        if ctx.get_state().retry == 0:
            try:
                release.wait(30)
                ctx.log("too late")
            except RuntimeError as exc:
                late.append(exc)
            finally:
                finished.set()
            return "late"
        return "on time"

    app = App(agent=None, options=RunOptions(clock=lambda: T0))
    app.workflow(
        Workflow("w", steps=[Step("hung", hung)], step_timeout=timedelta(seconds=0.2), retry_backoff=timedelta(0))
    )
    envelope = workflow_input("w", "t", None)
    recorder = Recorder()
    with pytest.raises(RunCancelledError, match="retry:hung#1"):
        app.runner()(attempt(recorder, 1, envelope))
    (retry,) = [e for e in recorder.events if isinstance(e, StepRetryScheduled)]
    assert retry.error_type == "StepTimeoutError" and "step_timeout of 0.2 s" in retry.error_message
    before = list(recorder.events)
    release.set()
    assert finished.wait(10)
    assert len(late) == 1 and "after its execution ended" in str(late[0])
    assert recorder.events == before, "the late return and log recorded nothing"
    reply = app.runner()(attempt(recorder, 2, envelope, expired(recorder)))
    assert reply == canonical_json({"hung": "on time"})


def test_retry_without_its_canonical_record_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches the fault switch ``workflow_retry_unrecorded`` (a retry with no canonical StepRetryScheduled)."""
    runs: list[int] = []

    def flaky(ctx: StepContext) -> Any:
        runs.append(1)
        if len(runs) == 1:
            raise ValueError("once")
        return "ok"

    app = App(agent=None, options=RunOptions(clock=lambda: T0))
    app.workflow(Workflow("w", steps=[Step("flaky", flaky)], retry_backoff=timedelta(0)))
    envelope = workflow_input("w", "t", None)
    recorder = Recorder()
    with contextlib.suppress(RunCancelledError):
        app.runner()(attempt(recorder, 1, envelope))
    retries = [e for e in recorder.events if isinstance(e, StepRetryScheduled)]
    promise(
        "DUR-010.retry-canonical",
        len(retries) == 1 and recorder.names() == [],
        f"the failed execution left {len(retries)} StepRetryScheduled and step records {recorder.names()}; expected "
        "one canonical retry before any second execution",
    )


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


# -- approvals and pauses (issue 17 item 2) -----------------------------------------------------------------------


def _pause_signal(command_id: str, reason: str | None) -> SignalReceived:
    return SignalReceived(
        command_id=command_id,
        submission_id="s1",
        name=PAUSE_SIGNAL,
        payload_json=canonical_json({"reason": reason}),
        principal="ops",
        input_ref=InputRef(topic="t.inbox", partition=0, offset=7),
    )


def test_a_pause_signal_is_honoured_once_at_the_next_step_boundary() -> None:
    ran: list[str] = []

    def body(name: str) -> Any:
        def run(ctx: StepContext) -> Any:
            ran.append(name)
            return name

        return run

    app = App(agent=None, options=RunOptions(clock=lambda: T0))
    app.workflow(Workflow("w", steps=[Step("a", body("a")), Step("b", body("b"))]))
    envelope = workflow_input("w", "t", None)
    recorder = Recorder()
    live: list[LogEvent] = []

    def record(events: Sequence[LogEvent]) -> Future[None]:
        if any(isinstance(e, StepRecorded) and e.name == "step:a" for e in events):
            live.extend([*recorder.events, *events, _pause_signal("p1", "freeze")])  # it commits while a runs
        return recorder(events)

    run = dataclasses.replace(attempt(recorder, 1, envelope), record=record, committed=lambda: tuple(live))
    with pytest.raises(RunCancelledError, match=r"settled\.resume"):
        app.runner()(run)
    assert ran == ["a"]
    (pause,) = [e for e in recorder.events if isinstance(e, WaitRequested)]
    assert pause.wait_id == pause_wait_id("s1", pause.ordinal) and pause.kind is WaitKind.SIGNAL
    assert json.loads(pause.details_json or "null") == {
        "approval_id": None,
        "reason": "freeze",
        "source": "p1",
        "step": "b",
    }
    # Resumed: the next attempt's journal holds the signal and the delivered pause; it is not honoured again.
    journal = [*recorder.events, _pause_signal("p1", "freeze"), _pause_signal("p1", "freeze")]
    journal.append(
        WaitResolved(submission_id="s1", wait_id=pause.wait_id, outcome=WaitOutcome.DELIVERED, decided_at=T0)
    )
    reply = app.runner()(attempt(recorder, 2, envelope, journal))
    assert reply == canonical_json({"a": "a", "b": "b"})
    assert ran == ["a", "b"]


def test_an_approval_answer_other_than_true_false_or_none_is_an_error_naming_it() -> None:
    app = App(agent=None, options=RunOptions(clock=lambda: T0))
    gated = Step("a", lambda ctx: 1, requires_approval=True)
    app.workflow(Workflow("w", steps=[gated], on_approval_needed=lambda step: "yes"))
    recorder = Recorder()
    with pytest.raises(TypeError, match="must return True, False or None, got 'yes'"):
        app.runner()(attempt(recorder, 1, workflow_input("w", "t", None)))
    assert recorder.names() == ["approval-request:a#1"]  # the request was canonical first; no answer recorded


def test_a_denial_under_on_denial_fail_settles_failed_and_the_body_never_runs() -> None:
    ran: list[int] = []
    app = App(agent=None, options=RunOptions(clock=lambda: T0))
    gated = Step("a", lambda ctx: ran.append(1), requires_approval=True)
    app.workflow(Workflow("w", steps=[gated], on_approval_needed=lambda step: False, on_denial="fail"))
    recorder = Recorder()
    with pytest.raises(RunFailedError) as failed:
        app.runner()(attempt(recorder, 1, workflow_input("w", "t", None)))
    assert failed.value.error_type == "approval_denied"
    assert step_approval_id("s1", "a", 1) in str(failed.value)
    assert ran == [] and recorder.names() == ["approval-request:a#1", "approval:a#1"]


def test_on_approval_needed_must_be_callable() -> None:
    with pytest.raises(ValueError, match="on_approval_needed must be callable or None, got 'yes'"):
        Workflow("w", steps=[Step("a", print)], on_approval_needed="yes")  # type: ignore[arg-type]


def test_a_resumed_denial_asks_again_under_a_new_approval_id() -> None:
    """Catches the fault switch ``workflow_denial_replayed`` (a denial read again as the answer after resume)."""
    ran: list[int] = []
    app = App(agent=None, options=RunOptions(clock=lambda: T0))
    gated = Step("a", lambda ctx: ran.append(1) or "sent", description="send", requires_approval=True)
    app.workflow(Workflow("w", steps=[gated]))  # no on_approval_needed: a person decides; a denial pauses
    envelope = workflow_input("w", "t", None)
    recorder = Recorder()

    def decided(wait_id: str, payload: Any) -> WaitResolved:
        return WaitResolved(
            submission_id="s1",
            wait_id=wait_id,
            outcome=WaitOutcome.DELIVERED,
            source_id=f"cmd-{wait_id}",
            payload_json=canonical_json(payload),
            decided_at=T0,
        )

    def last_wait() -> WaitRequested:
        return [e for e in recorder.events if isinstance(e, WaitRequested)][-1]

    denial = {"approved": False, "by": "k1", "principal": "ops", "reason": "no"}
    journal: list[LogEvent] = []
    with pytest.raises(RunCancelledError):
        app.runner()(attempt(recorder, 1, envelope))
    first = last_wait()
    assert first.wait_id == step_approval_id("s1", "a", 1) and first.kind is WaitKind.APPROVAL
    journal = [*recorder.events, decided(first.wait_id, denial)]
    with pytest.raises(RunCancelledError):
        app.runner()(attempt(recorder, 2, envelope, journal))
    pause = last_wait()
    assert pause.name == "settled.resume" and json.loads(pause.details_json or "null")["approval_id"] == first.wait_id
    journal = [*recorder.events, decided(first.wait_id, denial), decided(pause.wait_id, None)]
    with contextlib.suppress(RunCancelledError):
        app.runner()(attempt(recorder, 3, envelope, journal))
    asked = last_wait()
    promise(
        "WAIT-004.denial-not-replayed",
        asked.kind is WaitKind.APPROVAL and asked.wait_id == step_approval_id("s1", "a", 2),
        f"after the resume the run requested {asked.kind.value} {asked.wait_id!r}; expected a new approval request "
        f"{step_approval_id('s1', 'a', 2)!r}, never the earlier denial read again",
    )
    approval = {"approved": True, "by": "k1", "principal": "ops", "reason": None}
    journal = [*recorder.events, *(decided(w, p) for w, p in ((first.wait_id, denial), (pause.wait_id, None)))]
    journal.append(decided(asked.wait_id, approval))
    reply = app.runner()(attempt(recorder, 4, envelope, journal))
    assert reply == canonical_json({"a": "sent"}) and ran == [1]


def test_pure_workflow_steps_are_posted_and_ride_with_the_next_awaited_step() -> None:
    """``Step(..., pure=True)`` goes through ``ctx.step(..., pure=True)`` (issue 24 item 2): a, b ride with c."""
    rec = Recorder()
    # The sync bodies run on threads: a 5 s linger (not the default 2 ms) keeps the posted records waiting for the
    # next awaited one however slowly this machine schedules those threads.
    app = App(agent=None, options=RunOptions(settle_linger_s=5.0))
    app.workflow(
        Workflow(
            "w",
            steps=[Step("a", lambda ctx: 1, pure=True), Step("b", lambda ctx: 2, pure=True), Step("c", lambda ctx: 3)],
        )
    )
    reply = app.runner()(attempt(rec, 1, workflow_input("w", "t", "in")))
    assert reply == canonical_json({"a": 1, "b": 2, "c": 3})
    step_batches = [[e.name for e in b if isinstance(e, StepRecorded)] for b in rec.batches]
    # The run's plan (``workflow``) rides with the first commit too: one commit for the whole run's records.
    assert step_batches == [["workflow", "step:a", "step:b", "step:c"]], step_batches
    assert rec.names() == ["step:a", "step:b", "step:c"]
