"""The run loop: one event loop per worker process runs every run's coroutine (issue 6); `RunLoopLauncher`, `execute`.

`RunLoopLauncher.launch` (a `settled.processors.RunLauncher`: what the worker's conductors call, from
`settled.runtime.App.runner`) starts one attempt of an agent on that loop straight from the worker loop's thread and
returns its future at once; the run holds one of the worker's concurrency permits (`RunPermits`, ``App.concurrency``)
while it runs. `execute` runs one attempt on the loop from a thread of the caller's and waits for it. Agent code must
not block the loop (blocking work belongs in a tool or a ``ctx.step``, which run on threads). A run's leftover tasks
are cancelled when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
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

__all__ = ["AgentFunction", "RunLoopLauncher", "RunPermits", "execute"]

AgentFunction = Callable[[RunContext], Awaitable[Any]]


#: The tasks a run created (directly or not): cancelled when the run ends, as `asyncio.run` would (`_RunLoop`).
_RUN_TASKS: contextvars.ContextVar[set[asyncio.Task[Any]] | None] = contextvars.ContextVar(
    "settled_run_tasks", default=None
)


class _RunLoop:
    """The worker process's one event loop for runs, on a daemon thread, started at the first run.

    A loop per run (``asyncio.run`` on each pool thread) made every wake-up — a record committed, a tool returned —
    a thread of its own contending for the GIL: with 50 runs in flight the worker loop waited behind them after each
    commit (``bench/engine.py``). One loop serves every run's coroutine; a run is started on it straight from the
    worker loop's thread (`RunLoopLauncher.launch`) and holds one of `RunPermits` while it runs. Agent code must not
    block the loop (blocking work belongs in a tool or a ``ctx.step``, which run on threads). A run's leftover tasks
    are cancelled when it ends, and a ``SystemExit`` or ``KeyboardInterrupt`` raised by agent code ends only its run.
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


class RunPermits:
    """A worker's concurrency permits (``App.concurrency``): how many runs execute at once on the run loop.

    A run launched while every permit is held waits on the loop for one (its ``AttemptStarted`` is committed; its
    body has not begun), as it waited in the run pool's queue when runs took a pool thread each.

    Attributes:
        count: The number of permits.
    """

    def __init__(self, count: int) -> None:
        """Build the permits.

        Args:
            count: How many runs may execute at once (>= 1).

        Raises:
            ValueError: ``count`` is below 1.
        """
        if count < 1:
            raise ValueError(f"RunPermits count must be >= 1, got {count}")
        self.count = count
        self._lock = threading.Lock()
        self._semaphores: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    def _semaphore(self, loop: asyncio.AbstractEventLoop) -> asyncio.Semaphore:
        """The semaphore of ``loop`` (a new run loop, after the old one's thread died, gets fresh permits)."""
        with self._lock:
            sem = self._semaphores.get(loop)
            if sem is None:
                self._semaphores = {loop: asyncio.Semaphore(self.count)}  # a dead loop's semaphore is dropped
                sem = self._semaphores[loop]
            return sem

    async def run(self, coro: Coroutine[Any, Any, str]) -> str:
        """Run ``coro`` holding one permit (on the run loop), waiting for one first when all are held.

        Args:
            coro: The run's coroutine.

        Returns:
            What it returned.
        """
        async with self._semaphore(asyncio.get_running_loop()):
            return await coro


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


def _start(
    agent: AgentFunction, tools: ToolRegistry, options: RunOptions, run: AgentRun, permits: RunPermits | None
) -> Future[str]:
    """Schedule one attempt on the process's run loop; return its future (the reply, or what the run raised).

    A ``SystemExit`` or ``KeyboardInterrupt`` the agent raised ends only its run: it is the future's exception, never
    raised on the shared loop.
    """
    main = _main(agent, run, tools, options)
    inner = asyncio.run_coroutine_threadsafe(_guarded(main if permits is None else permits.run(main)), _RUN_LOOP.get())
    out: Future[str] = Future()
    out.set_running_or_notify_cancel()

    def done(f: Future[tuple[str | None, BaseException | None]]) -> None:  # on the run loop's thread
        try:
            reply, stop = f.result()
        except BaseException as exc:  # noqa: BLE001 - the run's outcome, handed to whoever reads the future
            out.set_exception(exc)
            return
        if stop is not None:
            out.set_exception(stop)
        else:
            assert reply is not None  # _guarded returns a reply or what stopped the run
            out.set_result(reply)

    inner.add_done_callback(done)
    return out


@dataclass(frozen=True)
class RunLoopLauncher:
    """An app's run body as the conductor starts it (`settled.processors.Conductor`; `settled.runtime.App.runner`).

    `launch` starts an attempt on the run loop from the caller's thread (the worker loop's) and returns at once: no
    pool thread sits between the commit of the attempt's start and its body, nor between its end and the worker
    loop's wake-up (docs/architecture.md "K=0 turn latency"). Called, it runs the attempt and waits for it, like
    `execute`.

    Attributes:
        agent: The agent (the app's dispatcher between its agent, workflows and flows).
        tools: The app's tools.
        options: How effects execute.
        permits: The worker's concurrency permits, shared by every conductor of the worker.
    """

    agent: AgentFunction
    tools: ToolRegistry
    options: RunOptions
    permits: RunPermits

    def launch(self, run: AgentRun) -> Future[str]:
        """Start one attempt on the run loop (it waits there for a permit) and return its future at once.

        Args:
            run: The attempt; its ``AttemptStarted`` is committed (the conductor's rule).

        Returns:
            The future of the reply (canonical JSON), or of what the run raised (see `execute`).
        """
        return _start(self.agent, self.tools, self.options, run, self.permits)

    def __call__(self, run: AgentRun) -> str:
        """Run one attempt and wait for it (see `execute`; no permit is taken: the caller's threads bound it).

        Args:
            run: The attempt.

        Returns:
            The reply, canonical JSON.
        """
        return execute(self.agent, self.tools, self.options, run)


def execute(agent: AgentFunction, tools: ToolRegistry, options: RunOptions, run: AgentRun) -> str:
    """Run one attempt of an async agent on the process's run loop and wait for it (on a thread of the caller's).

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
    return _start(agent, tools, options, run, None).result()
