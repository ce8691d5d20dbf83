"""The conductor: scheduling, attempts, effects, recovery, terminalization and abort for one owned partition.

Issue 5 (docs/semantics.md §5, §12, §13) and issue 6 (docs/semantics.md §8-§11, §14, §15; docs/design.md §3, §5). Driven
by the worker loop, one call per phase of a turn:

* `before_checkpoint` — stage the effects runs asked to record (each a canonical batch, checked against the
  overlay: only the submission's current, running attempt may append — attempt tokens fence superseded attempts
  inside one process, Kafka epochs fence other processes); drain finished runs and stage their settlements (or, for
  a run that raised, an interruption to retry, or a failed settlement once ``max_attempts`` is spent); classify
  submissions in Recovery with the pure classifier (`settled.protocol.classify`) and stage its decision *before*
  acting on it (DUR-013) — asking tools' reconcilers first when the classifier needs their answers; stage what the
  scheduler says next (``AttemptStarted``, canonical before the attempt runs, or an immediate aborted settlement of
  a queued submission). While submissions that recovery resumed after a death wait for their next attempt, they
  start one at a time and alone, and nothing else starts on the partition meanwhile (docs/design.md §5: a poison
  submission then dies alone and spends its own ``max_attempts``, not its neighbours'). The budget counts every
  attempt started, so the shared first death counts for each attempt it interrupted. The scheduler reads the pending
  overlay and visits every conversation with a pending batch, so an admission to an idle conversation and its
  ``AttemptStarted``, or a settlement and the next queued submission's, share the loop turn's one checkpoint
  (docs/architecture.md "Commit boundaries of a turn").
* `after_checkpoint` — resolve the effect futures whose batches committed (a run continues only once its record is
  canonical: e.g. ``ToolCallPrepared`` before the tool runs, docs/design.md §5); start the runs whose ``AttemptStarted``
  committed, handing each the journal of its submission's recorded effects to replay; cancel runs whose abort is
  canonical (DUR-012: the abort is canonical before the worker is interrupted) or whose attempt was superseded.

The journal (recorded tool calls, steps, ``now``/``uuid`` values, recovery decisions, resolutions, model records)
is kept per nonterminal submission from committed batches only (the owner's restore and checkpoints) and dropped
when the submission settles (docs/design.md §3 "Memory"). A run body that can launch itself (`RunLauncher`, the
runtime's: straight onto the worker's run loop, under its concurrency permits) is launched from the worker loop's
thread; any other runs on the worker's thread pool, whose size is then the permit count. A run suspended on a wait
(`WAITING_STATES`: Unknown calls, signals, approvals) holds no permit.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import heapq
import logging
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from settled import protocol
from settled._errors import ErrorCategory, SettledError
from settled._failpoints import failpoint
from settled._faults import fault_enabled
from settled.processors._ledger import to_loop_decision
from settled.processors._partition import Decision, PartitionOwner
from settled.protocol import (
    WAITING_STATES,
    LanePolicy,
    OpenCall,
    PartitionState,
    ReconcileAnswer,
    Reconciliation,
    RecoveryAction,
    RecoverySnapshot,
    RetryPolicy,
    SettleAborted,
    StartAttempt,
    SubmissionState,
    ToolSafety,
)
from settled.schemas import (
    ChainBreakError,
    EffectRecorded,
    LogBatch,
    LogEvent,
    ModelResponseCompleted,
    ModelResponseDelta,
    RecoveryDecision,
    RecoveryDecisionKind,
    Settlement,
    SettlementOutcome,
    SignalReceived,
    SteeringDelivered,
    SteeringReceived,
    StepRecorded,
    StepRetryScheduled,
    SubmissionAdmitted,
    SubmissionsJoined,
    ToolCallPrepared,
    ToolCallRefused,
    ToolCallSettled,
    ToolCallUnknown,
    UnknownResolved,
    WaitOutcome,
    WaitRequested,
    WaitResolved,
)

__all__ = [
    "JOURNAL_EVENT_TYPES",
    "Agent",
    "AgentRun",
    "AttemptSupersededError",
    "CancelSignal",
    "Conductor",
    "HeldSettlement",
    "HistoryTurn",
    "ResumeGate",
    "RunFailedError",
    "RunLauncher",
    "ToolPolicy",
]

_log = logging.getLogger(__name__)

#: The events a run's journal keeps: what replay and the recovery classifier read (docs/design.md §3, §5).
JOURNAL_EVENT_TYPES: tuple[type[LogEvent], ...] = (
    ToolCallPrepared,
    ToolCallSettled,
    ToolCallRefused,
    ToolCallUnknown,
    UnknownResolved,
    StepRecorded,
    StepRetryScheduled,
    EffectRecorded,
    RecoveryDecision,
    ModelResponseDelta,
    ModelResponseCompleted,
    WaitRequested,
    WaitResolved,
    SignalReceived,
    SteeringReceived,
    SteeringDelivered,
)


class RunFailedError(SettledError):
    """An agent's run ended with an error that is not worth retrying (``non_retryable``).

    Attributes:
        error_type: The error's type name, recorded in the settlement.
        non_retryable: Whether a new attempt could succeed.
    """

    category = ErrorCategory.REJECTED

    def __init__(self, error_type: str, reason: str, *, non_retryable: bool = True) -> None:
        super().__init__(reason)
        self.error_type = error_type
        self.non_retryable = non_retryable


class AttemptSupersededError(SettledError):
    """A run's effect cannot be recorded: its attempt is no longer the submission's running one (docs/semantics.md §6).

    Raised into the run (through the future `AgentRun.record` returned) when the attempt was aborted, timed out,
    interrupted or moved to Recovery, or when this worker's ownership of the partition ended. Late work of a
    superseded attempt appends nothing.
    """

    category = ErrorCategory.CONFLICT


class CancelSignal(threading.Event):
    """A `threading.Event` that also calls registered callbacks, once, when it is set (abort, revoke)."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []
        self._callback_lock = threading.Lock()

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the setting thread) when the signal is set; at once if it already is.

        Args:
            callback: A cheap, thread-safe function (e.g. ``loop.call_soon_threadsafe(task.cancel)``).
        """
        with self._callback_lock:
            if not self.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def set(self) -> None:
        """Set the signal and run the callbacks registered so far."""
        with self._callback_lock:
            if self.is_set():
                return
            super().set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


def _resolve(fut: Future[None], exc: BaseException | None = None) -> None:
    """Resolve an effect's future; one its run cancelled meanwhile stays cancelled (never an error in the loop)."""
    try:
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)
    except InvalidStateError:
        pass  # cancelled by its waiter: nobody is told


class _WakeBatch(threading.local):
    """The wake-ups deferred while this thread resolves a batch of effects (`batched_wakeups`)."""

    def __init__(self) -> None:
        self.calls: list[Callable[[], None]] | None = None


_WAKE_BATCH = _WakeBatch()


@contextlib.contextmanager
def batched_wakeups() -> Iterator[None]:
    """Run the wake-ups asked for with `defer_wakeup` while this block resolves effects once, at its end.

    Resolving an effect wakes the run's event loop (a byte on its self-pipe). Each such ``send`` releases the GIL,
    which the woken loop thread takes at once; the resolving thread then waits to get it back, once per effect. With
    50 runs in flight that cost more than the conductor's own work after a commit (``bench/engine.py``). Resolved
    together, the effects of one checkpoint wake each loop once. Nested blocks join the outermost.
    """
    if _WAKE_BATCH.calls is not None:
        yield
        return
    calls: list[Callable[[], None]] = []
    _WAKE_BATCH.calls = calls
    try:
        yield
    finally:
        _WAKE_BATCH.calls = None
        for call in calls:
            try:
                call()
            except Exception:  # noqa: BLE001 - one failed wake-up must not leave the other waiters asleep
                _log.exception("a deferred wake-up raised; the others still run", extra={"wakeup": repr(call)})


def defer_wakeup(wake: Callable[[], None]) -> bool:
    """Defer ``wake`` to the end of this thread's `batched_wakeups` block, if one is open.

    Args:
        wake: A cheap, thread-safe function that wakes a waiter (e.g. rings an event loop once).

    Returns:
        True when it was deferred; False when no block is open (the caller wakes at once).
    """
    calls = _WAKE_BATCH.calls
    if calls is None:
        return False
    calls.append(wake)
    return True


def _nothing() -> None:
    return None


def _no_recorder(events: Sequence[LogEvent]) -> Future[None]:
    fut: Future[None] = Future()
    fut.set_exception(AttemptSupersededError("this run has no recorder (it was not started by a conductor)"))
    return fut


#: What a run joined (issue 22 item 2): (submission id, its input as canonical JSON), in join order.
JoinedInputs = tuple[tuple[str, str], ...]


def _no_join(response_ordinal: int) -> Future[JoinedInputs]:
    fut: Future[JoinedInputs] = Future()
    fut.set_result(())
    return fut


def _never() -> bool:
    return False


@dataclass(frozen=True)
class HistoryTurn:
    """One settled submission of the conversation, as later runs may show it to a model (docs/semantics.md §10).

    Attributes:
        submission_id: The submission.
        input_json: Its input, canonical JSON.
        outcome: How it settled.
        events: Its committed effects in log order (`JOURNAL_EVENT_TYPES`); a model-driven agent keeps only the
            complete parts (never an orphan tool declaration or partial tool results of a failed or aborted run).
    """

    submission_id: str
    input_json: str
    outcome: SettlementOutcome
    events: tuple[LogEvent, ...]


@dataclass(frozen=True)
class AgentRun:
    """What an agent's run body gets.

    Attributes:
        conversation_id: The conversation.
        submission_id: The submission.
        attempt_id: This attempt's id (its token: a superseded attempt's result and effects are dropped).
        attempt: The attempt number (1, 2, ...).
        input_json: The submission's input, canonical JSON.
        owner_epoch: The owner epoch, a fencing token for outside systems (docs/design.md §3).
        cancelled: Set when the run must stop (abort, revoke, superseded); a run checks it or registers a callback.
        run_id: The logical run id, stable across attempts (part of every effect's key; the submission id).
        tools_offered: Tool names offered for the turn (empty: no restriction).
        journal: The submission's recorded effects, committed, in log order (`JOURNAL_EVENT_TYPES`), to replay.
        record: Stages events of this attempt for the next checkpoint; the future resolves once they are committed,
            or fails with `AttemptSupersededError` (or the fold's `settled.protocol.ProtocolError` or
            `settled.schemas.ChainBreakError`) when they cannot be.
        history: The conversation's earlier settled submissions, oldest first (only when the conductor keeps
            history, for model-driven agents).
        committed: Reads the submission's committed journal now (``journal`` grows as records commit): a workflow
            run reads the signals that came while it runs (a pause, issue 17 item 2) at its step boundaries.
        joined: The submissions the run joined so far (earlier attempts included), in join order, with their inputs
            (issue 22 item 2): read from the log's `SubmissionsJoined`, never from what is queued now.
        joinable: Whether the committed state has ready submissions the run could join now (``join`` lane only;
            `settled.protocol.joinable_prefix`): a cheap check the run makes before each model call it makes live.
        join: Asks the owner to join them (`settled.protocol.join`, on its current state); the future resolves, once
            their `SubmissionsJoined` is committed, with the ones joined now (empty: none), or fails like ``record``.
    """

    conversation_id: str
    submission_id: str
    attempt_id: str
    attempt: int
    input_json: str
    owner_epoch: int
    cancelled: threading.Event
    run_id: str = ""
    tools_offered: tuple[str, ...] = ()
    journal: tuple[LogEvent, ...] = ()
    record: Callable[[Sequence[LogEvent]], Future[None]] = _no_recorder
    history: tuple[HistoryTurn, ...] = ()
    committed: Callable[[], tuple[LogEvent, ...]] = tuple
    joined: JoinedInputs = ()
    joinable: Callable[[], bool] = _never
    join: Callable[[int], Future[JoinedInputs]] = _no_join


#: An agent's run body: returns the final reply as canonical JSON, or raises.
Agent = Callable[[AgentRun], str]


@runtime_checkable
class RunLauncher(Protocol):
    """A run body that starts itself without a pool thread (`settled.runtime.RunLauncher`).

    The conductor calls `launch` from the worker loop's thread, after the attempt's ``AttemptStarted`` committed;
    it must return at once (the run goes on elsewhere, e.g. on an event loop) and bound its runs itself.
    """

    def __call__(self, run: AgentRun) -> str:
        """Run the attempt and wait for it (the `Agent` shape)."""
        ...

    def launch(self, run: AgentRun) -> Future[str]:
        """Start the attempt; return at once with the future of its reply (canonical JSON) or of what it raised."""
        ...


class ToolPolicy(Protocol):
    """What the conductor needs to know about tools to classify recovery (docs/design.md §5; see `settled.runtime`)."""

    def safety(self, tool: str) -> ToolSafety | None:
        """Return the tool's declared safety, or None when no tool of that name is registered."""
        ...

    def reconcile(self, prepared: ToolCallPrepared) -> Reconciliation:
        """Ask the tool's reconciler about a prepared call (blocking I/O; bounded by the tool's timeout).

        Raises:
            Exception: Whatever the reconciler raised; the conductor classifies the call as in doubt.
        """
        ...


@dataclass
class _Running:
    run: AgentRun
    future: Future[str]


@dataclass
class _Effect:
    conversation_id: str
    submission_id: str
    attempt_id: str
    events: tuple[LogEvent, ...]
    future: Future[None]
    join_ordinal: int | None = None  # a join request (issue 22 item 2): its events are decided when it is staged
    joined: JoinedInputs = ()  # what the staged join takes in


@dataclass(frozen=True)
class HeldSettlement:
    """Tool results a run handed over that were not committed when its partition was dropped (e.g. a broker outage).

    The worker keeps them across the drop and hands them to its next claim of the partition (`Conductor.adopt`),
    which commits them only when no other owner claimed the partition in between (docs/design.md §5).

    Attributes:
        conversation_id: The conversation of the submission.
        submission_id: The submission whose calls they settle.
        events: One ``ToolCallSettled`` per call.
    """

    conversation_id: str
    submission_id: str
    events: tuple[ToolCallSettled, ...]


#: `Conductor._schedule`'s "no restriction" marker.
_ANY = "\x00any"

#: Recovery decisions that send a submission back to Ready for another attempt.
_RESUMING = frozenset({RecoveryDecisionKind.RESUME, RecoveryDecisionKind.SAFE_RETRY, RecoveryDecisionKind.RECONCILE})


class ResumeGate:
    """One worker process's gate for attempts resumed after an unexplained death (docs/design.md §5).

    The conductors of one process share it (`Conductor.join_process`; a conductor on its own has a gate of its
    own). A *suspect* is a Ready submission whose last attempt recovery resumed after a death and that has not run
    since. While any conductor of the process holds a suspect, nothing new starts anywhere in the process until no
    attempt runs (or is staged to start) in it; then only the first suspect (lowest partition, then the
    conversation's order) starts, alone. A poison submission then kills its worker while it runs alone: that death
    is charged to it alone, never to the healthy attempts of a neighbour, on its partition or any other one the
    process owns. Used from the worker loop's thread only.
    """

    def __init__(self) -> None:
        self._members: list[Conductor] = []
        self._suspects: dict[int, list[str]] = {}  # id(conductor) -> its suspects at its latest turn (none: absent)

    def join(self, member: Conductor) -> None:
        """Add a conductor of the process.

        Args:
            member: The conductor.
        """
        if member not in self._members:
            self._members.append(member)

    def leave(self, member: Conductor) -> None:
        """Remove a conductor (its partition was dropped).

        Args:
            member: The conductor.
        """
        self._members = [m for m in self._members if m is not member]
        self._suspects.pop(id(member), None)

    def admit(self, member: Conductor, suspects: list[str]) -> str | None:
        """Record ``member``'s suspects and say which attempts it may start now.

        Args:
            member: The conductor about to schedule.
            suspects: Its suspects, in its stable order.

        Returns:
            `_ANY` (no suspect anywhere in the process: start freely), ``None`` (start nothing), or the one
            submission whose attempt ``member`` may start (alone).
        """
        if suspects:
            self._suspects[id(member)] = suspects
        else:
            self._suspects.pop(id(member), None)  # only members with suspects are kept
        if not self._suspects:
            return _ANY  # the common case, once per conductor and loop turn: no scan of the members
        waiting = sorted(
            (m.owner.partition, self._suspects[id(m)][0]) for m in self._members if self._suspects.get(id(m))
        )
        if not waiting:
            return _ANY
        if any(m.starting_or_running for m in self._members):
            return None  # a suspect runs alone: wait until nothing else runs in the process
        partition, first = waiting[0]
        return first if partition == member.owner.partition else None


#: Longest time between two turns that visit every open conversation, in seconds (`Conductor._turn_conversations`).
FULL_SCAN_INTERVAL_S = 0.25


def _without_retry_waits(events: Iterable[LogEvent]) -> tuple[LogEvent, ...]:
    """``events`` less the `WaitRequested` / `WaitResolved` of submission retries (`protocol.is_retry_wait`)."""
    return tuple(
        e for e in events if not (isinstance(e, (WaitRequested, WaitResolved)) and protocol.is_retry_wait(e.wait_id))
    )


def _journal_submission(event: LogEvent) -> str | None:
    if not isinstance(event, JOURNAL_EVENT_TYPES):
        return None
    sid = getattr(event, "submission_id", None)  # every journal type has one
    return sid if isinstance(sid, str) else None


@dataclass
class Conductor:
    """Attempts of one owned partition.

    Attributes:
        owner: The partition's owner (its committed state and pending overlay).
        agent: The run body; a `RunLauncher` is launched from the worker loop's thread, any other runs on ``pool``.
        pool: The worker's thread pool (reconciliations; and runs of an agent that is no `RunLauncher`, its size then
            the worker's concurrency permit count).
        clock: Returns "now".
        max_attempts: Attempts per submission before it settles failed (docs/design.md §5; default 3).
        attempt_backoff_base_ms: The backoff before a submission's first retry, in milliseconds, doubled for each
            later one (issue 22 item 4; `settled.protocol.RetryPolicy`).
        attempt_backoff_max_ms: The longest backoff between two attempts of a submission, jitter included, in
            milliseconds.
        tools: The tools' declared safety and reconcilers (None: every tool counts as neither idempotent nor
            reconcilable, so any prepared call without a settlement is Unknown).
        keep_history: Keep every settled submission's input and effects per conversation and hand them to runs
            (`AgentRun.history`), for agents that show the conversation to a model. Off by default: then settled
            submissions keep nothing beyond what admission needs (docs/design.md §3 "Memory").
    """

    owner: PartitionOwner[PartitionState]
    agent: Agent | RunLauncher
    pool: ThreadPoolExecutor
    clock: Callable[[], datetime]
    max_attempts: int = 3
    tools: ToolPolicy | None = None
    keep_history: bool = False
    attempt_backoff_base_ms: int = 100
    attempt_backoff_max_ms: int = 60_000
    _retry: RetryPolicy = field(init=False)
    _jitter: random.Random = field(default_factory=random.Random, init=False)  # the backoffs' jitter draws
    _staged: dict[str, tuple[str, str]] = field(default_factory=dict, init=False)  # submission -> (conv, attempt)
    _running: dict[str, _Running] = field(default_factory=dict, init=False)  # attempt id -> run
    _last_error: dict[str, tuple[str, str]] = field(default_factory=dict, init=False)
    _journals: dict[str, list[LogEvent]] = field(default_factory=dict, init=False)
    _effects: queue.SimpleQueue[_Effect] = field(default_factory=queue.SimpleQueue, init=False)
    _awaiting: list[tuple[str, int, _Effect]] = field(default_factory=list, init=False)  # (conv, last seq, effect)
    _reconciling: dict[str, tuple[str, Future[dict[str, Reconciliation]]]] = field(default_factory=dict, init=False)
    _evidence: dict[str, tuple[str, dict[str, Reconciliation]]] = field(default_factory=dict, init=False)
    _resumed: dict[str, str] = field(default_factory=dict, init=False)  # submission -> attempt recovery resumed
    _inputs: dict[str, tuple[str, str]] = field(default_factory=dict, init=False)  # submission -> (conv, input)
    _history: dict[str, list[HistoryTurn]] = field(default_factory=dict, init=False)  # conversation -> turns
    _closed: bool = field(default=False, init=False)
    _draining: bool = field(default=False, init=False)  # a graceful revoke is pending (docs/design.md §3)
    _held: list[_Effect] = field(default_factory=list, init=False)  # tool calls not started while draining
    _unsent: tuple[HeldSettlement, ...] = field(default=(), init=False)  # tool results not committed at `close`
    _adopted: list[HeldSettlement] = field(default_factory=list, init=False)  # from the previous owner (`adopt`)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)  # _closed vs. enqueued effects
    _refused: dict[str, str] = field(default_factory=dict, init=False)  # attempt -> why an effect of it was refused
    _wake: Callable[[], None] = field(default=_nothing, init=False)  # wakes the worker loop (`join_process`)
    _gate: ResumeGate = field(init=False)  # the process's (`join_process`), else one of its own
    _delivery_committed: bool = field(default=False, init=False)  # a WaitResolved committed in this turn's checkpoint
    # What a turn visits (`_turn_conversations`): conversations a committed batch touched since the last turn, those
    # a visit left to try again (a run unwinding, evidence pending, the resume gate), those with a resumed suspect,
    # those whose wait deadline came; and every open conversation at most `FULL_SCAN_INTERVAL_S` apart.
    _dirty: set[str] = field(default_factory=set, init=False)
    _revisit: set[str] = field(default_factory=set, init=False)
    _resumed_conv: dict[str, str] = field(default_factory=dict, init=False)  # submission -> its conversation
    _deadlines: list[tuple[datetime, str]] = field(default_factory=list, init=False)  # heap of (deadline, conv)
    _next_full_scan_s: float = field(default=0.0, init=False)  # time.monotonic() of the next full visit
    _settle_later: list[tuple[str, protocol.Decision]] = field(default_factory=list, init=False)  # a fault's

    def __post_init__(self) -> None:
        self._retry = RetryPolicy(self.max_attempts, self.attempt_backoff_base_ms, self.attempt_backoff_max_ms)
        self.owner.committed_listeners.append(self._on_committed)
        self._gate = ResumeGate()
        self._gate.join(self)

    def join_process(self, wake: Callable[[], None], gate: ResumeGate) -> None:
        """Take part in a worker process: wake its loop when there is work, and share its `ResumeGate`.

        Args:
            wake: Wakes the worker loop (a run handed over a record, or ended); thread-safe.
            gate: The process's gate for attempts resumed after a death (docs/design.md §5).
        """
        self._wake = wake
        self._gate.leave(self)
        self._gate = gate
        gate.join(self)

    @property
    def starting_or_running(self) -> bool:
        """Whether an attempt of this partition runs, or its ``AttemptStarted`` waits to commit."""
        return bool(self._running) or bool(self._staged)

    # -- the journal (committed batches only) ----------------------------------------------------------------

    def _on_committed(self, batch: LogBatch) -> None:
        self._dirty.add(batch.conversation_id)
        for event in batch.events:
            if self.keep_history and isinstance(event, SubmissionAdmitted):
                self._inputs[event.submission_id] = (event.conversation_id, event.input_json)
            if isinstance(event, Settlement):
                if self.keep_history:
                    self._remember(event)
                self._journals.pop(event.submission_id, None)
                self._last_error.pop(event.submission_id, None)
                self._resumed.pop(event.submission_id, None)
                self._resumed_conv.pop(event.submission_id, None)
                continue
            if isinstance(event, WaitResolved):
                self._delivery_committed = True
            if isinstance(event, WaitRequested) and event.deadline is not None:
                heapq.heappush(self._deadlines, (event.deadline, batch.conversation_id))
            if isinstance(event, RecoveryDecision) and event.decision in _RESUMING:
                self._resumed[event.submission_id] = event.attempt_id or ""
                self._resumed_conv[event.submission_id] = batch.conversation_id
            sid = _journal_submission(event)
            if sid is not None:
                self._journals.setdefault(sid, []).append(event)

    def _remember(self, settlement: Settlement) -> None:
        found = self._inputs.pop(settlement.submission_id, None)
        if found is None:
            return
        conversation_id, input_json = found
        turn = HistoryTurn(
            submission_id=settlement.submission_id,
            input_json=input_json,
            outcome=settlement.outcome,
            events=_without_retry_waits(self._journals.get(settlement.submission_id, ())),
        )
        self._history.setdefault(conversation_id, []).append(turn)

    def history(self, conversation_id: str) -> tuple[HistoryTurn, ...]:
        """Return the conversation's settled submissions, oldest first (empty unless ``keep_history``).

        Args:
            conversation_id: The conversation.

        Returns:
            Its history.
        """
        return tuple(self._history.get(conversation_id, ()))

    def _history_before(
        self, conversation_id: str, conv: protocol.ConversationState, submission_seq: int
    ) -> tuple[HistoryTurn, ...]:
        """The conversation's settled turns before ``submission_seq``: a run's history never shows a later turn.

        A turn queued after a run may settle while the run is unsettled (an abort settles a queued turn at once),
        and a later attempt of the run starts after it: it is still no part of the run's history.
        """
        subs = conv.submissions  # every admitted submission, settled ones included
        return tuple(
            t for t in self._history.get(conversation_id, ()) if subs[t.submission_id].submission_seq < submission_seq
        )

    def journal(self, submission_id: str) -> tuple[LogEvent, ...]:
        """Return a nonterminal submission's recorded effects, committed, in log order.

        Args:
            submission_id: The submission.

        Returns:
            Its journal (empty for a settled or unknown submission), without the timed waits of its retries' backoffs
            (the owner's, never the run's: a run replays only the waits it asked for).
        """
        return _without_retry_waits(self._journals.get(submission_id, ()))

    @property
    def busy(self) -> bool:
        """Whether runs are in flight (the worker then polls briefly, so a finished run is picked up at once)."""
        return bool(self._running)

    # -- phase 1 -------------------------------------------------------------------------------------------------

    def before_checkpoint(self) -> None:
        """Stage recorded effects, settlements of finished runs, recovery decisions, and the scheduler's next steps."""
        with batched_wakeups():  # refusals wake each run loop once
            self._before_checkpoint()

    def _before_checkpoint(self) -> None:
        now = self.clock()
        self._delivery_committed = False  # set again only by what this turn's checkpoint commits (not a restore)
        # A run hands over its records before it ends, so a run seen done here has every record of it queued: they
        # are staged before its end is (a finished run never leaves a record behind, e.g. a posted settlement).
        if self._adopted:
            # Tool results held across a drop of this partition by this process: committed before recovery reads
            # the submissions, so a call whose result came back is not classified in doubt. Recovery waits a turn.
            self._stage_adopted()
            return
        for conversation_id, later in self._settle_later:  # only under the fault joined_settled_separately
            try:
                self.owner.stage(to_loop_decision(conversation_id, later))
            except protocol.ProtocolError as exc:  # the fold refuses them: they stay joined, never settled
                _log.error(
                    "fault joined_settled_separately: the joined settlements were refused", extra={"error": str(exc)}
                )
        self._settle_later.clear()
        finished = [a for a, running in self._running.items() if running.future.done()]
        ended = [self._running[a].run.conversation_id for a in finished]
        self._stage_effects()
        for attempt_id in finished:
            self._finish(self._running.pop(attempt_id), now)
        self._dirty.update(ended)
        if self._draining:
            return  # a graceful revoke is pending: no recovery, no new attempt (the successor does them)
        conversations = self._turn_conversations(now)
        for conversation_id in conversations:
            self._recover(conversation_id, now)
            self._deliver(conversation_id, now)
        # After an unexplained death, the interrupted attempts resume one at a time and alone in the process
        # (docs/design.md §5): a poison submission then kills its worker while it runs alone, never its neighbours'.
        only = self._gate.admit(self, self._suspects(conversations))
        for conversation_id in conversations:
            self._schedule(conversation_id, now, only)

    def _turn_conversations(self, now: datetime) -> list[str]:
        """The conversations this turn visits for recovery, deliveries and scheduling, in a stable order.

        Only conversations with a nonterminal submission can have something to recover or start, and of those only
        the ones something happened to since the last turn: a committed batch (the turn's own decisions included), a
        batch pending now, a run that ended, a visit that asked to be retried, a resumed suspect (the gate needs all
        of them), a wait deadline that came. So a turn's cost grows with what changed, not with the runs that wait
        (10,000 suspended runs made every turn visit each of them). Every open conversation is still visited at
        most `FULL_SCAN_INTERVAL_S` apart, a safety net under the bookkeeping.
        """
        overlay = self.owner.overlay.conversations
        due: set[str] = set()
        while self._deadlines and self._deadlines[0][0] <= now:  # drained on every turn, full ones included
            due.add(heapq.heappop(self._deadlines)[1])
        mono = time.monotonic()
        if mono >= self._next_full_scan_s:
            self._next_full_scan_s = mono + FULL_SCAN_INTERVAL_S
            candidates: set[str] | Iterable[str] = overlay.keys()
        else:
            candidates = self._dirty | self._revisit | due | set(self._resumed_conv.values())
            candidates.update(self.owner.pending_conversations())
        self._dirty = set()
        self._revisit = set()
        out = []
        for cid in candidates:
            conv = overlay.get(cid)
            if conv is not None and (conv.queue or conv.active_submission_id):
                out.append(cid)
        return sorted(out)

    def adopt(self, held: Sequence[HeldSettlement]) -> None:
        """Take tool results this process's previous owner of the partition could not commit before it was dropped.

        Call it right after the claim, and only when that claim directly follows the dropped owner's (its epoch plus
        one): no other owner can have classified the calls meanwhile. The first `before_checkpoint` stages each
        result whose call is still prepared and unsettled in the log; recovery then finds the calls settled.

        Args:
            held: What the dropped owner's conductor held (`unsent_settlements`).
        """
        self._adopted.extend(held)

    def unsent_settlements(self) -> tuple[HeldSettlement, ...]:
        """The tool results handed over by runs and not known committed when `close` ran (empty before it)."""
        return self._unsent

    def _stage_adopted(self) -> None:
        adopted, self._adopted = self._adopted, []
        for held in adopted:
            sub = self.owner.committed.conversation(held.conversation_id).submission(held.submission_id)
            events = tuple(e for e in held.events if sub is not None and e.call_id in sub.open_calls)
            if not events:
                _log.info(
                    "held tool results dropped: their calls are no longer open in the log",
                    extra={"submission_id": held.submission_id, "calls": [e.call_id for e in held.events]},
                )
                continue
            prepared = self._prepared(held.submission_id)
            call_tools = tuple((e.call_id, prepared[e.call_id].tool) for e in events if e.call_id in prepared)
            try:
                self.owner.stage(
                    Decision(held.conversation_id, events, submission_id=held.submission_id, call_tools=call_tools)
                )
            except (protocol.ProtocolError, ChainBreakError) as exc:
                _log.error(
                    "held tool results the fold refuses were not recorded; recovery classifies their calls",
                    extra={"submission_id": held.submission_id, "error": str(exc)},
                )
                continue
            _log.info(
                "tool results held across a drop of the partition staged",
                extra={"submission_id": held.submission_id, "calls": [e.call_id for e in events]},
            )

    def _conv(self, conversation_id: str) -> protocol.ConversationState:
        return self.owner.overlay.conversation(conversation_id)

    def _record(self, conversation_id: str, submission_id: str, attempt_id: str) -> Callable[..., Future[None]]:
        def record(events: Sequence[LogEvent]) -> Future[None]:
            fut: Future[None] = Future()
            with self._lock:
                if self._closed:
                    fut.set_exception(AttemptSupersededError("this worker no longer owns the partition"))
                elif not events:
                    fut.set_result(None)
                else:
                    self._effects.put(_Effect(conversation_id, submission_id, attempt_id, tuple(events), fut))
            self._wake()  # the worker loop stages it at once instead of at its next poll
            return fut

        return record

    def _joinable(self, conversation_id: str, submission_id: str) -> Callable[[], bool]:
        def joinable() -> bool:
            conv = self.owner.committed.conversation(conversation_id)  # one reference read: the committed state
            joins = conv.lane is LanePolicy.JOIN
            return joins and bool(protocol.joinable_prefix(conv.queue, conv.submissions, submission_id))

        return joinable

    def _join(self, conversation_id: str, submission_id: str, attempt_id: str) -> Callable[[int], Future[JoinedInputs]]:
        def join(response_ordinal: int) -> Future[JoinedInputs]:
            out: Future[JoinedInputs] = Future()
            inner: Future[None] = Future()
            effect = _Effect(conversation_id, submission_id, attempt_id, (), inner, join_ordinal=response_ordinal)

            def done(fut: Future[None]) -> None:
                exc = AttemptSupersededError("the join was cancelled") if fut.cancelled() else fut.exception()
                if exc is not None:
                    out.set_exception(exc)
                else:
                    out.set_result(effect.joined)

            inner.add_done_callback(done)
            with self._lock:
                if self._closed:
                    inner.set_exception(AttemptSupersededError("this worker no longer owns the partition"))
                    return out
                self._effects.put(effect)
            self._wake()
            return out

        return join

    def _stage_join(self, effect: _Effect, conv: protocol.ConversationState) -> None:
        """Decide and stage a run's join request (issue 22 item 2); resolve it at once when nothing is joined."""
        assert effect.join_ordinal is not None
        decision = protocol.join(conv, effect.submission_id, effect.attempt_id, effect.join_ordinal)
        if decision is None:
            _resolve(effect.future)
            return
        joined = decision.events[0]
        assert isinstance(joined, SubmissionsJoined)
        effect.events = decision.events
        effect.joined = tuple((sid, conv.submissions[sid].input_json or "null") for sid in joined.joined_ids)
        self.owner.stage(to_loop_decision(effect.conversation_id, decision))
        _log.info("submissions joined", extra={"submission_id": effect.submission_id, "joined": joined.joined_ids})
        failpoint("conductor.after_join_staged")  # decided, not committed: the joined inputs reached no model
        self._awaiting.append((effect.conversation_id, conv.last_event_seq + len(effect.events), effect))

    def _stage_effects(self) -> None:
        while True:
            try:
                effect = self._effects.get_nowait()
            except queue.Empty:
                return
            if self._draining and any(isinstance(e, ToolCallPrepared) for e in effect.events):
                self._held.append(effect)  # start no new tool once a revoke is pending (docs/design.md §3)
                continue
            refused = self._refused.get(effect.attempt_id)
            if refused is not None:
                # An earlier record of this attempt was refused (e.g. a settlement it did not wait for): nothing
                # after it may become canonical, or the chain would hold a later step without the earlier one.
                self._refuse(
                    effect,
                    AttemptSupersededError(f"an earlier record of attempt {effect.attempt_id} was refused: {refused}"),
                )
                continue
            conv = self._conv(effect.conversation_id)
            sub = conv.submission(effect.submission_id)
            running = sub is not None and sub.state is SubmissionState.RUNNING and sub.attempt_id == effect.attempt_id
            if not running or effect.attempt_id not in self._running:
                state = "unknown" if sub is None else sub.state.value
                self._refuse(
                    effect,
                    AttemptSupersededError(
                        f"attempt {effect.attempt_id} of submission {effect.submission_id} is not running "
                        f"(the submission is {state}, its attempt {getattr(sub, 'attempt_id', None)}): "
                        f"{[type(e).__name__ for e in effect.events]} not recorded"
                    ),
                )
                continue
            if effect.join_ordinal is not None:
                try:
                    self._stage_join(effect, conv)
                except (protocol.ProtocolError, ChainBreakError) as exc:
                    _log.error("a join the fold refuses was not recorded", extra={"error": str(exc)})
                    self._refuse(effect, exc)
                continue
            try:
                # All or nothing: a batch the fold refuses (e.g. a settlement of a call never prepared) is not staged.
                self.owner.stage(
                    Decision(
                        effect.conversation_id,
                        effect.events,
                        submission_id=effect.submission_id,
                        call_tools=self._call_tools(effect),
                    )
                )
            except (protocol.ProtocolError, ChainBreakError) as exc:
                _log.error("an effect the fold refuses was not recorded", extra={"error": str(exc)})
                self._refuse(effect, exc)
                continue
            self._awaiting.append((effect.conversation_id, conv.last_event_seq + len(effect.events), effect))

    def _call_tools(self, effect: _Effect) -> tuple[tuple[str, str], ...]:
        """``(call id, tool)`` of the calls the effect settles (their prepared records are committed by now)."""
        settled = {e.call_id for e in effect.events if isinstance(e, ToolCallSettled)}
        if not settled:
            return ()
        prepared = self._prepared(effect.submission_id)
        return tuple((call_id, prepared[call_id].tool) for call_id in sorted(settled) if call_id in prepared)

    def _refuse(self, effect: _Effect, exc: BaseException) -> None:
        self._refused[effect.attempt_id] = str(exc)
        _resolve(effect.future, exc)

    def _finish(self, running: _Running, now: datetime) -> None:
        run = running.run
        self._refused.pop(run.attempt_id, None)  # every record of the run was staged or refused before this
        conv = self._conv(run.conversation_id)
        sub = conv.submission(run.submission_id)
        if sub is None or sub.attempt_id != run.attempt_id or sub.state is not SubmissionState.RUNNING:
            _log.info(
                "run ended after its attempt stopped running; its result is dropped",
                extra={"attempt_id": run.attempt_id, "state": None if sub is None else sub.state.value},
            )
            return
        exc = running.future.exception()
        if exc is not None:
            error_type = exc.error_type if isinstance(exc, RunFailedError) else type(exc).__name__
            self._last_error[run.submission_id] = (error_type, str(exc))
        if sub.open_calls:
            # A call is prepared without a settlement (e.g. an abort past the grace, a transport error budget
            # spent): the classifier decides, after this interruption moves the run to Recovery (docs/design.md §5).
            why = "returned" if exc is None else f"raised {type(exc).__name__}"
            decision = protocol.interrupt(
                conv, run.submission_id, f"attempt {run.attempt} {why} with calls in doubt: {sorted(sub.open_calls)}"
            )
        elif exc is None:
            decision = protocol.terminalize(
                conv, run.submission_id, SettlementOutcome.COMPLETED, now, reply_json=running.future.result()
            )
        elif protocol.aborted_in_group(conv, sub) is not None:  # its abort, or a joined one's (issue 22 item 2)
            decision = protocol.terminalize(conv, run.submission_id, SettlementOutcome.ABORTED, now)
        else:
            error_type, reason = self._last_error[run.submission_id]
            # Attempts a graceful revoke ended are no death and not charged (docs/design.md §5).
            # Not retried: an error the run calls final (`RunFailedError`), or one whose own retry layer gave up (a
            # model call past its budget, a tool error the tool called final: ``non_retryable``), so the
            # per-operation budgets and the submission's never stack (issue 22 item 4).
            if getattr(exc, "non_retryable", False) is True:
                decision = protocol.terminalize(
                    conv, run.submission_id, SettlementOutcome.FAILED, now, error_type=error_type, error_reason=reason
                )
            elif sub.charged_attempts >= self.max_attempts:  # the budget is spent: a dead letter (issue 22 item 4)
                decision = protocol.terminalize(
                    conv,
                    run.submission_id,
                    SettlementOutcome.FAILED,
                    now,
                    error_type=protocol.RETRY_BUDGET_EXHAUSTED,
                    error_reason=protocol.bounded_text(
                        protocol.dead_letter_reason(sub.charged_attempts, self.max_attempts, f"{error_type}: {reason}")
                    ),
                )
            else:
                decision = protocol.interrupt(conv, run.submission_id, f"attempt {run.attempt} raised {error_type}")
                failpoint("conductor.before_settle")
                self.owner.stage(to_loop_decision(run.conversation_id, decision))
                self._schedule_retry(run.conversation_id, run.submission_id, now)
                return
        failpoint("conductor.before_settle")  # a finished run's settlement (or interruption) is about to be staged
        if decision.joined_settlements and fault_enabled("joined_settled_separately"):
            # Fault switch (DUR-016; tests/fault_switches.toml): the host settles alone and the submissions it joined
            # settle in the next checkpoint, a separate transaction, instead of in the host's batch.
            n = len(decision.joined_settlements)
            host = dataclasses.replace(decision, events=decision.events[:-n], joined_settlements=())
            later = protocol.Decision(events=decision.events[-n:], joined_settlements=decision.joined_settlements)
            self.owner.stage(to_loop_decision(run.conversation_id, host))
            self._settle_later.append((run.conversation_id, later))
            return
        self.owner.stage(to_loop_decision(run.conversation_id, decision))

    def _schedule_retry(self, conversation_id: str, submission_id: str, now: datetime) -> None:
        """Stage the backoff before a Ready submission's next attempt: `SubmissionRetryScheduled` and its timed wait.

        Called right after the decision that ended a charged attempt (an interruption after an uncaught error, a
        resuming recovery decision after a death) is staged, so both commit in one transaction (issue 22 item 4).
        """
        sub = self._conv(conversation_id).submission(submission_id)
        if sub is None:
            return
        error = self._last_error.pop(submission_id, None)
        if error is None:
            cause = f"WorkerDied: attempt {sub.attempt_count} ended without a settlement (its worker stopped)"
        else:
            cause = f"{error[0]}: {error[1]}"
        decision = protocol.schedule_retry(
            self._conv(conversation_id),
            submission_id,
            now,
            self._retry,
            protocol.bounded_text(cause),
            self._jitter.random(),
        )
        _log.info(
            "retry scheduled",
            extra={"submission_id": submission_id, "events": [type(e).__name__ for e in decision.events]},
        )
        self.owner.stage(to_loop_decision(conversation_id, decision))

    # -- recovery (docs/semantics.md §14; DUR-013) ---------------------------------------------------------------------

    def _live_run(self, submission_id: str) -> bool:
        return any(r.run.submission_id == submission_id for r in self._running.values())

    def _snapshot(self, sub: protocol.Submission, evidence: dict[str, Reconciliation]) -> RecoverySnapshot:
        prepared = self._prepared(sub.submission_id)
        calls = []
        for call_id in sorted(sub.open_calls):
            found = prepared.get(call_id)
            if found is None:
                continue  # the snapshot marks an undescribed open call unsafe
            safety = self.tools.safety(found.tool) if self.tools is not None else None
            calls.append(OpenCall(call_id, found.tool, safety or ToolSafety(), evidence.get(call_id)))
        journal = self._journals.get(sub.submission_id, [])
        deltas = {
            e.response_ordinal for e in journal if isinstance(e, ModelResponseDelta) and e.attempt_id == sub.attempt_id
        }
        completed = {
            e.response_ordinal
            for e in journal
            if isinstance(e, ModelResponseCompleted) and e.attempt_id == sub.attempt_id
        }
        snap = RecoverySnapshot.of(
            sub.submission_id, sub, calls, self.max_attempts, partial_response=bool(deltas - completed)
        )
        if fault_enabled("classifier_prepared_as_settled"):
            # Fault switch (DUR-009, DUR-013; tests/fault_switches.toml): the classifier is told that every
            # prepared call has its result, so a call in doubt is resumed instead of marked Unknown.
            snap = dataclasses.replace(snap, open_calls=())
        return snap

    def _prepared(self, submission_id: str) -> dict[str, ToolCallPrepared]:
        return {e.call_id: e for e in self._journals.get(submission_id, ()) if isinstance(e, ToolCallPrepared)}

    def _recover(self, conversation_id: str, now: datetime) -> None:
        conv = self._conv(conversation_id)
        active = conv.active()
        if active is None or active.state not in (SubmissionState.RECOVERY, SubmissionState.TERMINALIZING):
            return
        sid = active.submission_id
        if self._live_run(sid):
            self._revisit.add(conversation_id)
            return  # its run is still unwinding (e.g. after marking a call Unknown): classify once it ended
        if active.state is SubmissionState.RECOVERY and not self._evidence_ready(active):
            self._revisit.add(conversation_id)
            return
        attempt, evidence = self._evidence.get(sid, (active.attempt_id or "", {}))
        recovery = protocol.classify(self._snapshot(active, evidence if attempt == active.attempt_id else {}))
        if recovery.action is RecoveryAction.RECONCILE_FIRST:
            self._start_reconcile(active, recovery.reconcile)
            self._revisit.add(conversation_id)  # until the reconcilers answered
            return
        if recovery.action is RecoveryAction.DECIDE:
            _log.info(
                "recovery decision",
                extra={"submission_id": sid, "decision": recovery.kind, "reason": recovery.reason},
            )
            self.owner.stage(Decision(conversation_id, recovery.events, submission_id=sid))
            self._evidence.pop(sid, None)
            if recovery.kind in _RESUMING:
                self._resumed[sid] = active.attempt_id or ""
                self._resumed_conv[sid] = conversation_id
                # A charged end (a death, an error with calls then in doubt) waits out its backoff; an attempt a
                # graceful revoke ended is no death and resumes at once (issue 22 item 4).
                if active.charged_attempts > active.retries:
                    self._schedule_retry(conversation_id, sid, now)
            if recovery.kind is not RecoveryDecisionKind.TERMINALIZE:
                return
        elif recovery.action is not RecoveryAction.SETTLE_RESERVED:
            return
        conv = self._conv(conversation_id)
        outcome = recovery.settle or SettlementOutcome.FAILED
        error_type, reason = self._last_error.get(sid, ("WorkerDied", recovery.reason))
        if outcome is SettlementOutcome.FAILED and reason != recovery.reason:
            reason = f"{reason} ({recovery.reason})"
        if recovery.kind is RecoveryDecisionKind.TERMINALIZE and outcome is SettlementOutcome.FAILED:
            # The budget is spent (the classifier's rule 4): a dead letter naming the attempts and the last cause.
            last = f"{error_type}: {reason}"
            if sid not in self._last_error:
                last = f"WorkerDied: attempt {active.attempt_count} ended without a settlement (its worker stopped)"
            error_type = protocol.RETRY_BUDGET_EXHAUSTED
            reason = protocol.bounded_text(
                protocol.dead_letter_reason(active.charged_attempts, self.max_attempts, last)
            )
        settle = protocol.terminalize(conv, sid, outcome, now, error_type=error_type, error_reason=reason)
        self.owner.stage(to_loop_decision(conversation_id, settle))

    # -- waits (issue 16) ------------------------------------------------------------------------------------------

    def _deliver(self, conversation_id: str, now: datetime) -> None:
        """Decide a suspended run's waits (every kind): deliver signals, expire waits past their deadline (the sweeper).

        Reads only what is committed (the journal) and skips a conversation with a batch still pending, so a
        delivery is decided from canonical records only and a signal is never paired twice. Each decision is one
        canonical `WaitResolved`; the fold takes the run back to Ready with the last one, and the scheduler then
        starts its next attempt (not charged to ``max_attempts``). An approval's or an Unknown's delivery is a signed
        inbox command the ledger decides (`protocol.decide_approval`, `protocol.resolve`), not this; an Unknown has no
        deadline, so the sweeper never expires one.
        """
        conv = self._conv(conversation_id)
        active = conv.active()
        if active is None or active.state not in WAITING_STATES or self.owner.is_pending(conversation_id):
            return
        sid = active.submission_id
        journal = self._journals.get(sid, ())
        for request, signal in protocol.deliveries(conv, sid, journal):
            d = protocol.resolve_wait(
                self._conv(conversation_id),
                sid,
                request.wait_id,
                WaitOutcome.DELIVERED,
                now,
                source_id=signal.command_id,
                payload_json=signal.payload_json,
            )
            self.owner.stage(to_loop_decision(conversation_id, d))
        requests = [e for e in journal if isinstance(e, WaitRequested)]
        for request in protocol.expired_waits(protocol.open_waits(self._conv(conversation_id), sid, requests), now):
            _log.info("wait expired", extra={"submission_id": sid, "wait_id": request.wait_id})
            d = protocol.resolve_wait(self._conv(conversation_id), sid, request.wait_id, WaitOutcome.EXPIRED, now)
            self.owner.stage(to_loop_decision(conversation_id, d))
            failpoint("conductor.after_expiry_staged")  # the sweeper decided; its WaitResolved is not committed

    def _evidence_ready(self, sub: protocol.Submission) -> bool:
        """Collect finished reconciliations; False while some still run."""
        pending = self._reconciling.get(sub.submission_id)
        if pending is None:
            return True
        attempt_id, fut = pending
        if not fut.done():
            return False
        del self._reconciling[sub.submission_id]
        answers = fut.result()  # _reconcile_all never raises: a failing reconciler's answer is "unknown"
        self._evidence[sub.submission_id] = (attempt_id, answers)
        return True

    def _start_reconcile(self, sub: protocol.Submission, call_ids: Sequence[str]) -> None:
        prepared = self._prepared(sub.submission_id)
        calls = [prepared[c] for c in call_ids if c in prepared]
        self._reconciling[sub.submission_id] = (
            sub.attempt_id or "",
            self.pool.submit(self._reconcile_all, calls),
        )

    def _reconcile_all(self, calls: Sequence[ToolCallPrepared]) -> dict[str, Reconciliation]:
        answers: dict[str, Reconciliation] = {}
        for call in calls:
            if self.tools is None:
                answers[call.call_id] = Reconciliation(ReconcileAnswer.UNKNOWN, reason="no tool registry")
                continue
            try:
                answers[call.call_id] = self.tools.reconcile(call)
            except Exception as exc:  # noqa: BLE001 - recorded: the call is classified in doubt with this reason
                _log.warning(
                    "reconciler failed; the call is in doubt",
                    extra={"call_id": call.call_id, "tool": call.tool, "error": repr(exc)},
                )
                answers[call.call_id] = Reconciliation(
                    ReconcileAnswer.UNKNOWN, reason=f"the reconciler raised {type(exc).__name__}: {exc}"
                )
        return answers

    # -- scheduling --------------------------------------------------------------------------------------------

    def _suspects(self, conversations: Sequence[str]) -> list[str]:
        """Ready submissions whose last attempt recovery resumed and that have not run since, in a stable order."""
        found: list[tuple[str, int, str]] = []
        for conversation_id in conversations:
            active = self._conv(conversation_id).active()
            if (
                active is not None
                and active.state is SubmissionState.READY
                and active.attempt_id is not None
                and self._resumed.get(active.submission_id) == active.attempt_id
            ):
                found.append((conversation_id, active.submission_seq, active.submission_id))
        return [sid for _, _, sid in sorted(found)]

    def _schedule(self, conversation_id: str, now: datetime, only: str | None = _ANY) -> None:
        """Stage the conversation's next step; with ``only`` other than `_ANY`, start no attempt but that one's."""
        while True:
            conv = self._conv(conversation_id)
            nxt = protocol.schedule(conv)
            if isinstance(nxt, SettleAborted):
                d = protocol.terminalize(conv, nxt.submission_id, SettlementOutcome.ABORTED, now)
                self.owner.stage(to_loop_decision(conversation_id, d))
                continue  # an aborted queued submission never blocks the rest (docs/semantics.md §13)
            if isinstance(nxt, StartAttempt) and nxt.submission_id not in self._staged:
                if only is not _ANY and nxt.submission_id != only:
                    self._revisit.add(conversation_id)
                    return  # resuming interrupted attempts one at a time: this one waits
                attempt_id = uuid.uuid4().hex
                d = protocol.start_attempt(conv, nxt.submission_id, attempt_id, self.owner.epoch)
                if fault_enabled("attempt_count_after_start"):
                    # Fault switch (DUR-014; tests/fault_switches.toml): the attempt runs before its AttemptStarted
                    # (the attempt count) is appended, so a run that kills its worker at once is never charged.
                    self._start_before_count(conversation_id, nxt.submission_id, attempt_id, d)
                    return
                self.owner.stage(to_loop_decision(conversation_id, d))
                self._staged[nxt.submission_id] = (conversation_id, attempt_id)
            return

    def _start_before_count(
        self, conversation_id: str, submission_id: str, attempt_id: str, started: protocol.Decision
    ) -> None:
        """Fault ``attempt_count_after_start``: the attempt runs up to 0.5 s before its ``AttemptStarted`` commits."""
        sub = self._conv(conversation_id).submission(submission_id)
        if sub is None:
            return
        attempt = sub.attempt_count + 1
        self.owner.stage(to_loop_decision(conversation_id, started))
        running = self._launch(conversation_id, submission_id, attempt_id, self._conv(conversation_id))
        concurrent.futures.wait([running.future], timeout=0.5)
        _log.warning("fault attempt_count_after_start: attempt started before its count", extra={"attempt": attempt})

    # -- phase 2 -------------------------------------------------------------------------------------------------

    def after_checkpoint(self) -> None:
        """Resolve committed effects; start runs whose ``AttemptStarted`` committed; cancel aborted or stale runs."""
        with batched_wakeups():  # the effects this checkpoint committed wake each run loop once
            self._after_checkpoint()

    def _after_checkpoint(self) -> None:
        if self._delivery_committed:
            self._delivery_committed = False
            failpoint("conductor.after_delivery_commit")  # a delivery or expiry is canonical; no attempt started on it
        committed = self.owner.committed
        replaced = self.owner.replaced_batch_ids
        still: list[tuple[str, int, _Effect]] = []
        for conversation_id, last_seq, effect in self._awaiting:
            batch_id = f"{conversation_id}:{last_seq - len(effect.events) + 1}"
            too_large = self.owner.too_large_records.get(batch_id) if replaced else None
            if too_large is not None:
                # Neither the record (a model response, a step result) nor a typed failure fits the log: the run
                # fails with an error naming the record's events, its size and the limit, not retried.
                self._refuse(effect, RunFailedError("record_too_large", f"the run's record is too large: {too_large}"))
            elif replaced and batch_id in replaced:
                # Too large to append: a typed failure (e.g. the call's error result_too_large) committed in its
                # place. The run saw what it handed over, not what the log holds: it ends, and the next attempt
                # replays the log (docs/design.md §5).
                self._refuse(effect, AttemptSupersededError("its record was replaced by a typed failure (too large)"))
            elif committed.conversation(conversation_id).last_event_seq >= last_seq:
                _resolve(effect.future)
            elif self.owner.is_pending(conversation_id):
                still.append((conversation_id, last_seq, effect))  # a deferred checkpoint: still pending
            else:
                self._refuse(effect, AttemptSupersededError("the batch holding the effect was not committed"))
        self._awaiting = still
        for submission_id, (conversation_id, attempt_id) in list(self._staged.items()):
            if self._draining:
                break  # no new run once a revoke is pending; `interrupt_remaining` records its attempt interrupted
            conv = committed.conversation(conversation_id)
            sub = conv.submission(submission_id)
            if sub is None or sub.attempt_id != attempt_id:
                if self.owner.is_pending(conversation_id):
                    continue  # its AttemptStarted is still pending (a deferred checkpoint)
                del self._staged[submission_id]  # never committed: the scheduler decides again
                continue
            del self._staged[submission_id]
            if sub.state is not SubmissionState.RUNNING:
                continue
            self._launch(conversation_id, submission_id, attempt_id, conv)
        for running in self._running.values():
            conv = committed.conversation(running.run.conversation_id)
            sub = conv.submission(running.run.submission_id)
            stale = sub is None or sub.attempt_id != running.run.attempt_id or sub.state is not SubmissionState.RUNNING
            if stale or (sub is not None and protocol.aborted_in_group(conv, sub) is not None):
                running.run.cancelled.set()  # its abort, or one of a submission it joined (issue 22 item 2)

    def _launch(
        self, conversation_id: str, submission_id: str, attempt_id: str, conv: protocol.ConversationState
    ) -> _Running:
        """Start the run of an attempt whose ``AttemptStarted`` is in ``conv`` (committed, but for the fault)."""
        sub = conv.submission(submission_id)
        assert sub is not None  # the caller found it Running in ``conv``
        run = AgentRun(
            conversation_id=conversation_id,
            submission_id=submission_id,
            attempt_id=attempt_id,
            attempt=sub.attempt_count,
            input_json=sub.input_json or "null",
            owner_epoch=self.owner.epoch,
            cancelled=CancelSignal(),
            run_id=submission_id,
            tools_offered=sub.tools_offered,
            journal=self.journal(submission_id),
            record=self._record(conversation_id, submission_id, attempt_id),
            history=self._history_before(conversation_id, conv, sub.submission_seq),
            committed=functools.partial(self.journal, submission_id),
            joined=tuple((sid, conv.submissions[sid].input_json or "null") for sid in sub.joined),
            joinable=self._joinable(conversation_id, submission_id),
            join=self._join(conversation_id, submission_id, attempt_id),
        )
        # A launcher starts the run on the run loop from this thread: no pool thread hop before its body or after its
        # end (docs/architecture.md "K=0 turn latency"). Either way it begins after its start committed (above).
        future = self.agent.launch(run) if isinstance(self.agent, RunLauncher) else self.pool.submit(self.agent, run)
        future.add_done_callback(lambda _: self._wake())  # its end is staged at once, not at the next poll
        running = _Running(run, future)
        self._running[attempt_id] = running
        return running

    # -- graceful revoke (docs/design.md §3, §5) -----------------------------------------------------------------------

    def begin_drain(self) -> None:
        """A graceful revoke is pending: start no new attempt, run or tool call; let running runs finish.

        The worker keeps driving `before_checkpoint` / `after_checkpoint` so finished runs stage and commit their
        settlements, until `drained` or its bound (``Settings.revoke_grace_s``), then calls `interrupt_remaining`.
        A run asking to prepare a tool call meanwhile is held (the tool never starts) until the partition is
        dropped.
        """
        self._draining = True

    @property
    def drained(self) -> bool:
        """Whether no run can still settle: every run still in flight waits on a held tool call."""
        held = {e.attempt_id for e in self._held}
        return all(a in held for a in self._running) and self._effects.empty()

    def interrupt_remaining(self) -> int:
        """Stage ``AttemptInterrupted("graceful_revoke")`` for every attempt still running; cancel their runs.

        Folded, each goes Running → Ready (or → Recovery when a call is in doubt), so the successor sees an
        ownership change the log explains, no death, and charges no attempt for it (docs/design.md §5). The worker
        checkpoints after this call, then closes the conductor.

        Returns:
            How many attempts were interrupted.
        """
        n = 0
        for conversation_id in list(self.owner.overlay.conversations):
            conv = self._conv(conversation_id)
            active = conv.active()
            if active is None or active.state is not SubmissionState.RUNNING:
                continue
            decision = protocol.interrupt(conv, active.submission_id, protocol.GRACEFUL_REVOKE)
            self.owner.stage(to_loop_decision(conversation_id, decision))
            n += 1
        for running in self._running.values():
            running.run.cancelled.set()
        return n

    def close(self) -> None:
        """Stop every run of this partition (its ownership ended); their late results and effects append nothing."""
        with self._lock:
            self._closed = True
        self._gate.leave(self)
        pending = [effect for _, _, effect in self._awaiting]
        while True:
            try:
                pending.append(self._effects.get_nowait())
            except queue.Empty:
                break
        unsent: list[HeldSettlement] = []
        for effect in pending:
            if effect.future.done():
                continue  # resolved: committed, or refused for a reason a new owner would refuse it for too
            results = tuple(e for e in effect.events if isinstance(e, ToolCallSettled))
            if results:
                unsent.append(HeldSettlement(effect.conversation_id, effect.submission_id, results))
        self._unsent = tuple(unsent)
        for running in self._running.values():
            running.run.cancelled.set()
        gone = AttemptSupersededError("this worker no longer owns the partition")
        for _, _, effect in self._awaiting:
            _resolve(effect.future, gone)
        for effect in [*self._held, *pending]:
            _resolve(effect.future, gone)
        self._held.clear()
        self._awaiting.clear()
        self._running.clear()
        self._staged.clear()
