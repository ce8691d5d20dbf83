"""The commit pipeline of a run: how its records reach the log through the conductor (issue 6; docs/design.md §3).

A run hands records over in three ways (docs/architecture.md "Commits per tool call"): *awaited*
(`CommitPipeline.record`: the run goes on once the checkpoint holding them commits), *riding along*
(`CommitPipeline.buffer`: ``now``/``uuid`` values and a completed model response, committed with the next awaited
record) and *posted* (`CommitPipeline.post`: a tool's settlement, and with `CommitPipeline.post_in_order` a pure
step's record, lingering `RunOptions.settle_linger_s` for the run's next record). The records of one loop tick go
to the conductor as one batch; a posted record that was refused surfaces at the next awaited record or at the run's
end, and nothing after it is recorded. A run loop is woken once per committed batch (`_Doorbell`). An effect of
`settled.runtime.RunContext` is a record built by the façade and handed over here.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from settled._failpoints import failpoint
from settled.processors import AgentRun, AttemptSupersededError, defer_wakeup
from settled.runtime._options import RunOptions
from settled.schemas import (
    LogEvent,
    ModelResponseCompleted,
)

__all__ = ["CommitPipeline", "Launch"]

_log = logging.getLogger(__name__)


class Launch(Protocol):
    """A commit hook that starts a tool as its prepared record commits (`settled.runtime._calls._Launch`)."""

    with_response: bool  # set when handed over: a model response rides in the same batch

    def fire(self) -> None:
        """Run in the conductor's thread right after the batch commits, before the run's loop learns of it."""


@dataclass
class _Tick:
    """The records of one event-loop tick: handed to the conductor together, as one batch."""

    done: asyncio.Future[None]
    events: list[LogEvent] = field(default_factory=list)
    on_commit: list[Callable[[], None]] = field(default_factory=list)
    plain_waiters: bool = False  # an awaited record without a `_Launch` waits for this tick


class _Doorbell:
    """Callbacks for a run loop from other threads, run in one loop step: one wake-up per batch, not per callback.

    `post` queues a callback and rings the loop (``call_soon_threadsafe``) unless a ring is already due; inside the
    conductor's `batched_wakeups` block the ring waits for the block's end, so the effects one checkpoint commits
    wake the loop once (`settled.processors.batched_wakeups` says why that matters).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # weakly: `_DOORBELLS` is keyed by the loop and must not keep it alive
        self._lock = threading.Lock()
        self._pending: list[tuple[Callable[[Future[None]], None], Future[None]]] = []
        self._due = False  # a ring is scheduled or deferred; `_drain` clears it

    def post(self, fn: Callable[[Future[None]], None], arg: Future[None]) -> None:
        """Run ``fn(arg)`` on the loop soon (from any thread)."""
        with self._lock:
            self._pending.append((fn, arg))
            if self._due:
                return
            self._due = True
        if not defer_wakeup(self._ring):
            self._ring()

    def _ring(self) -> None:
        loop = self._loop()
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._drain)
                return
            except RuntimeError:
                pass  # the loop closed
        with self._lock:  # the loop is gone or closed: its runs are over, nobody waits for these callbacks
            self._pending.clear()
            self._due = False

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            self._due = False
        for fn, arg in pending:
            fn(arg)


_DOORBELLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Doorbell] = weakref.WeakKeyDictionary()
_DOORBELLS_LOCK = threading.Lock()


def _doorbell(loop: asyncio.AbstractEventLoop) -> _Doorbell:
    with _DOORBELLS_LOCK:
        found = _DOORBELLS.get(loop)
        if found is None:
            found = _DOORBELLS[loop] = _Doorbell(loop)
        return found


class CommitPipeline:
    """One attempt's hand-off of records to the conductor: awaited, riding along, and posted (docs/design.md §3).

    Attributes:
        buffer: Records riding with the next awaited record (``now``/``uuid`` values, a completed model response).
    """

    def __init__(self, run: AgentRun, options: RunOptions) -> None:
        self._run = run
        self._options = options
        self.buffer: list[LogEvent] = []  # rides with the next awaited record (now/uuid values, a response)
        self._tick: _Tick | None = None  # records of this loop tick, handed to the conductor at its end
        self._posted: list[asyncio.Future[None]] = []  # handed over, not awaited (settlements)
        self._inflight: set[asyncio.Future[None]] = set()  # every hand-off not yet committed or refused
        self._refusal: BaseException | None = None  # why a posted record of this run was refused
        self._lingering: _Tick | None = None  # posted records waiting (a bounded linger) for a record to ride with
        self._linger_timer: asyncio.TimerHandle | None = None

    async def record(self, events: Sequence[LogEvent], launch: Launch | None = None) -> bool:
        """Append ``events`` after whatever rides with them, and wait until they are committed.

        What rides along, in this order: posted records still lingering (a settlement), the buffered
        ``now``/``uuid`` values and a completed model response not yet committed (docs/design.md §3: one commit before
        a tool runs holds the response and the calls it declares). The records of one loop tick go to the
        conductor as one batch (a parallel-safe group's prepared calls commit together). A posted record that
        failed to commit surfaces here, before anything more is recorded.

        With ``launch`` (a prepared record of a sync tool), the tool starts in the conductor's thread as the batch
        commits (`_Launch`), which then also hits ``engine.after_response_commit``; unless an awaited record without
        a launch already waits in this tick: its boundary failpoints are hit on the loop once it resumes, and the
        launch would hit its own before them (failpoint hit counts follow the records' order), so this call starts
        its tool on the loop too.

        Returns:
            Whether ``launch`` was taken (its hook runs when the batch commits).

        Raises:
            AttemptSupersededError: This attempt may append nothing more (or an earlier posted record was refused).
            ProtocolError: The fold refused the batch.
            ChainBreakError: The batch does not continue its conversation's chain.
        """
        self.raise_failed_posts()
        batch = [*self.buffer, *events]
        self.buffer.clear()
        if not batch:
            return False
        with_response = any(isinstance(e, ModelResponseCompleted) for e in batch)
        tick = self._open_tick()
        if launch is not None and tick.plain_waiters:
            launch = None
        if launch is not None:
            launch.with_response = with_response
            tick.on_commit.append(launch.fire)
        else:
            tick.plain_waiters = True
        await asyncio.shield(self._send(batch))
        self.raise_failed_posts()
        if with_response and launch is None:
            failpoint("engine.after_response_commit")  # the response is canonical; the tools it declares not run
        return launch is not None

    def post(self, events: Sequence[LogEvent], on_commit: Callable[[], None] | None = None) -> None:
        """Hand ``events`` to the conductor without waiting for their commit (a tool's settlement, docs/design.md §3).

        They linger up to `RunOptions.settle_linger_s` for a record of this run to share their transaction (with
        an instant model, the next response and its first prepared call), then go on their own; they never wait
        on a model or tool call. Either way they are ordered in the conversation's chain before anything this run
        records later, so they commit in the same or an earlier transaction than its next awaited record. An
        error recording them surfaces at the run's next awaited record or at its end (`flush`). ``on_commit`` runs
        in the conductor's thread right after they commit (a crash-matrix failpoint).
        """
        linger_s = self._options.settle_linger_s
        if self._tick is not None or linger_s <= 0:
            group = self._open_tick()  # a hand-off is due this tick anyway: ride with it
        elif self._lingering is not None:
            group = self._lingering
        else:
            loop = asyncio.get_running_loop()
            group = self._lingering = self._new_group(loop)
            self._linger_timer = loop.call_later(linger_s, self._end_linger)
        group.events.extend(events)
        if on_commit is not None:
            group.on_commit.append(on_commit)
        if group.done not in self._posted:
            self._posted.append(group.done)

    async def post_in_order(self, events: Sequence[LogEvent], on_commit: Callable[[], None] | None = None) -> None:
        """`post` ``events`` behind what rides along, so the chain keeps the run's order (a pure step's record).

        The buffered ``now``/``uuid`` values go with them: a posted group may commit alone, and the log must never
        hold a later record without the values recorded before it (a replayed pure step computed from a ``now``
        that replay would draw again). A buffered model response is committed first, awaited (`flush_response`):
        posted, it would escape the check that commits a response before the next prompt. A posted record refused
        earlier surfaces here, and nothing more is handed over.

        Raises:
            AttemptSupersededError: This attempt may append nothing more (or an earlier posted record was refused).
            ProtocolError: The fold refused the buffered response's batch.
            ChainBreakError: The buffered response's batch does not continue its conversation's chain.
        """
        await self.flush_response()
        self.raise_failed_posts()
        batch = [*self.buffer, *events]
        self.buffer.clear()
        self.post(batch, on_commit)

    def _new_group(self, loop: asyncio.AbstractEventLoop) -> _Tick:
        group = _Tick(loop.create_future())
        self._inflight.add(group.done)
        group.done.add_done_callback(self._inflight.discard)
        return group

    def _open_tick(self) -> _Tick:
        """The group handed to the conductor at the end of this loop tick (lingering posts first), opened once."""
        if self._tick is None:
            loop = asyncio.get_running_loop()
            lingering, self._lingering = self._lingering, None
            if lingering is not None:
                self._cancel_linger_timer()
            self._tick = lingering or self._new_group(loop)
            loop.call_soon(self._hand_off)
        return self._tick

    def _cancel_linger_timer(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None

    def _end_linger(self) -> None:
        """The linger is over (or the run ends): hand the lingering posts over on their own."""
        self._linger_timer = None
        if self._lingering is not None:
            self._open_tick()

    def _send(self, events: Sequence[LogEvent]) -> asyncio.Future[None]:
        """Queue ``events`` for this tick's hand-off; the future resolves once they commit."""
        tick = self._open_tick()
        tick.events.extend(events)
        return tick.done

    def _hand_off(self) -> None:
        tick, self._tick = self._tick, None
        assert tick is not None  # scheduled only with a tick
        try:
            committed = self._run.record(tuple(tick.events))
        except Exception as exc:  # noqa: BLE001 - handed to every waiter of the tick, who raises it
            tick.done.set_exception(exc)
            return
        hooks = tuple(tick.on_commit)
        waiter = tick.done
        doorbell = _doorbell(asyncio.get_running_loop())

        def copy(source: Future[None]) -> None:  # on the run's loop
            if waiter.done():
                return
            exc = (
                AttemptSupersededError("the record's commit was cancelled")
                if source.cancelled()
                else source.exception()
            )
            if exc is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(None)

        def resolved(source: Future[None]) -> None:  # in the conductor's thread: one wake-up of the loop per batch
            # One callback, hooks first: the loop learns of the commit only after every hook ran (a `_Launch` has
            # started its tool or kept its error), whichever thread resolves the future and whenever.
            if hooks and not source.cancelled() and source.exception() is None:
                for hook in hooks:
                    try:
                        hook()
                    except Exception:  # noqa: BLE001 - a hook's error (a failpoint's raise) cannot reach the run
                        _log.exception("a commit hook raised; the next hooks still run", extra={"hook": repr(hook)})
            doorbell.post(copy, source)

        committed.add_done_callback(resolved)

    def raise_failed_posts(self) -> None:
        if self._refusal is not None:
            raise self._refusal  # a record of this run was refused: nothing after it may be recorded
        for fut in [f for f in self._posted if f.done()]:
            self._posted.remove(fut)
            exc = fut.exception()
            if exc is not None:
                self._refusal = exc
                raise exc

    async def _wait_posted(self) -> None:
        """Hand the lingering posts over now; wait until every posted record committed; raise the first error."""
        self._end_linger_now()
        while self._posted:
            await asyncio.wait(self._posted)
            self.raise_failed_posts()

    def _end_linger_now(self) -> None:
        self._cancel_linger_timer()
        self._end_linger()

    async def flush(self) -> None:
        """Commit the buffered records and wait for every posted one (the runtime does it before the reply)."""
        await self.record(())
        await self._wait_posted()

    async def after_failure(self) -> None:
        """The agent raised: commit what rides along (a model response stays auditable and replays), logging errors."""
        if not self.buffer or self._refusal is not None:
            return
        try:
            await self.record(())
        except Exception as exc:  # noqa: BLE001 - the run's own error propagates; this one is logged beside it
            _log.warning("records of a failed run were not committed", extra={"error": repr(exc)})

    async def quiesce(self) -> None:
        """Wait until every record handed to the conductor is committed or refused (the run's last act).

        The conductor then never sees a finished run with a record of it still in flight.
        """
        self._end_linger_now()
        while self._inflight:
            await asyncio.wait(set(self._inflight))
        for fut in self._posted:
            exc = fut.exception()
            if exc is not None:
                _log.warning("a posted record of a stopped run was not committed", extra={"error": repr(exc)})
        self._posted.clear()

    async def flush_response(self) -> None:
        """Commit a buffered model response before anything but a tool acts on it (docs/semantics.md §9; DUR-008)."""
        if any(isinstance(e, ModelResponseCompleted) for e in self.buffer):
            await self.record(())
