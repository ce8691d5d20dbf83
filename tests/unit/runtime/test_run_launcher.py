"""`App.runner().launch` (`RunLoopLauncher`): a run started on the run loop without a pool thread (issue 24).

The conductor launches a run from the worker loop's thread; `launch` returns at once with the run's future, and the
app's ``concurrency`` permits bound how many run bodies execute at once (a run launched while every permit is held
begins when one is released), as the run pool's size did when each run took a pool thread.

"Nothing began" is proved with a barrier on the run loop: a coroutine scheduled on the loop after the launch runs
after the launched run's first step (the loop runs ready callbacks in the order they were scheduled), so by then a
run with a free permit has begun its body.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

import pytest

from settled.runtime import App, RunContext
from settled.runtime._runloop import _RUN_LOOP
from tests.unit.runtime.test_context import Recorder, attempt

WAIT_S = 10.0


async def _nothing() -> None:
    return None


def _loop_barrier() -> None:
    """Return once the run loop ran everything scheduled on it before this call (first steps included)."""
    asyncio.run_coroutine_threadsafe(_nothing(), _RUN_LOOP.get()).result(WAIT_S)


class Gated:
    """An agent whose run ``a<n>`` notes its begin and end and waits for its gate in between."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.lock = threading.Lock()
        self.began: dict[str, threading.Event] = {f"a{n}": threading.Event() for n in (1, 2)}
        self.gates: dict[str, threading.Event] = {f"a{n}": threading.Event() for n in (1, 2)}

    async def __call__(self, ctx: RunContext) -> dict[str, Any]:
        name = ctx.attempt_id
        with self.lock:
            self.order.append(f"begin {name}")
        self.began[name].set()
        await asyncio.get_running_loop().run_in_executor(None, self.gates[name].wait, WAIT_S)
        with self.lock:
            self.order.append(f"end {name}")
        return {"done": name}


@pytest.mark.parametrize("concurrency", [1, 2])
def test_launch_returns_at_once_and_the_permits_bound_the_runs_at_once(concurrency: int) -> None:
    agent = Gated()
    launcher = App(agent=agent, concurrency=concurrency).runner()
    first: Future[str] = launcher.launch(attempt(Recorder(), n=1))
    assert agent.began["a1"].wait(WAIT_S), "the first run never began"
    assert not first.done()  # launch returned while the run waits for its gate
    second: Future[str] = launcher.launch(attempt(Recorder(), n=2))
    _loop_barrier()
    if concurrency == 1:
        assert not agent.began["a2"].is_set(), "a run began while the only permit was held"
        assert not second.done()
    else:
        assert agent.began["a2"].is_set(), "a run with a free permit did not begin"
    agent.gates["a1"].set()
    assert first.result(WAIT_S) == '{"done":"a1"}'
    assert agent.began["a2"].wait(WAIT_S), "the second run never began after the first released its permit"
    agent.gates["a2"].set()
    assert second.result(WAIT_S) == '{"done":"a2"}'
    if concurrency == 1:
        assert agent.order == ["begin a1", "end a1", "begin a2", "end a2"]
    else:
        assert agent.order[:2] == ["begin a1", "begin a2"]


def test_a_launched_run_that_raises_system_exit_ends_only_its_run() -> None:
    async def agent(ctx: RunContext) -> str:
        if ctx.attempt_id == "a1":
            raise SystemExit(3)
        return "ok"

    launcher = App(agent=agent, concurrency=1).runner()
    exc = launcher.launch(attempt(Recorder(), n=1)).exception(WAIT_S)
    assert isinstance(exc, SystemExit) and exc.code == 3
    assert launcher.launch(attempt(Recorder(), n=2)).result(WAIT_S) == '"ok"'  # the loop and the permit go on
    assert launcher(attempt(Recorder(), n=3)) == '"ok"'  # called, it runs the attempt and waits for it
