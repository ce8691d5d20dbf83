"""RunContext: the durable effects agent code calls, recorded in ``settled.log`` and replayed on re-entry (issue 6).

An agent is ``async def agent(ctx: RunContext) -> reply``. Every effect it asks for takes the next **callsite
ordinal** of the run when it is *called* (so parallel effects — ``asyncio.gather`` over several ``ctx.tool`` —
reserve their ordinals in call order and replay aligns whatever order they finish in). On re-entry (a new attempt
after a crash, a takeover, a retry) the run gets its submission's journal: at a recorded ordinal the recorded
outcome is returned — or the recorded error re-raised — without running anything; a different effect or payload at
a recorded ordinal raises `ReplayDivergenceError` naming the ordinal, the expected and the actual effect. Ordinals are
scoped to one run (one submission), so two submissions calling the same tool with the same arguments never replay
each other.

* ``await ctx.tool(name, args)`` (docs/design.md §5, docs/semantics.md §10): ``ToolCallPrepared`` committed → the tool
  runs with its idempotency key and the owner epoch → ``ToolCallSettled`` (result or typed application error) handed
  over. A call in doubt (transport error, timeout) is retried under the same key when the tool is idempotent or
  reconcilable; otherwise it is marked ``ToolCallUnknown`` and the run stops (DUR-009): recovery records the Unknown
  decision and the run holds no pool slot until a signed resolution.
* ``ctx.now()`` / ``ctx.uuid()``: recorded (``EffectRecorded``) and committed with the next effect at the latest
  (or before the reply); identical on replay (docs/design.md §3).
* ``await ctx.step(name, fn, *args, version=...)``: an at-least-once body under a stable step id; exactly one
  recorded success (``StepRecorded``); a failure is not recorded and re-executes on the next attempt (DUR-010).
* ``await ctx.model(provider, messages)``: the completed response is committed before anything acts on it (DUR-008).

Each record reaches the log through the conductor (`settled.processors.AgentRun.record`), in one of three ways
(docs/design.md §3; docs/architecture.md "Commits per tool call"): *awaited* (prepared, refused, Unknown, step, deltas:
the run goes on once the checkpoint holding it commits, so a tool never runs before its prepared record commits);
*riding along* (``now``/``uuid`` values and a completed model response, committed with the next awaited record: a
response and the first call it declares — a parallel-safe group's calls — share one commit); *posted* (a tool's
settlement: the run goes on to its next model call while it commits; it lingers `RunOptions.settle_linger_s` for the
run's next record; an error recording it surfaces at the next awaited record or at the run's end, and nothing after
it is recorded). A superseded attempt's late work fails with `AttemptSupersededError` and appends nothing. Runs
execute on one event loop per worker process (`_RunLoop`); agent code must not block it.

Failpoints at the crash-matrix boundaries (docs/semantics.md §15): ``engine.after_prepared_commit`` (prepared, not
invoked), ``engine.tool_returned`` (returned, result not committed), ``engine.after_settled_commit`` (hit in the
conductor's thread right after the transaction holding the settlement commits), ``engine.step_returned``,
``engine.after_step_commit``, ``engine.after_delta_commit`` (mid-provider stream), ``engine.after_response_commit``
(the model item committed — with the prepared record of the first call it declares, which is the merged boundary
"after model item commit" / "after tool prepared, before invocation") and ``engine.run_returned`` (the reply is
decided, the settlement not staged). "During invocation" is inside the tool: a test tool hits its own failpoint
there. "After claim, before canonical input" and "before Attempt start" share one transaction with the claim's
scheduling (``AttemptStarted`` and ``InputApplied`` are one batch): ``worker.before_checkpoint`` covers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import logging
import threading
import time
import uuid as uuid_module
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn

from settled._failpoints import FailpointError, failpoint
from settled._faults import fault_enabled
from settled.processors import AgentRun, AttemptSupersededError, CancelSignal, defer_wakeup
from settled.protocol import ReconcileAnswer, Reconciliation
from settled.runtime._errors import (
    ReplayDivergenceError,
    RunCancelledError,
    RunSuspended,
    ToolCallError,
    ToolRefusedError,
    ToolTransportError,
    ToolUnavailableError,
    UnsafeReplayError,
)
from settled.runtime._model import (
    Message,
    ModelProvider,
    ModelRequest,
    ModelResponse,
    ProviderError,
    TextDelta,
    ToolArgumentsDelta,
    ToolDeclaration,
)
from settled.runtime._tools import ToolCall, ToolRegistry, ToolSpec, call_in_thread, invoke, start, still_unknown
from settled.schemas import (
    RESULT_TOO_LARGE,
    CanonicalJsonError,
    DeltaKind,
    EffectKind,
    EffectRecorded,
    LogEvent,
    ModelResponseCompleted,
    ModelResponseDelta,
    RecoveryDecision,
    RecoveryDecisionKind,
    ResolutionKind,
    StepRecorded,
    ToolCallPrepared,
    ToolCallRefused,
    ToolCallSettled,
    ToolCallUnknown,
    ToolError,
    UnknownResolved,
    canonical_json,
    json_digest,
)

__all__ = ["AgentFunction", "RunContext", "RunOptions", "execute"]

_log = logging.getLogger(__name__)

#: Errors that mean "no answer": the call's outcome is in doubt (docs/design.md §5).
IN_DOUBT_ERRORS: tuple[type[BaseException], ...] = (ToolTransportError, ConnectionError, TimeoutError)


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class RunOptions:
    """How runs execute effects.

    Attributes:
        clock: The clock ``ctx.now()`` reads (aware UTC); tests may offset it.
        abort_grace_s: After an abort (or any cancellation), how long a call in flight may still return and
            settle before the run stops with it in doubt (docs/design.md §5).
        max_result_bytes: Largest canonical tool or step result recorded inline; a larger tool result is recorded
            as the error ``result_too_large`` with its digest (a larger step result fails the step, larger tool
            arguments fail the call before anything is recorded).
        retry_backoff_s: First delay between retries of an in-doubt idempotent call (doubling, at most 2 s).
        delta_flush_every: A model response's text and reasoning deltas are recorded (canonical audit content)
            every this many deltas, and the rest with the completed response; 0 records no deltas
            (docs/semantics.md §9).
        model_retries: Retries of one model call after a retryable provider error (the per-operation budget).
        model_backoff_s: First delay between model retries when the provider gave none (doubling).
        settle_linger_s: How long a tool's settlement, which the run does not wait for, may wait for the run's
            next record to share its transaction (docs/design.md §3: "records produced within a few milliseconds'
            linger"); with an instant model that makes one commit a call. 0 hands it over at once.
    """

    clock: Callable[[], datetime] = _utcnow
    abort_grace_s: float = 5.0
    max_result_bytes: int = 262_144
    retry_backoff_s: float = 0.05
    delta_flush_every: int = 16
    model_retries: int = 3
    model_backoff_s: float = 0.5
    settle_linger_s: float = 0.002


def _ordinal_of(call_id: str) -> int | None:
    _, sep, tail = call_id.rpartition("#")
    return int(tail) if sep and tail.isdigit() else None


def _describe(event: LogEvent) -> str:
    if isinstance(event, ToolCallPrepared):
        return f"tool {event.tool!r} with arguments {event.args_digest[:12]}"
    if isinstance(event, ToolCallRefused):
        return f"tool {event.tool!r} with arguments {event.args_digest[:12]}"
    if isinstance(event, StepRecorded):
        return f"step {event.name!r} version {event.version}"
    if isinstance(event, EffectRecorded):
        return f"ctx.{event.kind.value}()"
    if isinstance(event, ModelResponseCompleted):
        return f"a model response ({event.provider}/{event.model})"
    return type(event).__name__


class _Journal:
    """A run's recorded effects, indexed for replay."""

    def __init__(self, events: Sequence[LogEvent]) -> None:
        self.by_ordinal: dict[int, LogEvent] = {}
        self.settled: dict[str, ToolCallSettled] = {}
        self.resolved: dict[str, UnknownResolved] = {}
        self.retry_ok: set[str] = set()
        for e in events:
            if isinstance(e, (ToolCallPrepared, StepRecorded, EffectRecorded)):
                self.by_ordinal.setdefault(e.ordinal, e)
            elif isinstance(e, ModelResponseCompleted):
                self.by_ordinal.setdefault(e.response_ordinal, e)
            elif isinstance(e, ToolCallRefused):
                ordinal = _ordinal_of(e.call_id)
                if ordinal is not None:
                    self.by_ordinal.setdefault(ordinal, e)
            elif isinstance(e, ToolCallSettled):
                self.settled[e.call_id] = e
            elif isinstance(e, UnknownResolved):
                self.resolved[e.call_id] = e
                if e.kind is ResolutionKind.SAFE_TO_RETRY:
                    self.retry_ok.add(e.call_id)
            elif isinstance(e, RecoveryDecision) and e.decision in (
                RecoveryDecisionKind.SAFE_RETRY,
                RecoveryDecisionKind.RECONCILE,
            ):
                self.retry_ok.update(e.call_ids)


@dataclass(frozen=True)
class _Answer:
    """A tool's answer, ready to record: a canonical result or a typed application error."""

    result_json: str | None = None
    result_digest: str | None = None
    error: ToolError | None = None


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


class _Launch:
    """A sync tool started from the conductor's thread as its prepared record commits (docs/design.md §3).

    The run's loop would otherwise learn of the commit (one wake-up of the loop), then start the tool (one wake-up
    of a tool thread): the tool starts one thread hop earlier, and its result still reaches the run through the
    loop. `fire` runs right after the commit and before the run's loop is woken, so the crash-matrix failpoints
    between the commit and the tool (``engine.after_response_commit`` when the response rode along, then
    ``engine.after_prepared_commit``) are hit here, in the same order and before the tool starts
    (docs/semantics.md §15). An error (a ``raise`` failpoint, a thread that could not start) is kept and raised on the
    run's loop where the failpoint would have been hit; the tool is then not started.
    """

    def __init__(self, spec: ToolSpec, args: dict[str, Any], call: ToolCall) -> None:
        self.spec = spec
        self.args = args
        self.call = call
        self.with_response = False  # set when the record is handed over: the response rides with this prepared
        self.future: Future[Any] | None = None
        self.started_s = 0.0  # time.monotonic() when the tool started
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._abandoned = False

    def fire(self) -> None:
        """Hit the boundary failpoints, then start the tool on a daemon thread (in the conductor's thread).

        Runs before the run's loop is told of the commit (`RunContext._hand_off` runs the commit hooks, then wakes
        the loop), so the loop reads ``future`` and ``error`` after they are set. A run that stopped waiting
        meanwhile (`abandon`) gets no tool started, as before the launch moved here.
        """
        try:
            if self.with_response:
                failpoint("engine.after_response_commit")
            failpoint("engine.after_prepared_commit")
            with self._lock:
                if self._abandoned:
                    return
                self.started_s = time.monotonic()
                self.future = call_in_thread(self.spec.fn, dict(self.args), self.call)
        except Exception as exc:  # noqa: BLE001 - raised on the run's loop (`RunContext._execute`), never lost
            self.error = exc

    def abandon(self) -> bool:
        """The run stopped waiting for the commit (cancelled): start nothing from now on.

        Returns:
            Whether the tool had already started (it then runs on, as a tool in flight does when its run is
            cancelled past the abort grace; the call stays prepared for recovery).
        """
        with self._lock:
            self._abandoned = True
            return self.future is not None


class RunContext:
    """What agent code gets: the run's identity, its input, and its durable effects.

    Attributes:
        conversation_id: The conversation.
        submission_id: The submission.
        run_id: The logical run id (stable across attempts).
        attempt_id: This attempt's id.
        attempt: This attempt's number (1, 2, ...).
        owner_epoch: The owner epoch (a fencing token).
        input_json: The submission's input, canonical JSON.
        tools_offered: Tool names offered for the turn (empty: every registered tool).
        history: The conversation's earlier settled submissions (when the app keeps history).
    """

    def __init__(self, run: AgentRun, tools: ToolRegistry, options: RunOptions | None = None) -> None:
        self._run = run
        self._tools = tools
        self._options = options or RunOptions()
        self._journal = _Journal(run.journal)
        self._ordinal = 0
        self._buffer: list[LogEvent] = []  # rides with the next awaited record (now/uuid values, a response)
        self._tick: _Tick | None = None  # records of this loop tick, handed to the conductor at its end
        self._posted: list[asyncio.Future[None]] = []  # handed over, not awaited (settlements)
        self._inflight: set[asyncio.Future[None]] = set()  # every hand-off not yet committed or refused
        self._refusal: BaseException | None = None  # why a posted record of this run was refused
        self._lingering: _Tick | None = None  # posted records waiting (a bounded linger) for a record to ride with
        self._linger_timer: asyncio.TimerHandle | None = None
        self._serial = asyncio.Lock()
        self.conversation_id = run.conversation_id
        self.submission_id = run.submission_id
        self.run_id = run.run_id or run.submission_id
        self.attempt_id = run.attempt_id
        self.attempt = run.attempt
        self.owner_epoch = run.owner_epoch
        self.input_json = run.input_json
        self.tools_offered = run.tools_offered
        self.history = run.history

    @property
    def input(self) -> Any:
        """The submission's input, decoded from JSON."""
        return json.loads(self.input_json)

    @property
    def cancelled(self) -> bool:
        """True once the run must stop (an abort is canonical, or the attempt was superseded)."""
        return self._run.cancelled.is_set()

    # -- plumbing ------------------------------------------------------------------------------------------------

    def _next_ordinal(self) -> int:
        ordinal = self._ordinal
        self._ordinal += 1
        return ordinal

    async def _record(self, events: Sequence[LogEvent], launch: _Launch | None = None) -> bool:
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
        self._raise_failed_posts()
        batch = [*self._buffer, *events]
        self._buffer.clear()
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
        self._raise_failed_posts()
        if with_response and launch is None:
            failpoint("engine.after_response_commit")  # the response is canonical; the tools it declares not run
        return launch is not None

    def _post(self, events: Sequence[LogEvent], on_commit: Callable[[], None] | None = None) -> None:
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

    def _raise_failed_posts(self) -> None:
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
            self._raise_failed_posts()

    def _end_linger_now(self) -> None:
        self._cancel_linger_timer()
        self._end_linger()

    async def flush(self) -> None:
        """Commit the buffered records and wait for every posted one (the runtime does it before the reply)."""
        await self._record(())
        await self._wait_posted()

    async def _after_failure(self) -> None:
        """The agent raised: commit what rides along (a model response stays auditable and replays), logging errors."""
        if not self._buffer or self._refusal is not None:
            return
        try:
            await self._record(())
        except Exception as exc:  # noqa: BLE001 - the run's own error propagates; this one is logged beside it
            _log.warning("records of a failed run were not committed", extra={"error": repr(exc)})

    async def _quiesce(self) -> None:
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

    async def _flush_response(self) -> None:
        """Commit a buffered model response before anything but a tool acts on it (docs/semantics.md §9; DUR-008)."""
        if any(isinstance(e, ModelResponseCompleted) for e in self._buffer):
            await self._record(())

    def _recorded(self, ordinal: int) -> LogEvent | None:
        return self._journal.by_ordinal.get(ordinal)

    # -- now / uuid ----------------------------------------------------------------------------------------------

    def _effect(self, kind: EffectKind, make: Callable[[], str]) -> str:
        ordinal = self._next_ordinal()
        rec = self._recorded(ordinal)
        if rec is not None:
            if not (isinstance(rec, EffectRecorded) and rec.kind is kind):
                raise ReplayDivergenceError(ordinal, _describe(rec), f"ctx.{kind.value}()")
            return rec.value
        value = make()
        self._buffer.append(
            EffectRecorded(
                submission_id=self.submission_id, attempt_id=self.attempt_id, kind=kind, ordinal=ordinal, value=value
            )
        )
        return value

    def now(self) -> datetime:
        """Return the current time (aware UTC), recorded: a replay returns the recorded value (docs/design.md §3).

        Returns:
            The time.

        Raises:
            ReplayDivergenceError: Another effect is recorded at this ordinal.
        """

        def make() -> str:
            value = self._options.clock()
            if value.tzinfo is None:
                raise ValueError(f"the run clock returned a naive datetime {value!r}; settled records aware UTC")
            return value.astimezone(UTC).isoformat()

        return datetime.fromisoformat(self._effect(EffectKind.NOW, make))

    def uuid(self) -> uuid_module.UUID:
        """Return a random UUID (version 4), recorded: a replay returns the recorded value.

        Returns:
            The UUID.

        Raises:
            ReplayDivergenceError: Another effect is recorded at this ordinal.
        """
        return uuid_module.UUID(self._effect(EffectKind.UUID, lambda: str(uuid_module.uuid4())))

    # -- durable steps (DUR-010) ---------------------------------------------------------------------------------

    def step(self, name: str, fn: Callable[..., Any], *args: Any, version: int = 1) -> Coroutine[Any, Any, Any]:
        """Run a durable step: at-least-once body, exactly one recorded success (DUR-010, docs/semantics.md §11).

        The ordinal is taken when this is called. A recorded success is returned without running ``fn``; a
        failure is not recorded (the exception propagates, and the next attempt runs the body again).

        Args:
            name: The step's name.
            fn: The body (sync, on a thread, or async); returns a JSON value.
            *args: Its arguments.
            version: The step's version; a different version recorded at this ordinal is a divergence.

        Returns:
            An awaitable of the step's result (decoded from its canonical JSON, live and on replay alike).

        Raises:
            ReplayDivergenceError: Another effect, step name or version is recorded at this ordinal (when awaited).
        """
        return self._step(self._next_ordinal(), name, fn, args, version)

    async def _step(self, ordinal: int, name: str, fn: Callable[..., Any], args: tuple[Any, ...], version: int) -> Any:
        rec = self._recorded(ordinal)
        actual = f"step {name!r} version {version}"
        if rec is not None:
            if not (isinstance(rec, StepRecorded) and rec.name == name and rec.version == version):
                raise ReplayDivergenceError(ordinal, _describe(rec), actual)
            return json.loads(rec.result_json)
        await self._flush_response()  # a step body acts on committed responses only (docs/semantics.md §9)
        value = await invoke(fn, *args)
        result_json = canonical_json(value)
        size = len(result_json.encode())
        if size > self._options.max_result_bytes:
            raise ValueError(
                f"step {name!r} result is {size} bytes, over max_result_bytes {self._options.max_result_bytes}"
            )
        failpoint("engine.step_returned")
        step_id = json_digest(canonical_json([self.run_id, ordinal, "step", name]))
        await self._record(
            [
                StepRecorded(
                    submission_id=self.submission_id,
                    attempt_id=self.attempt_id,
                    name=name,
                    version=version,
                    step_id=step_id,
                    ordinal=ordinal,
                    result_json=result_json,
                    result_digest=json_digest(result_json),
                )
            ]
        )
        failpoint("engine.after_step_commit")
        return json.loads(result_json)

    # -- tools (docs/design.md §5, docs/semantics.md §10) --------------------------------------------------------------

    @property
    def tools(self) -> ToolRegistry:
        """The app's registered tools."""
        return self._tools

    def tool(
        self, name: str, args: Mapping[str, Any] | None = None, *, offered: Sequence[str] | None = None
    ) -> Coroutine[Any, Any, Any]:
        """Call a tool durably: prepared committed → executed with its key and the owner epoch → settled committed.

        The ordinal is taken when this is called (parallel calls replay in call order).

        Args:
            name: The tool's name.
            args: Its arguments, a JSON object.
            offered: The tools offered for this call (default: the submission's ``tools_offered``; empty: all); a
                call outside them is refused (recorded as ``ToolCallRefused``; nothing runs).

        Returns:
            An awaitable of the tool's result (decoded canonical JSON, live and on replay alike).

        Raises:
            ToolCallError: The tool answered with an error (recorded; re-raised identically on replay).
            ToolRefusedError: The tool was not offered for the turn (recorded as ``ToolCallRefused``; nothing ran).
            UnknownToolError: No tool of that name is registered.
            ReplayDivergenceError: Another effect, tool or argument digest is recorded at this ordinal.
            ToolUnavailableError: An idempotent call stayed in doubt past its retry budget (the attempt ends).
            CanonicalJsonError: ``args`` is not representable as canonical JSON.
            ValueError: ``args`` is larger than `RunOptions.max_result_bytes` (when awaited).
        """
        allowed = self.tools_offered if offered is None else tuple(offered)
        return self._tool(self._next_ordinal(), name, dict(args or {}), allowed)

    async def _tool(self, ordinal: int, name: str, args: dict[str, Any], allowed: Sequence[str]) -> Any:
        args_json = canonical_json(args)
        size = len(args_json.encode())
        if size > self._options.max_result_bytes:
            raise ValueError(
                f"tool {name!r}: arguments of {size} bytes are over max_result_bytes {self._options.max_result_bytes}"
            )
        digest = json_digest(args_json)
        call_id = f"{self.run_id}#{ordinal}"
        actual = f"tool {name!r} with arguments {digest[:12]}"
        rec = self._recorded(ordinal)
        if rec is not None:
            if not (isinstance(rec, (ToolCallPrepared, ToolCallRefused)) and rec.tool == name):
                raise ReplayDivergenceError(ordinal, _describe(rec), actual)
            if rec.args_digest != digest:
                raise ReplayDivergenceError(ordinal, _describe(rec), actual)
            if isinstance(rec, ToolCallRefused):
                raise ToolRefusedError(name, call_id, "not_offered", rec.reason, non_retryable=True)
            settled = self._journal.settled.get(call_id)
            if settled is not None:
                return self._replay(name, settled)
            resolved = self._journal.resolved.get(call_id)
            if resolved is not None and resolved.kind is ResolutionKind.CALL_OUTCOME:
                return None if resolved.result_json is None else json.loads(resolved.result_json)
            if call_id not in self._journal.retry_ok:
                raise UnsafeReplayError(call_id, name)
            # A recovery decision or a resolution declared it safe: prepared again under the same key.
        if allowed and name not in allowed:
            reason = f"not_offered: tool {name!r} is not offered for this turn (offered: {sorted(allowed)})"
            await self._record(
                [
                    ToolCallRefused(
                        submission_id=self.submission_id,
                        attempt_id=self.attempt_id,
                        call_id=call_id,
                        tool=name,
                        args_digest=digest,
                        reason=reason,
                    )
                ]
            )
            raise ToolRefusedError(name, call_id, "not_offered", reason, non_retryable=True)
        spec = self._tools.get(name)
        prepared = ToolCallPrepared(
            submission_id=self.submission_id,
            run_id=self.run_id,
            attempt_id=self.attempt_id,
            call_id=call_id,
            ordinal=ordinal,
            tool=name,
            args_json=args_json,
            args_digest=digest,
            idempotency_key=spec.key_for(self.run_id, ordinal, args_json, args),
            owner_epoch=self.owner_epoch,
        )
        work = asyncio.ensure_future(self._execute(spec, prepared, args))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            if not work.done():
                # Abort or revoke while the call is in flight: a bounded grace to return and settle (docs/design.md §5).
                await asyncio.wait({work}, timeout=self._options.abort_grace_s)
                if not work.done():
                    work.cancel()  # still in flight: the call stays prepared; recovery classifies it
                elif not work.cancelled() and work.exception() is not None:
                    # The call ended within the grace, but its settlement could not be recorded (e.g. the attempt
                    # was superseded): the call stays prepared for recovery. Reported here, as the run is cancelled.
                    _log.warning(
                        "a tool call of a cancelled run ended without a recorded settlement",
                        extra={"call_id": call_id, "error": repr(work.exception())},
                    )
            raise

    # -- model calls (docs/semantics.md §9; DUR-008) -------------------------------------------------------------------

    def model(
        self,
        provider: ModelProvider,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolDeclaration] = (),
        model: str = "default",
    ) -> Coroutine[Any, Any, ModelResponse]:
        """Call a model durably: the completed response is committed before anything acts on it (DUR-008).

        See docs/semantics.md §9.

        The response is returned at once and committed with the run's next awaited record: the prepared record of
        the first call it declares (one commit before that tool runs, docs/design.md §3), else before the next prompt, a
        step's body or the reply. The ordinal is taken when this is called. A committed response at this ordinal is
        returned without calling the provider (a response whose tool batch has no prepared records resumes from its
        declaration). A stream
        cut mid-way left only deltas: they stay in the log as audit content, and the call is made again as a new
        response. Text and reasoning deltas are recorded as they arrive (`RunOptions.delta_flush_every`);
        tool-argument deltas never are. Retryable provider errors are retried within `RunOptions.model_retries`.

        Args:
            provider: The provider.
            messages: The prompt.
            tools: The tools offered to the model.
            model: The model name.

        Returns:
            An awaitable of the response.

        Raises:
            ReplayDivergenceError: Another effect is recorded at this ordinal (when awaited).
            ProviderError: A non-retryable provider error, or the retry budget is spent.
        """
        return self._model(self._next_ordinal(), provider, tuple(messages), tuple(tools), model)

    async def _model(
        self,
        ordinal: int,
        provider: ModelProvider,
        messages: tuple[Message, ...],
        tools: tuple[ToolDeclaration, ...],
        model: str,
    ) -> ModelResponse:
        rec = self._recorded(ordinal)
        if rec is not None:
            if not isinstance(rec, ModelResponseCompleted):
                raise ReplayDivergenceError(ordinal, _describe(rec), f"a model response ({provider.name}/{model})")
            return ModelResponse.from_record(rec)
        self._raise_failed_posts()
        await self._flush_response()  # an earlier response is canonical before the next prompt (docs/semantics.md §9)
        operation_id = json_digest(canonical_json([self.run_id, self.attempt_id, ordinal, "model"]))
        request = ModelRequest(operation_id=operation_id, model=model, messages=messages, tools=tools)
        delay_s = self._options.model_backoff_s
        retries = 0
        while True:
            try:
                response, deltas = await self._stream(provider, request, ordinal)
            except (ProviderError, ConnectionError, TimeoutError) as exc:
                retryable = exc.retryable if isinstance(exc, ProviderError) else True
                if not retryable or retries >= self._options.model_retries:
                    if isinstance(exc, ProviderError):
                        raise
                    raise ProviderError(f"{type(exc).__name__}: {exc}", retryable=True) from exc
                retries += 1
                wait_s = exc.retry_after_s if isinstance(exc, ProviderError) and exc.retry_after_s else delay_s
                _log.info("retrying a model call", extra={"operation_id": operation_id, "error": str(exc)})
                await asyncio.sleep(wait_s)
                delay_s *= 2
                continue
            break
        completed = ModelResponseCompleted(
            submission_id=self.submission_id,
            attempt_id=self.attempt_id,
            response_ordinal=ordinal,
            provider=provider.name,
            model=response.model or model,
            request_id=response.request_id,
            usage=response.usage,
            text=response.text,
            tool_calls=response.tool_calls,
        )
        # Committed with the next awaited record: the prepared calls it declares (one commit before the first tool
        # runs, docs/design.md §3), a refusal, a step, the next prompt or the reply — never after a tool runs (DUR-008).
        self._buffer.extend([*deltas, completed])
        return ModelResponse.from_record(completed)

    async def _stream(
        self, provider: ModelProvider, request: ModelRequest, ordinal: int
    ) -> tuple[ModelResponse, list[ModelResponseDelta]]:
        pending: list[ModelResponseDelta] = []
        index = 0
        every = self._options.delta_flush_every
        stream = provider.stream(request)
        try:
            async for event in stream:
                if isinstance(event, ModelResponse):
                    return event, pending
                if isinstance(event, ToolArgumentsDelta):
                    continue  # provisional: tool-argument deltas are never canonical (DUR-008)
                if every <= 0:
                    continue
                kind = DeltaKind.TEXT if isinstance(event, TextDelta) else DeltaKind.REASONING
                pending.append(
                    ModelResponseDelta(
                        submission_id=self.submission_id,
                        attempt_id=self.attempt_id,
                        response_ordinal=ordinal,
                        delta_index=index,
                        kind=kind,
                        text=event.text,
                    )
                )
                index += 1
                if len(pending) >= every:
                    batch, pending = pending, []
                    await self._record(batch)
                    failpoint("engine.after_delta_commit")
        finally:
            # Close the stream here, on this task: left to the event loop's async-generator finalizer, closing it
            # costs a thread-safe wake-up and a task per model call.
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        raise ProviderError(f"provider {provider.name!r} ended its stream without a response", retryable=True)

    def _replay(self, name: str, settled: ToolCallSettled) -> Any:
        if settled.error is not None:
            err = settled.error
            raise ToolCallError(name, settled.call_id, err.type, err.message, non_retryable=err.non_retryable)
        return None if settled.result_json is None else json.loads(settled.result_json)

    async def _execute(self, spec: ToolSpec, prepared: ToolCallPrepared, args: dict[str, Any]) -> Any:
        call = ToolCall(
            tool=spec.name,
            call_id=prepared.call_id,
            idempotency_key=prepared.idempotency_key,
            owner_epoch=prepared.owner_epoch,
            submission_id=self.submission_id,
            attempt=self.attempt,
        )
        async with contextlib.AsyncExitStack() as stack:
            if not spec.parallel_safe:
                await stack.enter_async_context(self._serial)
            if fault_enabled("tool_before_prepared_commit"):
                # Fault switch (DUR-009; tests/fault_switches.toml): the tool runs before its Prepared record
                # commits, so a crash in between leaves an invocation with no durable trace.
                answer = await self._answer(spec, prepared, call, args)
                await self._record([prepared])
                failpoint("engine.after_prepared_commit")
            else:
                # A sync tool starts as its prepared record commits, one thread hop sooner (`_Launch`).
                launch = None if inspect.iscoroutinefunction(spec.fn) else _Launch(spec, args, call)
                try:
                    launched = await self._record([prepared], launch)
                except asyncio.CancelledError:
                    if launch is not None and launch.abandon():
                        _log.warning(
                            "a cancelled run's tool started as its prepared record committed; it runs on unwatched",
                            extra={"call_id": prepared.call_id},
                        )
                    raise
                if not launched:
                    launch = None
                    failpoint("engine.after_prepared_commit")
                elif launch is not None and launch.error is not None:
                    raise launch.error
                answer = await self._answer(spec, prepared, call, args, launch)
            failpoint("engine.tool_returned")
            settled = ToolCallSettled(
                submission_id=self.submission_id,
                attempt_id=self.attempt_id,
                call_id=prepared.call_id,
                result_json=answer.result_json,
                result_digest=answer.result_digest,
                error=answer.error,
            )
            # Not awaited (docs/design.md §3): the run goes on (the next model call) while it commits; whatever the run
            # records next is ordered after it in the conversation's chain.
            self._post([settled], on_commit=_after_settled_commit)
        return self._replay(spec.name, settled)

    async def _answer(
        self,
        spec: ToolSpec,
        prepared: ToolCallPrepared,
        call: ToolCall,
        args: dict[str, Any],
        launch: _Launch | None = None,
    ) -> _Answer:
        """Execute until the tool answers (a result or an application error); retry in-doubt calls when safe.

        The first try awaits the tool ``launch`` started as its prepared record committed, when there is one.
        """
        deadline = time.monotonic() + spec.retry_budget_s
        delay_s = self._options.retry_backoff_s
        first = launch  # the first try only: a retry starts the tool again
        running: Awaitable[Any]
        while True:
            try:
                if first is not None and first.future is not None:
                    started, running = first.started_s, asyncio.wrap_future(first.future)
                else:
                    started, running = time.monotonic(), start(spec.fn, dict(args), call)
                first = None
                value = await asyncio.wait_for(running, max(spec.timeout_s - (time.monotonic() - started), 0.0))
                if inspect.isawaitable(value):  # a sync tool returned an awaitable: within the same timeout
                    value = await asyncio.wait_for(value, max(spec.timeout_s - (time.monotonic() - started), 0.0))
            except FailpointError:
                raise
            except IN_DOUBT_ERRORS as exc:
                why = f"no answer from tool {spec.name!r}: {type(exc).__name__}: {exc}".rstrip(": ")
                if isinstance(exc, TimeoutError):
                    why = f"tool {spec.name!r} gave no answer within timeout_s={spec.timeout_s:g}"
                if spec.reconcile is not None:
                    rec = await self._reconcile(spec, prepared)
                    if rec.answer is ReconcileAnswer.RECOVERED and rec.result_json is not None:
                        return _Answer(rec.result_json, json_digest(rec.result_json))
                    if rec.answer is ReconcileAnswer.UNKNOWN and not spec.idempotent:
                        await self._mark_unknown(
                            prepared.call_id, f"{why}; the reconciler answered unknown: {rec.reason}"
                        )
                elif not spec.idempotent:
                    await self._mark_unknown(
                        prepared.call_id, f"{why}; the tool is neither idempotent nor reconcilable"
                    )
                if time.monotonic() + delay_s > deadline:
                    raise ToolUnavailableError(
                        f"call {prepared.call_id} of tool {spec.name!r} stayed in doubt for retry_budget_s="
                        f"{spec.retry_budget_s:g}: {why}"
                    ) from exc
                _log.info("retrying an in-doubt call under its key", extra={"call_id": prepared.call_id, "why": why})
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 2.0)
                continue
            except Exception as exc:  # noqa: BLE001 - the tool answered with an error: recorded, replayed
                message = str(exc)
                non_retryable = bool(getattr(exc, "non_retryable", False))
                return _Answer(error=ToolError(type=type(exc).__name__, message=message, non_retryable=non_retryable))
            return self._result(spec, value)

    def _result(self, spec: ToolSpec, value: Any) -> _Answer:
        try:
            result_json = canonical_json(value)
        except CanonicalJsonError as exc:
            return _Answer(error=ToolError(type="invalid_output", message=str(exc), non_retryable=True))
        digest = json_digest(result_json)
        size = len(result_json.encode())
        if size > self._options.max_result_bytes:
            message = f"result of {size} bytes is over max_result_bytes {self._options.max_result_bytes}"
            return _Answer(
                result_digest=digest, error=ToolError(type=RESULT_TOO_LARGE, message=message, non_retryable=True)
            )
        return _Answer(result_json, digest)

    async def _reconcile(self, spec: ToolSpec, prepared: ToolCallPrepared) -> Reconciliation:
        try:
            answer: Reconciliation = await invoke(self._tools.reconcile, prepared)
        except FailpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - recorded: the call is in doubt with this reason
            return still_unknown(f"the reconciler of {spec.name!r} raised {type(exc).__name__}: {exc}")
        return answer

    async def _mark_unknown(self, call_id: str, reason: str) -> NoReturn:
        await self._record([ToolCallUnknown(submission_id=self.submission_id, call_id=call_id, reason=reason)])
        raise RunSuspended(f"call {call_id} is Unknown: {reason}")


def _after_settled_commit() -> None:
    """Runs in the conductor's thread right after a settlement commits (crash point "after tool result commit").

    See docs/semantics.md §15.
    """
    failpoint("engine.after_settled_commit")


#: An agent: ``async def agent(ctx) -> reply`` (a JSON value).
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
