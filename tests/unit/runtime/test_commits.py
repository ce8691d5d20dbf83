"""How a run's records reach the log, without Kafka: what shares a commit, what is waited for (docs/design.md §3).

* A model response rides with the next awaited record: the prepared record of the first call it declares (all of
  a parallel-safe group), so one commit comes before the tool runs (DUR-008 needs only the response committed
  before a tool runs); a call that does not start yet is not prepared.
* A settlement is handed over, not waited for: the run goes on to the next model call while it commits; it lingers
  briefly for the run's next record to share its commit; an error recording it surfaces at the next awaited record
  and nothing after it is recorded; the run ends only once it committed.
* A response is committed before anything but a tool acts on it: the next prompt, a step's body, the reply; and
  when the agent raises it is still committed (auditable, replayed by the next attempt).

The recorder here stands where the conductor stands (`AgentRun.record`) and can hold a batch's commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import pytest

from settled import _failpoints
from settled.processors import AgentRun, AttemptSupersededError
from settled.runtime import (
    App,
    Message,
    ModelAgent,
    ModelRequest,
    ModelResponse,
    RunContext,
    RunOptions,
    ScriptedProvider,
    ToolCall,
    _calls,
    _tools,
    declared_call,
)
from settled.runtime._model import ScriptStep
from settled.schemas import (
    LogEvent,
    ModelResponseCompleted,
    StepRecorded,
    ToolCallPrepared,
    ToolCallSettled,
    canonical_json,
)
from tests._promise import promise
from tests.unit.runtime.test_context import Recorder, attempt, run


class GatedRecorder(Recorder):
    """Commits at once, except batches ``hold`` picks: those wait for `release` (or fail with ``fail``)."""

    def __init__(self, hold: Callable[[tuple[LogEvent, ...]], bool], fail: BaseException | None = None) -> None:
        super().__init__()
        self.hold = hold
        self.fail = fail
        self.held: list[Future[None]] = []

    def __call__(self, events: Sequence[LogEvent]) -> Future[None]:
        batch = tuple(events)
        with self.lock:
            self.batches.append(batch)
        fut: Future[None] = Future()
        if self.fail is not None and self.hold(batch):
            fut.set_exception(self.fail)
        elif self.hold(batch):
            with self.lock:
                self.held.append(fut)
        else:
            fut.set_result(None)
        return fut

    def release(self) -> None:
        with self.lock:
            held, self.held = self.held, []
        for fut in held:
            fut.set_result(None)


def shapes(rec: Recorder) -> list[list[str]]:
    return [[type(e).__name__ for e in b] for b in rec.batches]


def settles(batch: tuple[LogEvent, ...]) -> bool:
    return any(isinstance(e, ToolCallSettled) for e in batch)


def prepares(batch: tuple[LogEvent, ...]) -> bool:
    return any(isinstance(e, ToolCallPrepared) for e in batch)


def turns(request: ModelRequest) -> int:
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    return sum(1 for m in request.messages[last_user:] if m.role == "assistant")


def model_app(script: Callable[[ModelRequest], list[ScriptStep]], invoked: list[str], **options: Any) -> App:
    app = App(agent=ModelAgent(ScriptedProvider(script), model="m"), options=RunOptions(**options))

    @app.tool(idempotent=True, parallel_safe=True)
    def lookup(args: dict[str, Any], call: ToolCall) -> str:
        invoked.append(f"lookup {args['q']}")
        return "found"

    @app.tool(idempotent=True)
    def charge(args: dict[str, Any], call: ToolCall) -> str:
        invoked.append("charge")
        return "charged"

    return app


def test_a_parallel_safe_group_is_prepared_with_its_response_in_one_batch() -> None:
    def script(request: ModelRequest) -> list[ScriptStep]:
        if turns(request) == 0:
            calls = tuple(declared_call(f"c{i}", "lookup", {"q": i}) for i in range(3))
            return [ModelResponse("", calls)]
        return [ModelResponse("done")]

    rec, invoked = Recorder(), []
    assert run(model_app(script, invoked), attempt(rec)) == '"done"'
    assert sorted(invoked) == ["lookup 0", "lookup 1", "lookup 2"]
    assert shapes(rec)[0] == ["ModelResponseCompleted", "ToolCallPrepared", "ToolCallPrepared", "ToolCallPrepared"]
    assert shapes(rec)[-1][-1] == "ModelResponseCompleted"
    assert len(rec.of(ToolCallSettled)) == 3


def test_a_sequential_call_is_prepared_only_when_it_starts() -> None:
    def script(request: ModelRequest) -> list[ScriptStep]:
        if turns(request) == 0:
            return [ModelResponse("", (declared_call("a", "pay", {}), declared_call("b", "pay", {})))]
        return [ModelResponse("done")]

    rec = Recorder()
    seen: list[int] = []
    app = App(agent=ModelAgent(ScriptedProvider(script)))

    @app.tool(idempotent=True)
    def pay(args: dict[str, Any], call: ToolCall) -> str:
        seen.append(len(rec.of(ToolCallPrepared)))
        return "paid"

    run(app, attempt(rec))
    # When the first call runs only it is prepared; the second (not parallel-safe) is prepared when it starts, so a
    # crash in between leaves no prepared record that recovery would have to call Unknown.
    assert seen == [1, 2]


def test_the_run_goes_on_while_a_settlement_commits_and_ends_only_once_it_did() -> None:
    rec = GatedRecorder(settles)
    prompted_while_held: list[int] = []

    def script(request: ModelRequest) -> list[ScriptStep]:
        if turns(request) == 0:
            return [ModelResponse("", (declared_call("a", "charge", {}),))]
        prompted_while_held.append(len(rec.held))
        threading.Timer(0.2, rec.release).start()
        return [ModelResponse("done")]

    invoked: list[str] = []
    t0 = time.monotonic()
    assert run(model_app(script, invoked, settle_linger_s=0), attempt(rec)) == '"done"'
    assert prompted_while_held == [1], "the next model call waited for the settlement's commit"
    assert time.monotonic() - t0 >= 0.2, "the run ended before its settlement committed"
    assert shapes(rec) == [
        ["ModelResponseCompleted", "ToolCallPrepared"],
        ["ToolCallSettled"],
        ["ModelResponseCompleted"],
    ]


def test_a_settlement_lingers_for_the_next_record_and_shares_its_commit() -> None:
    def script(request: ModelRequest) -> list[ScriptStep]:
        if turns(request) < 2:
            return [ModelResponse("", (declared_call(f"c{turns(request)}", "charge", {}),))]
        return [ModelResponse("done")]

    rec, invoked = Recorder(), []
    run(model_app(script, invoked, settle_linger_s=5.0), attempt(rec))
    assert shapes(rec) == [
        ["ModelResponseCompleted", "ToolCallPrepared"],
        ["ToolCallSettled", "ModelResponseCompleted", "ToolCallPrepared"],
        ["ToolCallSettled", "ModelResponseCompleted"],
    ]


def test_a_refused_settlement_surfaces_at_the_next_step_and_nothing_after_it_is_recorded() -> None:
    rec = GatedRecorder(settles, fail=AttemptSupersededError("attempt a1 was aborted"))

    def script(request: ModelRequest) -> list[ScriptStep]:
        if turns(request) == 0:
            return [ModelResponse("", (declared_call("a", "charge", {}),))]
        return [ModelResponse("", (declared_call("b", "charge", {}),))]

    invoked: list[str] = []
    with pytest.raises(AttemptSupersededError, match="aborted"):
        run(model_app(script, invoked, settle_linger_s=0), attempt(rec))
    # The refusal is known only after the hand-off (in the conductor's thread), so the next model call may start;
    # its response and the call it declares are never recorded, and that call never runs.
    assert shapes(rec) == [["ModelResponseCompleted", "ToolCallPrepared"], ["ToolCallSettled"]]
    assert invoked == ["charge"]


def test_a_response_is_committed_before_the_next_prompt_a_step_body_and_when_the_agent_raises() -> None:
    rec = Recorder()
    seen: dict[str, int] = {}

    def script(request: ModelRequest) -> list[ScriptStep]:
        seen[f"prompt {len([k for k in seen if k.startswith('prompt')]) + 1}"] = len(rec.of(ModelResponseCompleted))
        return [ModelResponse("hi")]

    provider = ScriptedProvider(script)

    def body() -> str:
        seen["step"] = len(rec.of(ModelResponseCompleted))
        return "ok"

    async def agent(ctx: RunContext) -> Any:
        first = await ctx.model(provider, [Message("user", "a")])
        await ctx.model(provider, [Message("user", "a"), Message("assistant", first.text)])
        await ctx.step("s", body)
        await ctx.model(provider, [Message("user", "b")])
        raise ValueError("the agent fails after its third response")

    with pytest.raises(ValueError, match="third response"):
        run(App(agent=agent), attempt(rec))
    assert seen == {"prompt 1": 0, "prompt 2": 1, "step": 2, "prompt 3": 2}
    assert len(rec.of(ModelResponseCompleted)) == 3, "the last response was not committed when the agent raised"
    assert len(rec.of(StepRecorded)) == 1


def named_step(name: str) -> Callable[[tuple[LogEvent, ...]], bool]:
    """Picks the batches holding the ``StepRecorded`` of step ``name``."""
    return lambda batch: any(isinstance(e, StepRecorded) and e.name == name for e in batch)


def test_a_plain_step_commits_before_the_next_step_body_tool_call_or_settlement_starts() -> None:
    """Awaited (issue 24 item 2; DUR-010): catches the fault switch ``step_not_awaited`` (a plain step posted).

    Every step body is async and returns without suspending, so a posted record would let the next body start in the
    same loop step, before the record is even handed over: each check below is taken while the previous step's
    commit is held, with no timing involved.
    """
    timeline: list[str] = []
    rec = GatedRecorder(lambda b: any(isinstance(e, StepRecorded) for e in b))

    def body(name: str) -> Callable[[], Any]:
        async def fn() -> str:
            timeline.append(f"body {name}")
            return name

        return fn

    app = App(agent=lambda ctx: agent(ctx))

    @app.tool(idempotent=True)
    def charge(args: dict[str, Any], call: ToolCall) -> str:
        timeline.append("tool charge")
        return "charged"

    async def agent(ctx: RunContext) -> Any:
        await ctx.step("a", body("a"))
        await ctx.step("b", body("b"))
        await ctx.tool("charge", {})
        await ctx.step("c", body("c"))
        return "done"

    done, outcome = run_until_held(app, rec)
    seen: list[list[str]] = []  # the timeline whenever a step record's commit is held, before it is released
    deadline = time.monotonic() + 10
    while not done.is_set() and time.monotonic() < deadline:
        if rec.held:
            seen.append(list(timeline))
            names = [e.name for e in rec.batches[-1] if isinstance(e, StepRecorded)]
            timeline.append("commit " + ",".join(names))
            rec.release()
        else:
            time.sleep(0.005)
    assert done.wait(5) and outcome == ['"done"'], outcome
    promise(
        "DUR-010.step-awaited",
        seen
        == [
            ["body a"],
            ["body a", "commit a", "body b"],
            ["body a", "commit a", "body b", "commit b", "tool charge", "body c"],
        ],
        f"a later step body or tool call started before a plain step's record committed: {seen}",
    )
    # The reply waits for the last step's commit: the run ended only after the test released it.
    assert timeline[-1] == "commit c" and shapes(rec)[-1] == ["ToolCallSettled", "StepRecorded"]
    assert [s.count("StepRecorded") for s in shapes(rec) if "StepRecorded" in s] == [1, 1, 1]


def pure_body(name: str, timeline: list[str]) -> Callable[[], Any]:
    async def fn() -> str:
        timeline.append(f"body {name}")
        return f"value {name}"

    return fn


def test_pure_steps_are_posted_the_run_goes_on_at_once_and_ends_only_once_they_committed() -> None:
    """K pure steps cost one commit; the run has every value before any record is handed over (issue 24 item 2)."""
    timeline: list[str] = []
    rec = GatedRecorder(lambda b: any(isinstance(e, StepRecorded) for e in b))

    async def agent(ctx: RunContext) -> Any:
        values = [await ctx.step(f"p{i}", pure_body(f"p{i}", timeline), pure=True) for i in range(10)]
        timeline.append("agent returns")
        return values

    done, outcome = run_until_held(App(agent=agent), rec)
    assert timeline == [*(f"body p{i}" for i in range(10)), "agent returns"], timeline
    assert shapes(rec) == [["StepRecorded"] * 10], "K pure steps were not one commit"
    assert not done.is_set(), "the run ended before its pure steps committed"
    rec.release()
    assert done.wait(5) and outcome == [canonical_json([f"value p{i}" for i in range(10)])], outcome
    assert [e.ordinal for e in rec.of(StepRecorded)] == list(range(10))


def test_pure_steps_ride_with_the_next_awaited_record_behind_the_values_before_them() -> None:
    """A plain step and a tool's prepared record carry the pure steps posted before them, in the run's order."""
    timeline: list[str] = []
    rec = Recorder()
    app = App(agent=lambda ctx: agent(ctx), options=RunOptions(settle_linger_s=5.0))

    @app.tool(idempotent=True)
    def charge(args: dict[str, Any], call: ToolCall) -> str:
        return "charged"

    async def agent(ctx: RunContext) -> Any:
        ctx.now()
        await ctx.step("p0", pure_body("p0", timeline), pure=True)
        await ctx.step("p1", pure_body("p1", timeline), pure=True)
        await ctx.step("plain", pure_body("plain", timeline))
        await ctx.step("p2", pure_body("p2", timeline), pure=True)
        await ctx.tool("charge", {})
        return "done"

    assert run(app, attempt(rec)) == '"done"'
    assert shapes(rec) == [
        ["EffectRecorded", "StepRecorded", "StepRecorded", "StepRecorded"],
        ["StepRecorded", "ToolCallPrepared"],
        ["ToolCallSettled"],
    ]
    assert [e.ordinal for b in rec.batches for e in b if hasattr(e, "ordinal")] == [0, 1, 2, 3, 4, 5]


def test_a_recorded_pure_step_replays_and_one_whose_record_was_lost_runs_again_and_is_recorded_once() -> None:
    timeline: list[str] = []

    async def agent(ctx: RunContext) -> Any:
        return [await ctx.step(f"p{i}", pure_body(f"p{i}", timeline), pure=True) for i in range(3)]

    first = Recorder()
    assert run(App(agent=agent), attempt(first)) == canonical_json(["value p0", "value p1", "value p2"])
    # Attempt 2 finds p0 recorded; p1 and p2 were lost with attempt 1's crash (their commit never happened).
    timeline.clear()
    second = Recorder()
    again = run(App(agent=agent), attempt(second, journal=first.of(StepRecorded)[:1], n=2))
    assert again == canonical_json(["value p0", "value p1", "value p2"])
    assert timeline == ["body p1", "body p2"], "a recorded pure step ran again, or a lost one did not"
    assert [(e.name, e.ordinal, e.attempt_id) for e in second.of(StepRecorded)] == [("p1", 1, "a2"), ("p2", 2, "a2")]


def test_a_refused_pure_step_surfaces_at_the_next_awaited_record_and_nothing_after_it_is_recorded() -> None:
    rec = GatedRecorder(named_step("p0"), fail=AttemptSupersededError("attempt a1 was aborted"))
    timeline: list[str] = []

    async def agent(ctx: RunContext) -> Any:
        await ctx.step("p0", pure_body("p0", timeline), pure=True)
        for _ in range(20):  # loop turns, no timing: the hand-off (settle_linger_s=0) is refused and the run told
            await asyncio.sleep(0)
        await ctx.step("plain", pure_body("plain", timeline))
        return "done"

    with pytest.raises(AttemptSupersededError, match="aborted"):
        run(App(agent=agent, options=RunOptions(settle_linger_s=0)), attempt(rec))
    assert shapes(rec) == [["StepRecorded"]], "a record after the refused pure step was handed over"


def one_charge_call(request: ModelRequest) -> list[ScriptStep]:
    """The model calls ``charge`` once, then answers "done"."""
    if turns(request) == 0:
        return [ModelResponse("", (declared_call("a", "charge", {}),))]
    return [ModelResponse("done")]


def run_until_held(
    app: App, rec: GatedRecorder, agent_run: AgentRun | None = None
) -> tuple[threading.Event, list[object]]:
    """Start the run on a thread and return once ``rec`` holds a batch: (set when the run ended, its reply or error)."""
    done = threading.Event()
    outcome: list[object] = []

    def go() -> None:
        try:
            outcome.append(run(app, agent_run or attempt(rec)))
        except BaseException as exc:  # noqa: BLE001 - the test asserts what it was
            outcome.append(exc)
        done.set()

    threading.Thread(target=go, daemon=True).start()
    deadline = time.monotonic() + 5
    while not rec.held and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rec.held, "the prepared record was never handed over"
    return done, outcome


@contextlib.contextmanager
def failpoints_armed(monkeypatch: pytest.MonkeyPatch, spec: str) -> Iterator[None]:
    """Arm ``spec`` (``SETTLED_FAILPOINTS`` syntax) in this process for the block; disarm after."""
    monkeypatch.setenv(_failpoints.FAILPOINTS_ENV_VAR, spec)
    monkeypatch.delenv(_failpoints.FAILPOINT_DIR_ENV_VAR, raising=False)
    _failpoints.reset()
    try:
        yield
    finally:
        monkeypatch.delenv(_failpoints.FAILPOINTS_ENV_VAR)
        _failpoints.reset()


def test_a_tool_never_runs_before_its_prepared_record_commits() -> None:
    rec = GatedRecorder(prepares)
    invoked: list[str] = []
    done, outcome = run_until_held(model_app(one_charge_call, invoked), rec)
    time.sleep(0.2)
    assert rec.held and invoked == [], "the tool ran before its prepared record committed"
    rec.release()
    assert done.wait(5) and outcome == ['"done"'] and invoked == ["charge"]


@pytest.mark.parametrize("point", ["engine.after_response_commit", "engine.after_prepared_commit"])
def test_a_boundary_failpoint_between_the_commit_and_a_sync_tool_stops_the_run_before_the_tool_starts(
    point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync tool starts in the committing thread (`_Launch`); the boundary failpoints still come first.

    See docs/semantics.md §15.
    """
    with failpoints_armed(monkeypatch, f"{point}=1*raise"):
        rec = GatedRecorder(prepares)
        invoked: list[str] = []
        done, outcome = run_until_held(model_app(one_charge_call, invoked), rec)
        rec.release()  # the commit: the tool would start here, in this thread
        assert done.wait(5)
        assert len(outcome) == 1 and isinstance(outcome[0], _failpoints.FailpointError), outcome
        assert point in str(outcome[0])
        assert invoked == [], "the tool started although the boundary failpoint stopped the run"
        assert shapes(rec)[0] == ["ModelResponseCompleted", "ToolCallPrepared"]


def test_a_sync_tool_starts_in_the_thread_that_commits_its_prepared_record() -> None:
    """One thread hop less (docs/design.md §3, docs/architecture.md): the tool is started by the committing thread."""
    rec = GatedRecorder(prepares)
    started_by: list[str] = []
    invoked: list[str] = []
    done, outcome = run_until_held(model_app(one_charge_call, invoked), rec)
    original = _tools.call_in_thread

    def spy(fn: Callable[..., Any], *args: Any) -> Future[Any]:
        started_by.append(threading.current_thread().name)
        return original(fn, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_calls, "call_in_thread", spy)
        threading.current_thread().name = "committer"
        try:
            rec.release()
        finally:
            threading.current_thread().name = "MainThread"
        assert done.wait(5) and outcome == ['"done"'] and invoked == ["charge"]
    assert started_by == ["committer"]


# ------------------------------------------------------------------------------------------- the shared run loop


def test_a_runs_leftover_tasks_are_cancelled_when_it_ends() -> None:
    ended = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            ended.set()
            raise

    async def agent(ctx: RunContext) -> Any:
        asyncio.get_running_loop().create_task(forever())
        await asyncio.sleep(0)
        return "done"

    assert run(App(agent=agent), attempt(Recorder())) == '"done"'
    assert ended.wait(5), "a task the run left behind still runs after the run ended"


def test_system_exit_in_agent_code_ends_its_run_only() -> None:
    async def leaves(ctx: RunContext) -> Any:
        raise SystemExit(3)

    async def fine(ctx: RunContext) -> Any:
        return "ok"

    with pytest.raises(SystemExit):
        run(App(agent=leaves), attempt(Recorder()))
    assert run(App(agent=fine), attempt(Recorder())) == '"ok"'


def test_runs_share_the_loop_without_waiting_for_each_other() -> None:
    release = threading.Event()

    async def slow(ctx: RunContext) -> Any:
        while not release.is_set():
            await asyncio.sleep(0.01)
        return "slow"

    async def quick(ctx: RunContext) -> Any:
        return "quick"

    result: list[str] = []
    t = threading.Thread(target=lambda: result.append(run(App(agent=slow), attempt(Recorder()))))
    t.start()
    assert run(App(agent=quick), attempt(Recorder())) == '"quick"'
    release.set()
    t.join(5)
    assert result == ['"slow"']
