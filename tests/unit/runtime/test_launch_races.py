"""`_Launch` (a sync tool started by the committing thread): two ways it once started other than "once, after its
boundary failpoints" (found in review; both tests failed on 96cd818 and pass since `_hand_off` runs the commit hooks
and the loop's wake-up in one callback, and a launch behind a plain waiter of the same tick starts on the loop).

1. A commit that lands while the run's loop is inside `RunContext._hand_off`.

`_hand_off` registers two callbacks on the conductor's future: ``after_commit`` (runs `_Launch.fire`, which starts a
sync tool) and then ``resolved`` (wakes the run's loop). When the future completes between the two registrations
(the loop thread preempted there while the conductor commits), ``resolved`` runs at once in the loop thread while
the conductor thread may not have run ``fire`` yet. The loop then reaches `RunContext._answer` with
``launch.future`` still None, starts the tool itself, and ``fire`` starts it a second time: a non-idempotent tool
runs twice under one prepared record (and an error ``fire`` keeps afterwards, e.g. a ``raise`` failpoint, is
never raised).

The recorder stands where the conductor stands; it only pins that thread schedule (a commit completing right
after the first registration, a conductor thread descheduled between completing the future and running its
callbacks). Nothing in product code is patched.

2. A parallel-safe group mixing an async call (declared first) and a sync one: the sync call's `_Launch.fire` hits
``engine.after_prepared_commit`` in the committing thread before the loop resumes the async call, so the Nth hit
is no longer the Nth call's, and a declared tool starts before ``engine.after_response_commit`` is hit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import pytest

from settled import _failpoints
from settled.runtime import (
    App,
    ModelAgent,
    ModelRequest,
    ModelResponse,
    RunCancelledError,
    RunContext,
    RunOptions,
    ScriptedProvider,
    ToolCall,
    declared_call,
)
from settled.runtime._model import ScriptStep
from settled.schemas import LogEvent, ToolCallPrepared
from tests.unit.runtime.test_commits import (
    GatedRecorder,
    failpoints_armed,
    one_charge_call,
    prepares,
    run_until_held,
    turns,
)
from tests.unit.runtime.test_context import Recorder, attempt, run


class _CommitsDuringHandOff(Future[None]):
    """A conductor future that commits right after its first callback is registered (from another thread).

    The committing thread is descheduled after the future is done and before it runs the registered callbacks
    (``stall``), for up to ``stall_s`` or until ``proceed`` is set.
    """

    def __init__(self, proceed: threading.Event, stall_s: float) -> None:
        super().__init__()
        self._proceed = proceed
        self._stall_s = stall_s
        self._registered = 0
        self.committer: threading.Thread | None = None
        super().add_done_callback(lambda _f: self._proceed.wait(self._stall_s))

    def add_done_callback(self, fn: Callable[[Future[None]], object]) -> None:
        super().add_done_callback(fn)
        self._registered += 1
        if self._registered == 1:  # `after_commit`: the commit lands before `resolved` is registered
            self.committer = threading.Thread(target=self.set_result, args=(None,), daemon=True)
            self.committer.start()
            deadline = time.monotonic() + 5
            while not self.done() and time.monotonic() < deadline:
                time.sleep(0.001)


class _RaceRecorder(Recorder):
    def __init__(self, proceed: threading.Event) -> None:
        super().__init__()
        self.proceed = proceed
        self.raced: list[_CommitsDuringHandOff] = []

    def __call__(self, events: Sequence[LogEvent]) -> Future[None]:
        if not any(isinstance(e, ToolCallPrepared) for e in events):
            return super().__call__(events)
        with self.lock:
            self.batches.append(tuple(events))
        fut = _CommitsDuringHandOff(self.proceed, stall_s=1.0)
        self.raced.append(fut)
        return fut


def test_a_sync_tool_runs_once_when_its_commit_lands_while_the_loop_is_handing_it_over() -> None:
    invoked: list[str] = []
    proceed = threading.Event()
    app = App(agent=ModelAgent(ScriptedProvider(one_charge_call), model="m"))

    @app.tool()  # neither idempotent nor reconcilable: it must run at most once per prepared record (DUR-009)
    def charge(args: dict[str, Any], call: ToolCall) -> str:
        invoked.append("charge")
        proceed.set()  # the committing thread goes on once the tool ran (or after 1 s anyway)
        return "charged"

    rec = _RaceRecorder(proceed)
    assert run(app, attempt(rec)) == '"done"'
    for fut in rec.raced:
        assert fut.committer is not None
        fut.committer.join(5)
    time.sleep(0.2)  # a second start, if any, has run by now
    assert invoked == ["charge"], f"the tool ran {len(invoked)} times under one prepared record"


def test_the_boundary_failpoints_of_a_mixed_parallel_group_are_hit_in_call_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An async call first, a sync one second: the boundary's 2nd hit is the sync call's (docs/semantics.md §15).

    Before 96cd818 each call of the group hit ``engine.after_prepared_commit`` on the loop, in declaration order,
    after ``engine.after_response_commit``. Now the sync call's `_Launch.fire` hits it (and starts the tool) in the
    committing thread before the loop resumes the async call, so ``=2*kill`` stops the other call, and a kill at
    ``engine.after_response_commit`` comes after a declared tool already started.
    """
    invoked: list[str] = []

    def script(request: ModelRequest) -> list[ScriptStep]:
        if turns(request) == 0:
            calls = (declared_call("a", "first_async", {}), declared_call("b", "second_sync", {}))
            return [ModelResponse("", calls)]
        return [ModelResponse("done")]

    app = App(agent=ModelAgent(ScriptedProvider(script), model="m"))

    @app.tool(idempotent=True, parallel_safe=True)
    async def first_async(args: dict[str, Any], call: ToolCall) -> str:
        invoked.append("first_async")
        return "ok"

    @app.tool(idempotent=True, parallel_safe=True)
    def second_sync(args: dict[str, Any], call: ToolCall) -> str:
        invoked.append("second_sync")
        return "ok"

    with failpoints_armed(monkeypatch, "engine.after_prepared_commit=2*raise"):
        with pytest.raises(_failpoints.FailpointError):
            run(app, attempt(Recorder()))
        assert invoked == ["first_async"], "the 2nd hit of engine.after_prepared_commit was not the 2nd call's"


def test_a_run_cancelled_past_its_grace_before_the_commit_lands_gets_no_tool_started() -> None:
    """`_Launch.abandon`: as before the launch moved to the committing thread, a run that stopped waiting for the
    prepared record's commit (abort grace over) never starts the tool when the commit lands later."""
    rec = GatedRecorder(prepares)
    invoked: list[str] = []

    async def agent(ctx: RunContext) -> Any:
        return await ctx.tool("charge", {})

    app = App(agent=agent, options=RunOptions(abort_grace_s=0.1), resolver_keys={"k": "x"})

    @app.tool
    def charge(args: dict[str, Any], call: ToolCall) -> str:
        invoked.append("charge")
        return "charged"

    agent_run = attempt(rec)
    done, outcome = run_until_held(app, rec, agent_run)
    agent_run.cancelled.set()
    time.sleep(0.5)  # past the abort grace (0.1 s): the call's task is cancelled while its commit is pending
    assert not done.is_set(), "a run ends only once every record it handed over committed or was refused"
    rec.release()  # the commit lands after the run gave up on the call
    assert done.wait(5), "the cancelled run did not end once its record committed"
    assert len(outcome) == 1 and isinstance(outcome[0], RunCancelledError), outcome
    time.sleep(0.2)
    assert invoked == [], "a tool started for a run that had stopped waiting for its prepared record"
