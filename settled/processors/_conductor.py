"""The conductor: scheduling, attempts, terminalization and abort for one owned partition (issue 5; spec §5, §12, §13).

Driven by the worker loop, one call per phase of a turn:

* `before_checkpoint` — drain finished runs and stage their settlements (or, for a run that raised, an
  interruption to retry, or a failed settlement once ``max_attempts`` is spent); decide recovery for submissions
  the claim put in Recovery; stage what the scheduler says next on the overlay (``AttemptStarted`` — canonical before
  the attempt runs — or an immediate aborted settlement of a queued submission).
* `after_checkpoint` — start the runs whose ``AttemptStarted`` is now committed, and cancel runs whose abort is now
  canonical (DUR-012: the abort is canonical before the worker is interrupted).

A run's late result is kept only if its attempt is still the submission's current one (attempt tokens: a superseded
attempt appends nothing). Runs execute on a thread pool, so conversations sharing a partition run concurrently;
suspended and settled runs hold no pool slot.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from settled import protocol
from settled._failpoints import failpoint
from settled.processors._ledger import to_loop_decision
from settled.processors._partition import PartitionOwner
from settled.protocol import PartitionState, SettleAborted, StartAttempt, SubmissionState
from settled.schemas import RecoveryDecision, RecoveryDecisionKind, SettlementOutcome

__all__ = ["Agent", "AgentRun", "Conductor", "RunFailed"]

_log = logging.getLogger(__name__)


class RunFailed(Exception):
    """An agent's run ended with an error that is not worth retrying (``non_retryable``).

    Attributes:
        error_type: The error's type name, recorded in the settlement.
        non_retryable: Whether a new attempt could succeed.
    """

    def __init__(self, error_type: str, reason: str, *, non_retryable: bool = True) -> None:
        super().__init__(reason)
        self.error_type = error_type
        self.non_retryable = non_retryable


@dataclass(frozen=True)
class AgentRun:
    """What an agent's run body gets.

    Attributes:
        conversation_id: The conversation.
        submission_id: The submission.
        attempt_id: This attempt's id (its token: a superseded attempt's result is dropped).
        attempt: The attempt number (1, 2, ...).
        input_json: The submission's input, canonical JSON.
        owner_epoch: The owner epoch, a fencing token for outside systems (DESIGN.md §3).
        cancelled: Set when the run must stop (abort, revoke); a run checks it at its own pace.
    """

    conversation_id: str
    submission_id: str
    attempt_id: str
    attempt: int
    input_json: str
    owner_epoch: int
    cancelled: threading.Event


#: An agent's run body: returns the final reply as canonical JSON, or raises.
Agent = Callable[[AgentRun], str]


@dataclass
class _Running:
    run: AgentRun
    future: Future[str]


@dataclass
class Conductor:
    """Attempts of one owned partition.

    Attributes:
        owner: The partition's owner (its committed state and pending overlay).
        agent: The run body.
        pool: The worker's thread pool (its size is the worker's concurrency permit count).
        clock: Returns "now".
        max_attempts: Attempts per submission before it settles failed (DESIGN.md §5; default 3).
    """

    owner: PartitionOwner[PartitionState]
    agent: Agent
    pool: ThreadPoolExecutor
    clock: Callable[[], datetime]
    max_attempts: int = 3
    _staged: dict[str, tuple[str, str]] = field(default_factory=dict, init=False)  # submission -> (conv, attempt)
    _running: dict[str, _Running] = field(default_factory=dict, init=False)  # attempt id -> run
    _last_error: dict[str, tuple[str, str]] = field(default_factory=dict, init=False)

    # -- phase 1 -------------------------------------------------------------------------------------------------

    def before_checkpoint(self) -> None:
        """Stage settlements of finished runs, recovery decisions, and the scheduler's next steps."""
        now = self.clock()
        for attempt_id, running in list(self._running.items()):
            if running.future.done():
                del self._running[attempt_id]
                self._finish(running, now)
        for conversation_id in list(self.owner.overlay.conversations):
            self._recover(conversation_id, now)
            self._schedule(conversation_id, now)

    def _conv(self, conversation_id: str) -> protocol.ConversationState:
        return self.owner.overlay.conversation(conversation_id)

    def _finish(self, running: _Running, now: datetime) -> None:
        run = running.run
        conv = self._conv(run.conversation_id)
        sub = conv.submission(run.submission_id)
        if sub is None or sub.attempt_id != run.attempt_id or sub.state is not SubmissionState.RUNNING:
            _log.info("late result of a superseded attempt dropped", extra={"attempt_id": run.attempt_id})
            return
        exc = running.future.exception()
        if exc is None:
            decision = protocol.terminalize(
                conv, run.submission_id, SettlementOutcome.COMPLETED, now, reply_json=running.future.result()
            )
        elif sub.abort_requested:
            decision = protocol.terminalize(conv, run.submission_id, SettlementOutcome.ABORTED, now)
        else:
            error_type = exc.error_type if isinstance(exc, RunFailed) else type(exc).__name__
            self._last_error[run.submission_id] = (error_type, str(exc))
            final = (isinstance(exc, RunFailed) and exc.non_retryable) or run.attempt >= self.max_attempts
            if final:
                decision = protocol.terminalize(
                    conv, run.submission_id, SettlementOutcome.FAILED, now, error_type=error_type, error_reason=str(exc)
                )
            else:
                decision = protocol.interrupt(conv, run.submission_id, f"attempt {run.attempt} raised {error_type}")
        failpoint("conductor.before_settle")  # a finished run's settlement (or interruption) is about to be staged
        self.owner.stage(to_loop_decision(run.conversation_id, decision))

    def _recover(self, conversation_id: str, now: datetime) -> None:
        conv = self._conv(conversation_id)
        active = conv.active()
        if active is None or active.state is not SubmissionState.RECOVERY:
            return
        # Until the execution engine's classifier (issue 6): a run without tools may always resume, within budget.
        if active.attempt_count >= self.max_attempts:
            decision = RecoveryDecision(
                submission_id=active.submission_id,
                attempt_id=active.attempt_id,
                decision=RecoveryDecisionKind.TERMINALIZE,
                call_ids=(),
                reason=f"{active.attempt_count} attempts ended without a settlement",
            )
        else:
            decision = RecoveryDecision(
                submission_id=active.submission_id,
                attempt_id=active.attempt_id,
                decision=RecoveryDecisionKind.RESUME,
                call_ids=(),
                reason="the worker disappeared; no effect is in doubt",
            )
        self.owner.stage(to_loop_decision(conversation_id, protocol.Decision(events=(decision,))))
        if decision.decision is RecoveryDecisionKind.TERMINALIZE:
            conv = self._conv(conversation_id)
            error_type, reason = self._last_error.get(active.submission_id, ("WorkerDied", decision.reason))
            settle = protocol.terminalize(
                conv, active.submission_id, SettlementOutcome.FAILED, now, error_type=error_type, error_reason=reason
            )
            self.owner.stage(to_loop_decision(conversation_id, settle))

    def _schedule(self, conversation_id: str, now: datetime) -> None:
        while True:
            conv = self._conv(conversation_id)
            nxt = protocol.schedule(conv)
            if isinstance(nxt, SettleAborted):
                d = protocol.terminalize(conv, nxt.submission_id, SettlementOutcome.ABORTED, now)
                self.owner.stage(to_loop_decision(conversation_id, d))
                continue  # an aborted queued submission never blocks the rest (spec §13)
            if isinstance(nxt, StartAttempt) and nxt.submission_id not in self._staged:
                attempt_id = uuid.uuid4().hex
                d = protocol.start_attempt(conv, nxt.submission_id, attempt_id, self.owner.epoch)
                self.owner.stage(to_loop_decision(conversation_id, d))
                self._staged[nxt.submission_id] = (conversation_id, attempt_id)
            return

    # -- phase 2 -------------------------------------------------------------------------------------------------

    def after_checkpoint(self) -> None:
        """Start runs whose ``AttemptStarted`` committed; cancel runs whose abort committed."""
        committed = self.owner.committed
        for submission_id, (conversation_id, attempt_id) in list(self._staged.items()):
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
            run = AgentRun(
                conversation_id=conversation_id,
                submission_id=submission_id,
                attempt_id=attempt_id,
                attempt=sub.attempt_count,
                input_json=sub.input_json or "null",
                owner_epoch=self.owner.epoch,
                cancelled=threading.Event(),
            )
            self._running[attempt_id] = _Running(run, self.pool.submit(self.agent, run))
        for running in self._running.values():
            conv = committed.conversation(running.run.conversation_id)
            sub = conv.submission(running.run.submission_id)
            if sub is not None and sub.abort_requested:
                running.run.cancelled.set()

    def close(self) -> None:
        """Stop every run of this partition (its ownership ended); their late results append nothing."""
        for running in self._running.values():
            running.run.cancelled.set()
        self._running.clear()
        self._staged.clear()
