"""The run loop: one event loop per worker process runs every run's coroutine (issue 6), and `execute`.

`execute` runs one attempt of an agent on that loop from a conductor's pool thread and waits for it; agent code
must not block the loop (blocking work belongs in a tool or a ``ctx.step``, which run on threads). A run's leftover
tasks are cancelled when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from settled._failpoints import failpoint
from settled.processors import AgentRun, CancelSignal
from settled.runtime._context import RunContext
from settled.runtime._errors import (
    RunCancelledError,
    RunSuspended,
)
from settled.runtime._options import RunOptions
from settled.runtime._tools import ToolRegistry
from settled.schemas import (
    canonical_json,
)

__all__ = ["AgentFunction", "execute"]

AgentFunction = Callable[[RunContext], Awaitable[Any]]


#: The tasks a run created (directly or not): cancelled when the run ends, as `asyncio.run` would (`_RunLoop`).
_RUN_TASKS: contextvars.ContextVar[set[asyncio.Task[Any]] | None] = contextvars.ContextVar(
    "settled_run_tasks", default=None
)


class _RunLoop:
    """The worker process's one event loop for runs, on a daemon thread, started at the first run.

    A loop per run (``asyncio.run`` on each pool thread) made every wake-up — a record committed, a tool returned —
    a thread of its own contending for the GIL: with 50 runs in flight the worker loop waited behind them after each
    commit (``bench/engine.py``). One loop serves every run's coroutine; the pool threads that call `execute` only
    wait for their run, so the pool size is still the worker's concurrency permit count. Agent code must not block
    the loop (blocking work belongs in a tool or a ``ctx.step``, which run on threads). A run's leftover tasks are
    cancelled when it ends, and a ``SystemExit`` or ``KeyboardInterrupt`` raised by agent code ends only its run.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                loop.set_task_factory(_track_run_task)
                loop.set_default_executor(ThreadPoolExecutor(max_workers=256, thread_name_prefix="settled-run-io"))
                self._thread = threading.Thread(target=loop.run_forever, name="settled-runs", daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop


def _track_run_task(
    loop: asyncio.AbstractEventLoop, coro: Any, context: contextvars.Context | None = None
) -> asyncio.Task[Any]:
    task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, context=context)
    tasks = _RUN_TASKS.get() if context is None else context.get(_RUN_TASKS)
    if tasks is not None:
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    return task


_RUN_LOOP = _RunLoop()


async def _guarded(coro: Coroutine[Any, Any, str]) -> tuple[str | None, BaseException | None]:
    """Run a run's coroutine; hand back (instead of raising on the loop) what would stop the shared loop."""
    try:
        return await coro, None
    except (SystemExit, KeyboardInterrupt) as exc:
        return None, exc


async def _end_leftovers(tasks: set[asyncio.Task[Any]]) -> None:
    """Cancel the tasks the run left behind and wait for them (what `asyncio.run` does when its loop ends)."""
    me = asyncio.current_task()
    left = [t for t in tasks if t is not me and not t.done()]
    for t in left:
        t.cancel()
    if left:
        await asyncio.gather(*left, return_exceptions=True)


async def _main(agent: AgentFunction, run: AgentRun, tools: ToolRegistry, options: RunOptions) -> str:
    tasks: set[asyncio.Task[Any]] = set()
    _RUN_TASKS.set(tasks)  # this task's context: the tasks the run creates register here
    try:
        return await _attempt(agent, run, tools, options)
    finally:
        await _end_leftovers(tasks)


async def _attempt(agent: AgentFunction, run: AgentRun, tools: ToolRegistry, options: RunOptions) -> str:
    ctx = RunContext(run, tools, options)
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def cancel() -> None:  # called from the conductor's thread
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the run is over anyway
                loop.call_soon_threadsafe(task.cancel)

    if isinstance(run.cancelled, CancelSignal):
        run.cancelled.add_callback(cancel)
    elif run.cancelled.is_set():
        task.cancel()
    try:
        try:
            value = await agent(ctx)
            reply = canonical_json(value)
            await ctx.flush()
        except asyncio.CancelledError:
            raise RunCancelledError(f"attempt {run.attempt} of submission {run.submission_id} was cancelled") from None
        except RunSuspended as exc:
            raise RunCancelledError(f"the run stopped: {exc}") from None
        except Exception:
            await ctx._after_failure()
            raise
    finally:
        await ctx._flush_stream()  # the parts reach the stream before the reply is settled (issue 19)
        await ctx._quiesce()
    failpoint("engine.run_returned")
    return reply


def execute(agent: AgentFunction, tools: ToolRegistry, options: RunOptions, run: AgentRun) -> str:
    """Run one attempt of an async agent on the process's run loop and wait for it (on a conductor's pool thread).

    The run's coroutine runs on the loop `_RunLoop` keeps; this thread only waits for it.

    Args:
        agent: The agent.
        tools: The app's tools.
        options: How effects execute.
        run: The attempt.

    Returns:
        The reply, canonical JSON.

    Raises:
        RunCancelledError: The run was cancelled, or stopped with a call Unknown.
        ReplayDivergenceError: The code diverged from the record.
        Exception: Whatever the agent raised (the conductor retries within ``max_attempts``).
    """
    reply, stop = asyncio.run_coroutine_threadsafe(
        _guarded(_main(agent, run, tools, options)), _RUN_LOOP.get()
    ).result()
    if stop is not None:
        raise stop
    assert reply is not None  # _guarded returns a reply or what stopped the run
    return reply
