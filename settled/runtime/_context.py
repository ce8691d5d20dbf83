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
* ``await ctx.step(name, fn, *args, version=..., pure=...)``: an at-least-once body under a stable step id; exactly
  one recorded success (``StepRecorded``, awaited; posted for a ``pure`` step); a failure is not recorded and
  re-executes on the next attempt (DUR-010).
* ``await ctx.model(provider, messages)``: the completed response is committed before anything acts on it (DUR-008).

Each record reaches the log through the conductor (`settled.processors.AgentRun.record`), in one of three ways
(docs/design.md §3; docs/architecture.md "Commits per tool call"): *awaited* (prepared, refused, Unknown, step, deltas:
the run goes on once the checkpoint holding it commits, so a tool never runs before its prepared record commits);
*riding along* (``now``/``uuid`` values and a completed model response, committed with the next awaited record: a
response and the first call it declares — a parallel-safe group's calls — share one commit); *posted* (a tool's
settlement, a pure step's record: the run goes on (to its next model call) while it commits; it lingers
`RunOptions.settle_linger_s` for the run's next record; an error recording it surfaces at the next awaited record or
at the run's end, and nothing after it is recorded). A superseded attempt's late work fails with
`AttemptSupersededError` and appends nothing. Runs execute on one event loop per worker process
(`settled/runtime/_runloop.py`); agent code must not block it.

This module is the author-facing façade (ordinals, replay, the public ``ctx.*`` methods). The commit pipeline is
`settled/runtime/_pipeline.py`, tool-call execution (timeouts, in-doubt retries, reconcile, Unknown)
`settled/runtime/_calls.py`, the run loop and `execute` `settled/runtime/_runloop.py`, `RunOptions`
`settled/runtime/_options.py`. A new effect is a façade method building its record and a pipeline hand-off.

Failpoints at the crash-matrix boundaries (docs/semantics.md §15): ``engine.after_prepared_commit`` (prepared, not
invoked), ``engine.tool_returned`` (returned, result not committed), ``engine.after_settled_commit`` (hit in the
conductor's thread right after the transaction holding the settlement commits), ``engine.step_returned``,
``engine.after_step_commit`` (for a pure step: in the conductor's thread, right after the transaction holding its
record commits), ``engine.after_delta_commit`` (mid-provider stream), ``engine.after_response_commit``
(the model item committed — with the prepared record of the first call it declares, which is the merged boundary
"after model item commit" / "after tool prepared, before invocation") and ``engine.run_returned`` (the reply is
decided, the settlement not staged). "During invocation" is inside the tool: a test tool hits its own failpoint
there. "After claim, before canonical input" and "before Attempt start" share one transaction with the claim's
scheduling (``AttemptStarted`` and ``InputApplied`` are one batch): ``worker.before_checkpoint`` covers them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid as uuid_module
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeVar

from settled._failpoints import failpoint
from settled._faults import fault_enabled
from settled.processors import AgentRun
from settled.producers import StreamPart, encode_part
from settled.protocol import (
    RESERVED_SIGNAL_PREFIX,
    approval_details,
    approval_id_for,
    arguments_digest,
    steering_delivered,
    steering_stream,
    undelivered_steering,
    wait_id_for,
)
from settled.runtime._calls import ToolCalls, replay_settled
from settled.runtime._errors import (
    APPROVAL_DENIED,
    ReplayDivergenceError,
    RunSuspended,
    ToolApprovalDeniedError,
    ToolRefusedError,
    UnknownToolError,
    UnsafeReplayError,
    WaitExpiredError,
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
    user_text,
)
from settled.runtime._options import RunOptions
from settled.runtime._pipeline import CommitPipeline
from settled.runtime._tools import POLICY_DENIER, ApprovalVerdict, ToolRegistry, invoke
from settled.schemas import (
    DeltaKind,
    EffectKind,
    EffectRecorded,
    LogEvent,
    ModelResponseCompleted,
    ModelResponseDelta,
    ModelResponseInterrupted,
    RecoveryDecision,
    RecoveryDecisionKind,
    ResolutionKind,
    SignalReceived,
    SteeringDelivered,
    StepRecorded,
    ToolCallPrepared,
    ToolCallRefused,
    ToolCallSettled,
    UnknownResolved,
    WaitKind,
    WaitOutcome,
    WaitRequested,
    WaitResolved,
    canonical_json,
    json_digest,
)

__all__ = ["RunContext"]

_log = logging.getLogger(__name__)

_T = TypeVar("_T")


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
    if isinstance(event, WaitRequested):
        return f"ctx.{event.kind.value}({event.name!r})"
    return type(event).__name__


def _tool_approval(event: WaitRequested) -> bool:
    """Whether a wait is the approval of a tool call (issue 16 item 5), not a ``ctx.approve`` or ``ctx.signal``."""
    if event.kind is not WaitKind.APPROVAL or event.details_json is None:
        return False
    details = json.loads(event.details_json)
    return isinstance(details, dict) and details.get("tool") is not None


@dataclass(frozen=True)
class ApprovalDecision:
    """A person's decision on ``ctx.approve`` (issue 16 item 4).

    Attributes:
        approved: True if approved; False if denied or expired.
        by: The id of the key that signed the decision (``App.approver_keys``); None for an expiry.
        reason: The approver's reason, or ``"deadline_expired"`` for an expiry, or None.
    """

    approved: bool
    by: str | None
    reason: str | None

    @classmethod
    def of(cls, decided: WaitResolved) -> ApprovalDecision:
        """Read the decision from the approval wait's canonical `WaitResolved`.

        Args:
            decided: The wait's resolution: a delivery (its payload is `settled.protocol.approval_payload`'s) or
                an expiry.

        Returns:
            The decision; an expiry is a denial with reason ``"deadline_expired"``.

        Raises:
            ValueError: A delivery without a JSON object payload.
        """
        if decided.outcome is WaitOutcome.EXPIRED:
            return cls(approved=False, by=None, reason="deadline_expired")
        payload = None if decided.payload_json is None else json.loads(decided.payload_json)
        if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
            raise ValueError(f"approval {decided.wait_id}: payload_json {decided.payload_json!r} is not a decision")
        by, reason = payload.get("by"), payload.get("reason")
        return cls(
            approved=payload["approved"],
            by=by if isinstance(by, str) else None,
            reason=reason if isinstance(reason, str) else None,
        )


def _after_step_commit() -> None:
    """Runs in the conductor's thread right after a posted pure step commits (crash point "after step commit")."""
    failpoint("engine.after_step_commit")


class _Journal:
    """A run's recorded effects, indexed for replay."""

    def __init__(self, events: Sequence[LogEvent]) -> None:
        self.by_ordinal: dict[int, LogEvent] = {}
        self.settled: dict[str, ToolCallSettled] = {}
        self.resolved: dict[str, UnknownResolved] = {}
        self.retry_ok: set[str] = set()
        self.waits: dict[str, WaitResolved] = {}  # wait id -> its decision (issue 16)
        self.tool_approvals: dict[str, WaitRequested] = {}  # approval id -> a tool call's approval request (item 5)
        self.signals: list[SignalReceived] = []  # signals received for the run (read only under a fault switch)
        for e in events:
            if isinstance(e, WaitRequested) and _tool_approval(e):
                # At its call's ordinal, which the call's prepared or refused record holds (the call's own effect).
                self.tool_approvals.setdefault(e.wait_id, e)
            elif isinstance(e, (ToolCallPrepared, StepRecorded, EffectRecorded, WaitRequested)):
                self.by_ordinal.setdefault(e.ordinal, e)
            elif isinstance(e, WaitResolved):
                self.waits.setdefault(e.wait_id, e)
            elif isinstance(e, SignalReceived):
                self.signals.append(e)
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
        self._pipeline = CommitPipeline(run, self._options)
        self._calls = ToolCalls(
            self._pipeline,
            tools,
            self._options,
            submission_id=run.submission_id,
            attempt_id=run.attempt_id,
            attempt=run.attempt,
        )
        self.conversation_id = run.conversation_id
        self.submission_id = run.submission_id
        self.run_id = run.run_id or run.submission_id
        self.attempt_id = run.attempt_id
        self.attempt = run.attempt
        self.owner_epoch = run.owner_epoch
        self.input_json = run.input_json
        self.tools_offered = run.tools_offered
        self.history = run.history
        self._busy = 0  # tool calls, steps and model calls in flight (a wait is handed over once none is)
        self._idle: asyncio.Future[None] | None = None  # resolved when `_busy` drops to 0
        self._wait_requests: list[WaitRequested] = []  # waits asked for, handed over together
        self._suspension: asyncio.Future[None] | None = None  # hands the waits over, once
        # The provisional stream (issue 19): nothing is published while recorded positions remain to replay.
        self._replay_until = max(self._journal.by_ordinal, default=-1)
        self._stream_seq = 0
        # Steering (issue 22 item 3): the ids earlier model calls of the run saw, recorded ones first, in order.
        self._steering_seen: list[str] = steering_delivered(run.journal, run.submission_id)
        # Joining (issue 22 item 2): the submissions the run joined, earlier attempts' first, with their inputs.
        self._joined: list[tuple[str, str]] = list(run.joined)

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

    async def flush(self) -> None:
        """Commit the buffered records and wait for every posted one (the runtime does it before the reply)."""
        await self._pipeline.flush()

    async def _after_failure(self) -> None:
        await self._pipeline.after_failure()

    async def _quiesce(self) -> None:
        await self._pipeline.quiesce()

    def _recorded(self, ordinal: int) -> LogEvent | None:
        return self._journal.by_ordinal.get(ordinal)

    async def _tracked(self, work: Coroutine[Any, Any, _T]) -> _T:
        """Run an effect counted as in flight: waits are handed over only once no effect is (issue 16)."""
        self._busy += 1
        try:
            return await work
        finally:
            self._busy -= 1
            if self._busy == 0 and self._idle is not None and not self._idle.done():
                self._idle.set_result(None)

    # -- the provisional stream (issue 19) -----------------------------------------------------------------------

    def emit(self, part: Any) -> None:
        """Publish a provisional part to the run's followers (`settled.client.Client.stream`), at once.

        Not recorded and not replayed: the part goes to ``<ns>.stream`` before any commit, tagged with the run,
        this attempt and a sequence. While this attempt replays recorded positions it publishes nothing (the
        earlier attempt already did, and a follower drops that attempt's parts once this one publishes); from its
        first live position on it publishes under its own attempt id.

        Args:
            part: A JSON value.

        Raises:
            StreamPartError: ``part`` is not a JSON value, or is too large to publish (names the value or size).
        """
        built = self._stream_part("emit", part)
        if self._stream_live():
            self._publish(built)  # encodes it: a bad part raises here
        else:
            encode_part(built)  # a bad part is refused whether or not anyone publishes it

    def _stream_live(self) -> bool:
        return self._options.stream is not None and self._ordinal > self._replay_until

    def _stream_part(self, kind: str, data: Any) -> StreamPart:
        part = StreamPart(
            run=self.submission_id,
            conversation_id=self.conversation_id,
            attempt_id=self.attempt_id,
            attempt=self.attempt,
            seq=self._stream_seq,
            kind=kind,
            data=data,
        )
        return part

    def _publish(self, part: StreamPart) -> None:
        stream = self._options.stream
        if stream is None:
            return
        stream.publish(part)
        self._stream_seq += 1

    async def _flush_stream(self) -> None:
        """Wait (off the loop) until this attempt's parts reached the stream, at most `RunOptions.stream_flush_s`."""
        stream = self._options.stream
        if stream is None or self._stream_seq == 0:
            return
        left = await asyncio.get_running_loop().run_in_executor(None, stream.flush, self._options.stream_flush_s)
        if left:
            _log.warning(
                "stream parts not delivered before the reply",
                extra={"submission_id": self.submission_id, "undelivered": left},
            )

    # -- waits (issue 16) ----------------------------------------------------------------------------------------

    def signal(self, name: str, *, deadline: datetime | timedelta | None = None) -> Coroutine[Any, Any, Any]:
        """Wait durably for the signal ``name`` sent to this run (``Client.signal``); return its payload.

        The ordinal is taken when this is called. The run's waits of one name take that name's signals in log order,
        each once; a signal sent before the run got here is delivered at once. Live, the wait is handed over (a
        canonical ``WaitRequested``) once no tool call, step or model call of the run is in flight (a parallel
        batch's other calls settle first), and the attempt ends: the run holds no worker until the wait is decided,
        then the next attempt replays to here and returns the payload. On replay the recorded outcome is returned.

        Args:
            name: The signal's name.
            deadline: When the wait expires: an aware instant, or a duration from now (``RunOptions.clock``); stored
                with the request and never recomputed. None: no deadline.

        Returns:
            An awaitable of the delivered payload (decoded JSON).

        Raises:
            WaitExpiredError: The deadline passed before a delivery (when awaited; catchable).
            ReplayDivergenceError: Another effect is recorded at this ordinal (when awaited).
            ValueError: ``deadline`` is a naive datetime, or ``name`` starts with ``settled.`` (reserved for
                settled's own waits).
        """
        if name.startswith(RESERVED_SIGNAL_PREFIX):
            raise ValueError(f"ctx.signal name {name!r} starts with the reserved prefix {RESERVED_SIGNAL_PREFIX!r}")
        return self._signal(self._next_ordinal(), name, deadline)

    async def _signal(self, ordinal: int, name: str, deadline: datetime | timedelta | None) -> Any:
        wait_id = wait_id_for(self.run_id, ordinal)
        rec = self._recorded(ordinal)
        if rec is not None:
            if not (isinstance(rec, WaitRequested) and rec.kind is WaitKind.SIGNAL and rec.name == name):
                raise ReplayDivergenceError(ordinal, _describe(rec), f"ctx.signal({name!r})")
            decided = self._journal.waits.get(wait_id)
            if decided is None:  # never started so: a run is Ready only once every wait is decided
                raise RunSuspended(f"wait {wait_id} is still open")
            if decided.outcome is WaitOutcome.EXPIRED:
                raise WaitExpiredError(WaitKind.SIGNAL.value, name, wait_id)
            return None if decided.payload_json is None else json.loads(decided.payload_json)
        if fault_enabled("signal_honoured_before_canonical"):
            # Fault switch (issue 16; tests/fault_switches.toml): a signal already in the journal is honoured at
            # once, with no canonical request and delivery: nothing records that this wait consumed it.
            consumed = {d.source_id for d in self._journal.waits.values()}
            for received in self._journal.signals:
                if received.name == name and received.command_id not in consumed:
                    return json.loads(received.payload_json)
        at = self._deadline_at(f"ctx.signal({name!r})", deadline)
        request = WaitRequested(
            submission_id=self.submission_id,
            attempt_id=self.attempt_id,
            wait_id=wait_id,
            kind=WaitKind.SIGNAL,
            name=name,
            ordinal=ordinal,
            deadline=at,
        )
        await self._suspend(request)

    def _deadline_at(self, what: str, deadline: datetime | timedelta | None) -> datetime | None:
        """Turn a wait's deadline into the absolute instant stored with its request (never recomputed)."""
        if isinstance(deadline, timedelta):
            return self._options.clock() + deadline
        if isinstance(deadline, datetime):
            if deadline.tzinfo is None:
                raise ValueError(f"{what}: deadline {deadline!r} is naive; give an aware instant")
            return deadline
        return None

    def approve(
        self, title: str, description: str = "", *, deadline: datetime | timedelta | None = None
    ) -> Coroutine[Any, Any, ApprovalDecision]:
        """Wait durably for a person to approve or deny (``Client.approve|deny``); return their decision.

        The approval id is derived from the run and this call's ordinal (`settled.protocol.approval_id_for`) and
        the approval is bound to the digest of the canonical JSON of ``{"title", "description"}``: a decision for
        other arguments is rejected (``digest_mismatch``). Only a decision signed by a key in ``App.approver_keys``
        is accepted; its key id is ``by``. Live, the wait is handed over like ``ctx.signal``'s and the attempt ends
        (not charged to ``max_attempts``); the run resumes once the decision is canonical.

        Args:
            title: What is asked, in a few words (the request's name).
            description: What the approver is shown.
            deadline: When the approval expires: an aware instant, or a duration from now; an expired approval is
                a denial with reason ``deadline_expired`` and no ``by``.

        Returns:
            An awaitable of the decision.

        Raises:
            ReplayDivergenceError: Another effect is recorded at this ordinal (when awaited).
            ValueError: ``deadline`` is a naive datetime.
        """
        return self._approve(self._next_ordinal(), title, description, deadline)

    async def _approve(
        self, ordinal: int, title: str, description: str, deadline: datetime | timedelta | None
    ) -> ApprovalDecision:
        approval_id = approval_id_for(self.run_id, ordinal=ordinal)
        rec = self._recorded(ordinal)
        if rec is not None:
            if not (isinstance(rec, WaitRequested) and rec.kind is WaitKind.APPROVAL and rec.name == title):
                raise ReplayDivergenceError(ordinal, _describe(rec), f"ctx.approve({title!r})")
            decided = self._journal.waits.get(approval_id)
            if decided is None:  # never started so: a run is Ready only once every wait is decided
                raise RunSuspended(f"approval {approval_id} is still open")
            return ApprovalDecision.of(decided)
        args_json = canonical_json({"description": description, "title": title})
        request = WaitRequested(
            submission_id=self.submission_id,
            attempt_id=self.attempt_id,
            wait_id=approval_id,
            kind=WaitKind.APPROVAL,
            name=title,
            ordinal=ordinal,
            deadline=self._deadline_at(f"ctx.approve({title!r})", deadline),
            details_json=approval_details(title, description, args_json),
        )
        await self._suspend(request)

    async def _suspend(self, request: WaitRequested) -> NoReturn:
        """Hand ``request`` over with the run's other waits once nothing is in flight, then end the attempt."""
        self._wait_requests.append(request)
        if self._suspension is None:
            self._suspension = asyncio.ensure_future(self._hand_over_waits())
        await asyncio.shield(self._suspension)
        raise RunSuspended(f"the run waits for {request.kind.value} {request.name!r} (wait {request.wait_id})")

    async def _hand_over_waits(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            for _ in range(3):  # let the tasks started beside the wait (a gather's others) take their ordinals
                await asyncio.sleep(0)
            if self._busy == 0:
                break
            self._idle = loop.create_future()
            await self._idle
        requests, self._wait_requests = self._wait_requests, []
        await self._pipeline.record(requests)  # after the posted settlements of the calls that ran beside it
        failpoint("engine.after_wait_commit")

    # -- now / uuid ----------------------------------------------------------------------------------------------

    def _effect(self, kind: EffectKind, make: Callable[[], str]) -> str:
        ordinal = self._next_ordinal()
        rec = self._recorded(ordinal)
        if rec is not None:
            if not (isinstance(rec, EffectRecorded) and rec.kind is kind):
                raise ReplayDivergenceError(ordinal, _describe(rec), f"ctx.{kind.value}()")
            return rec.value
        value = make()
        self._pipeline.buffer.append(
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

    def step(
        self, name: str, fn: Callable[..., Any], *args: Any, version: int = 1, pure: bool = False
    ) -> Coroutine[Any, Any, Any]:
        """Run a durable step: at-least-once body, exactly one recorded success (DUR-010, docs/semantics.md §11).

        The ordinal is taken when this is called. A recorded success is returned without running ``fn``; a
        failure is not recorded (the exception propagates, and the next attempt runs the body again). A step's
        ``StepRecorded`` is awaited: it commits before any later step body, tool call or the run's settlement
        starts. A pure step's is posted instead (docs/architecture.md "Commits per tool call"): the run goes on
        with the value at once and the record commits in the same or an earlier transaction than the run's next
        awaited record (its settlement included); it lingers like a settlement, so quick pure steps in a row share
        one commit. A crash before that commit loses it and the next attempt runs the body again (once more per
        lost commit), recorded once.

        Args:
            name: The step's name.
            fn: The body (sync, on a thread, or async); returns a JSON value.
            *args: Its arguments.
            version: The step's version; a different version recorded at this ordinal is a divergence.
            pure: The body has no outside effect (a computation over its arguments and the run's recorded values),
                so running it again after a crash is harmless: its record is posted, not awaited.

        Returns:
            An awaitable of the step's result (decoded from its canonical JSON, live and on replay alike).

        Raises:
            ReplayDivergenceError: Another effect, step name or version is recorded at this ordinal (when awaited).
        """
        return self._tracked(self._step(self._next_ordinal(), name, fn, args, version, pure))

    async def _step(
        self, ordinal: int, name: str, fn: Callable[..., Any], args: tuple[Any, ...], version: int, pure: bool
    ) -> Any:
        rec = self._recorded(ordinal)
        actual = f"step {name!r} version {version}"
        if rec is not None:
            if not (isinstance(rec, StepRecorded) and rec.name == name and rec.version == version):
                raise ReplayDivergenceError(ordinal, _describe(rec), actual)
            return json.loads(rec.result_json)
        await self._pipeline.flush_response()  # a step body acts on committed responses only (docs/semantics.md §9)
        value = await invoke(fn, *args)
        result_json = canonical_json(value)
        size = len(result_json.encode())
        if size > self._options.max_result_bytes:
            raise ValueError(
                f"step {name!r} result is {size} bytes, over max_result_bytes {self._options.max_result_bytes}"
            )
        failpoint("engine.step_returned")
        step_id = json_digest(canonical_json([self.run_id, ordinal, "step", name]))
        recorded = StepRecorded(
            submission_id=self.submission_id,
            attempt_id=self.attempt_id,
            name=name,
            version=version,
            step_id=step_id,
            ordinal=ordinal,
            result_json=result_json,
            result_digest=json_digest(result_json),
        )
        if pure or fault_enabled("step_not_awaited"):
            # Posted (issue 24 item 2): no outside effect depends on it; the chain orders it before whatever the run
            # records next, so it commits with the run's next awaited record at the latest.
            await self._pipeline.post_in_order([recorded], on_commit=_after_step_commit)
        else:
            await self._pipeline.record([recorded])
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

        A call of a tool that needs approval (``needs_approval=True``, or an ``approval_policy`` answering ``ask``
        for these arguments; issue 16 item 5) first waits for a person: an approval wait whose id is derived from the
        call (`settled.protocol.approval_id_for`) and bound to the digest of its canonical arguments is handed over
        like ``ctx.approve``'s (once no other call of the run is in flight: a parallel batch's other calls settle
        first) and the attempt ends; the call is prepared and runs only in an attempt that replays the approval as
        canonical and approved. A policy's ``deny`` never pauses: the call is recorded as refused (reason
        ``approval_denied: …``, by ``"policy"``) and never runs.

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
            ToolApprovalDeniedError: The call needed approval and was denied (by a person, its deadline or the
                tool's policy); the tool never ran. Uncaught, the submission settles failed (``approval_denied``).
            UnknownToolError: No tool of that name is registered.
            ReplayDivergenceError: Another effect, tool or argument digest is recorded at this ordinal.
            ToolUnavailableError: An idempotent call stayed in doubt past its retry budget (the attempt ends).
            CanonicalJsonError: ``args`` is not representable as canonical JSON.
            ValueError: ``args`` is larger than `RunOptions.max_result_bytes` (when awaited).
        """
        allowed = self.tools_offered if offered is None else tuple(offered)
        return self._tool(self._next_ordinal(), name, dict(args or {}), allowed)

    async def _tool(self, ordinal: int, name: str, args: dict[str, Any], allowed: Sequence[str]) -> Any:
        """A call, after its approval when its tool needs one: the approval wait is not counted as in flight."""
        gate = self._approval_gate(ordinal, name, args, allowed)
        if gate is not None:
            if fault_enabled("tool_runs_before_approval"):
                # Fault switch (issue 16 item 5; tests/fault_switches.toml): the call is prepared and the tool runs
                # before its approval is canonical (asked for only afterwards), so an unapproved tool runs.
                await self._tracked(self._call_tool(ordinal, name, args, allowed))
            await self._suspend(gate)
        return await self._tracked(self._call_tool(ordinal, name, args, allowed))

    def _approval_gate(
        self, ordinal: int, name: str, args: dict[str, Any], allowed: Sequence[str]
    ) -> WaitRequested | None:
        """Decide whether a call must wait for a person first (issue 16 item 5); return the request, or None.

        None when the call goes on to `_call_tool`: nothing is recorded at its ordinal and its tool needs no approval
        for these arguments (or is not offered, or unknown: `_call_tool` refuses it), or its approval is recorded and
        approved, or something is recorded at its ordinal (replayed there, a policy's denial included), or the policy
        denies it (`_call_tool` records the denial).

        Args:
            ordinal: The call's callsite ordinal.
            name: The tool's name.
            args: The call's arguments.
            allowed: The tools offered for the call (empty: all).

        Returns:
            The approval request to hand over (the call waits for it), or None.

        Raises:
            ToolApprovalDeniedError: The call's approval is recorded and denied (by a person or its deadline).
            RunSuspended: The call's approval is recorded and still open (a run is Ready only once it is decided).
            ReplayDivergenceError: The recorded approval is for another tool or other arguments.
        """
        if self._recorded(ordinal) is not None or (allowed and name not in allowed):
            return None
        try:
            spec = self._tools.get(name)
        except UnknownToolError:
            return None  # `_call_tool` raises it
        if not spec.gated:
            return None
        call_id = f"{self.run_id}#{ordinal}"
        approval_id = approval_id_for(self.run_id, call_id=call_id)
        args_json = canonical_json(args)
        requested = self._journal.tool_approvals.get(approval_id)
        if requested is not None:
            details = json.loads(requested.details_json or "{}")
            if details.get("tool") != name or details.get("args_digest") != arguments_digest(args_json):
                actual = f"tool {name!r} with arguments {json_digest(args_json)[:12]}"
                recorded = f"an approval of tool {details.get('tool')!r} with arguments {details.get('args_digest')}"
                raise ReplayDivergenceError(ordinal, recorded, actual)
            decided = self._journal.waits.get(approval_id)
            if decided is None:
                raise RunSuspended(f"approval {approval_id} is still open")
            decision = ApprovalDecision.of(decided)
            if not decision.approved:
                raise ToolApprovalDeniedError(name, call_id, decision.by, decision.reason)
            return None
        if spec.approval_verdict(args) is not ApprovalVerdict.ASK:
            return None
        description = (spec.fn.__doc__ or "").strip().split("\n", 1)[0]
        return WaitRequested(
            submission_id=self.submission_id,
            attempt_id=self.attempt_id,
            wait_id=approval_id,
            kind=WaitKind.APPROVAL,
            name=name,
            ordinal=ordinal,
            details_json=approval_details(name, description, args_json, tool=name),
        )

    async def _call_tool(self, ordinal: int, name: str, args: dict[str, Any], allowed: Sequence[str]) -> Any:
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
                if rec.reason.startswith(f"{APPROVAL_DENIED}:"):
                    raise ToolApprovalDeniedError(name, call_id, POLICY_DENIER, rec.reason)
                raise ToolRefusedError(name, call_id, "not_offered", rec.reason, non_retryable=True)
            settled = self._journal.settled.get(call_id)
            if settled is not None:
                return replay_settled(name, settled)
            resolved = self._journal.resolved.get(call_id)
            if resolved is not None and resolved.kind is ResolutionKind.CALL_OUTCOME:
                return None if resolved.result_json is None else json.loads(resolved.result_json)
            if call_id not in self._journal.retry_ok:
                raise UnsafeReplayError(call_id, name)
            # A recovery decision or a resolution declared it safe: prepared again under the same key.
        if allowed and name not in allowed:
            reason = f"not_offered: tool {name!r} is not offered for this turn (offered: {sorted(allowed)})"
            await self._pipeline.record(
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
        if (
            rec is None
            and spec.approval_policy is not None
            and approval_id_for(self.run_id, call_id=call_id) not in self._journal.tool_approvals
            and spec.approval_verdict(args) is ApprovalVerdict.DENY
        ):
            # Denied by the tool's approval policy: recorded, never paused, never run (issue 16 item 5).
            reason = f"{APPROVAL_DENIED}: the approval policy of tool {name!r} denies these arguments"
            await self._pipeline.record(
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
            raise ToolApprovalDeniedError(name, call_id, POLICY_DENIER, reason)
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
        return await self._calls.call(spec, prepared, args)

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
        return self._tracked(self._model(self._next_ordinal(), provider, tuple(messages), tuple(tools), model))

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
        self._pipeline.raise_failed_posts()
        await (
            self._pipeline.flush_response()
        )  # an earlier response is canonical before the next prompt (docs/semantics.md §9)
        operation_id = json_digest(canonical_json([self.run_id, self.attempt_id, ordinal, "model"]))
        await self._join(ordinal)
        messages, steered = self._steered(self._with_joined(messages))
        request = ModelRequest(operation_id=operation_id, model=model, messages=messages, tools=tools)
        delay_s = self._options.model_backoff_s
        retries = 0
        next_delta_index = 0  # the tries of one call number their deltas in one sequence
        while True:
            tried = _Try(next_delta_index)
            try:
                response, deltas = await self._stream(provider, request, ordinal, tried)
            except (ProviderError, ConnectionError, TimeoutError) as exc:
                next_delta_index = tried.next_delta_index
                if tried.began and self._options.stream is not None:  # followers drop this try's text (issue 19)
                    self._publish(
                        self._stream_part(
                            "interrupted", {"response_ordinal": ordinal, "error": f"{type(exc).__name__}"}
                        )
                    )
                if tried.began:
                    # The try's unrecorded deltas and what it cost ride with the next record: the retry's first
                    # deltas, its response, or the run's failure (issue 19; docs/architecture.md "Model calls").
                    self._pipeline.buffer.extend(
                        [
                            *tried.pending,
                            ModelResponseInterrupted(
                                submission_id=self.submission_id,
                                attempt_id=self.attempt_id,
                                response_ordinal=ordinal,
                                provider=provider.name,
                                model=model,
                                operation_id=operation_id,
                                first_delta_index=tried.first_delta_index,
                                delta_count=tried.next_delta_index - tried.first_delta_index,
                                output_chars=tried.output_chars,
                                usage=exc.usage if isinstance(exc, ProviderError) else None,
                                error=f"{type(exc).__name__}: {exc}",
                            ),
                        ]
                    )
                retryable = exc.retryable if isinstance(exc, ProviderError) else True
                if not retryable or retries >= self._options.model_retries:
                    # The per-operation budget is spent (or retrying cannot help): the submission does not retry
                    # the call again with a fresh budget in another attempt (one retry layer; issue 22 item 4).
                    if isinstance(exc, ProviderError):
                        exc.non_retryable = True
                        raise
                    spent = ProviderError(f"{type(exc).__name__}: {exc}", retryable=True)
                    spent.non_retryable = True
                    raise spent from exc
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
            operation_id=operation_id,
        )
        # Committed with the next awaited record: the prepared calls it declares (one commit before the first tool
        # runs, docs/design.md §3), a refusal, a step, the next prompt or the reply — never after a tool runs (DUR-008).
        delivered = (
            [
                SteeringDelivered(
                    submission_id=self.submission_id,
                    attempt_id=self.attempt_id,
                    response_ordinal=ordinal,
                    command_ids=steered,
                )
            ]
            if steered
            else []
        )
        self._pipeline.buffer.extend([*deltas, *delivered, completed])
        self._steering_seen.extend(steered)
        return ModelResponse.from_record(completed)

    async def _join(self, ordinal: int) -> None:
        """Take in the ready submissions queued behind the run before a live model call (issue 22 item 2, DUR-016).

        Only when the committed state has something to join (`AgentRun.joinable`: a ``join`` lane with ready
        submissions queued behind the run): the run's own records handed over so far commit first (a tool's posted
        result, buffered values), so the log keeps the run's order; then the owner decides the contiguous ready
        prefix into a `SubmissionsJoined` and this waits until it is committed: the joined inputs reach the model
        only once their record is canonical. A crash before that leaves them Ready; after it, the next attempt gets
        them from the log (`AgentRun.joined`).

        Args:
            ordinal: The model call's ordinal.

        Raises:
            AttemptSupersededError: The record could not be committed (this attempt may append nothing more).
        """
        if not self._run.joinable():
            return
        await self._pipeline.flush()
        new = await asyncio.wrap_future(self._run.join(ordinal))
        if new:
            self._joined.extend(new)
            failpoint("engine.after_join_commit")  # the join is canonical; the model has not seen the joined inputs

    def _with_joined(self, messages: tuple[Message, ...]) -> tuple[Message, ...]:
        """The agent's prompt, then the inputs of the submissions the run joined, as user messages in join order."""
        if not self._joined:
            return messages
        return (*messages, *(Message(role="user", text=user_text(input_json)) for _, input_json in self._joined))

    def _steered(self, messages: tuple[Message, ...]) -> tuple[tuple[Message, ...], tuple[str, ...]]:
        """The prompt a model call sends, and the steering messages it is the first to see (issue 22 item 3).

        After the agent's own messages come the run's steering messages as user messages, in log order: those
        earlier calls saw, then the ones canonical in the committed journal now that no earlier call saw. Only
        canonical messages are shown (a `SteeringReceived` the owner committed), so a message affects the run only
        once it is in the log.

        Args:
            messages: The prompt the agent built.

        Returns:
            The prompt to send, and the command ids of the messages first shown to this call.
        """
        committed = self._run.committed() or self._run.journal
        stream = {m.command_id: m for m in steering_stream(committed, self.submission_id)}
        for m in steering_stream(self._run.journal, self.submission_id):
            stream.setdefault(m.command_id, m)
        new = tuple(m.command_id for m in undelivered_steering(committed, self.submission_id, self._steering_seen))
        shown = [stream[i] for i in (*self._steering_seen, *new) if i in stream]
        if not shown:
            return messages, ()
        return (*messages, *(Message(role="user", text=m.text) for m in shown)), new

    async def _stream(
        self, provider: ModelProvider, request: ModelRequest, ordinal: int, tried: _Try
    ) -> tuple[ModelResponse, list[ModelResponseDelta]]:
        every = self._options.delta_flush_every
        stream = provider.stream(request)
        try:
            async for event in stream:
                tried.began = True
                if isinstance(event, ModelResponse):
                    return event, tried.pending
                tried.output_chars += len(event.text)
                if isinstance(event, ToolArgumentsDelta):
                    continue  # provisional: tool-argument deltas are never canonical (DUR-008)
                if self._options.stream is not None:  # a model call runs live: published as it arrives (issue 19)
                    self._publish(
                        self._stream_part("text" if isinstance(event, TextDelta) else "reasoning", event.text)
                    )
                if every <= 0:
                    continue
                kind = DeltaKind.TEXT if isinstance(event, TextDelta) else DeltaKind.REASONING
                tried.pending.append(
                    ModelResponseDelta(
                        submission_id=self.submission_id,
                        attempt_id=self.attempt_id,
                        response_ordinal=ordinal,
                        delta_index=tried.next_delta_index,
                        kind=kind,
                        text=event.text,
                    )
                )
                tried.next_delta_index += 1
                if len(tried.pending) >= every:
                    batch, tried.pending = tried.pending, []
                    await self._pipeline.record(batch)
                    failpoint("engine.after_delta_commit")
        finally:
            # Close the stream here, on this task: left to the event loop's async-generator finalizer, closing it
            # costs a thread-safe wake-up and a task per model call.
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        raise ProviderError(f"provider {provider.name!r} ended its stream without a response", retryable=True)


class _Try:
    """One try of a model call: where its deltas are numbered from, what it received, what is not yet recorded.

    Attributes:
        first_delta_index: ``delta_index`` of the try's first delta (the previous try's next one).
        next_delta_index: ``delta_index`` of the try's next delta.
        pending: Deltas not yet handed to the pipeline.
        output_chars: Characters of text, reasoning and tool arguments received.
        began: True once the provider yielded anything.
    """

    __slots__ = ("began", "first_delta_index", "next_delta_index", "output_chars", "pending")

    def __init__(self, first_delta_index: int) -> None:
        self.first_delta_index = first_delta_index
        self.next_delta_index = first_delta_index
        self.pending: list[ModelResponseDelta] = []
        self.output_chars = 0
        self.began = False
