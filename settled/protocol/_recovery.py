"""The recovery classifier: a submission's persisted facts → what recovery does (DUR-009, DUR-013).

See docs/semantics.md §8, §14, §15.

`classify` is pure: it reads a `RecoverySnapshot` — the submission's folded state, the calls that were prepared and
never settled (each with its tool's declared safety and, once asked, its reconciler's answer), the Unknown calls,
the abort intent and the attempt budget — and returns a `Recovery`: which action recovery takes and, for a
submission in Recovery, the events to append (facts first, the `RecoveryDecision` last). The owner appends them
before acting on the decision (docs/semantics.md §14 step 7, DUR-013). Nothing here runs a reconciler: when a
reconcilable call has no answer yet, the answer is `RecoveryAction.RECONCILE_FIRST` naming the calls to ask; the caller
asks (I/O) and classifies again with the answers in the snapshot.

The rules for a submission in Recovery, in order (docs/design.md §5; docs/semantics.md §10, §13, §16):

1. A reconcilable open call whose reconciler was not asked yet → ask it first (`RECONCILE_FIRST`).
2. A call in doubt → **Unknown**. An open call is in doubt unless its reconciler proved "never started" or recovered
   its result, or its tool is idempotent (safe to repeat under its stable key). A call already marked Unknown stays
   Unknown until a signed resolution. The calls in doubt get a `ToolCallUnknown` each, then `RecoveryDecision`
   ``unknown``. Never a manufactured error result (docs/semantics.md §10), whatever the abort intent or the attempt
   budget.
3. An abort is recorded → ``terminalize`` (the submission settles ``aborted``; no rollback is claimed,
   docs/semantics.md §13).
4. The attempt budget is spent (``attempt_count >= max_attempts``) → ``terminalize`` (settles ``failed``, §16).
5. Open calls, all safe → ``reconcile`` when a reconciler recovered a result (its `ToolCallSettled` is appended
   first, so the next attempt replays it), else ``safe_retry`` (the next attempt prepares the calls again under
   the same idempotency keys). The decision names the calls: the runtime re-executes only a call a decision or a
   ``safe_to_retry`` resolution names.
6. No open call → ``resume``: the next attempt replays the recorded effects and continues from the last canonical
   boundary (a committed response, tool result or step; a stream cut mid-way is retried as a new response).

Other states answer without a decision: nothing was accepted, or the submission is settled (`NOTHING`); admitted
but not ready (`MATERIALIZE`); ready (`SCHEDULE`); running here, or suspended on a wait of any kind — Unknown
calls, signals, approvals (`WAITING_STATES`; `WAIT`); terminalizing with its obligation fixed (`SETTLE_RESERVED`).
Each row of docs/semantics.md §15 crash-point matrix is one of these cases
(``tests/unit/protocol/test_recovery.py`` has one case per row).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from settled.protocol._fold import Submission
from settled.protocol._states import TERMINAL_STATES, WAITING_STATES, SubmissionState
from settled.schemas import (
    LogEvent,
    RecoveryDecision,
    RecoveryDecisionKind,
    SettlementOutcome,
    ToolCallSettled,
    ToolCallUnknown,
    canonicalize_json_text,
    json_digest,
)

__all__ = [
    "OpenCall",
    "ReconcileAnswer",
    "Reconciliation",
    "Recovery",
    "RecoveryAction",
    "RecoverySnapshot",
    "ToolSafety",
    "classify",
]

S = SubmissionState


class RecoveryAction(enum.StrEnum):
    """What recovery does with a submission (docs/semantics.md §14 step 6)."""

    NOTHING = "nothing"
    """Nothing was accepted (the client retries with its key), or the submission is settled (its recorded
    settlement is the answer)."""
    MATERIALIZE = "materialize"
    """Admitted but not ready: append `SubmissionReady` (docs/semantics.md §4)."""
    SCHEDULE = "schedule"
    """Ready: the scheduler starts its next attempt; the first one applies the input idempotently."""
    WAIT = "wait"
    """Running under this owner, or suspended on a wait (Unknown calls, signals, approvals): recovery does nothing
    now; a canonical delivery or expiry resumes it."""
    RECONCILE_FIRST = "reconcile_first"
    """Ask the reconcilers of `Recovery.reconcile` and classify again with their answers."""
    DECIDE = "decide"
    """Append `Recovery.events` (facts, then the `RecoveryDecision`) before acting on the decision (DUR-013)."""
    SETTLE_RESERVED = "settle_reserved"
    """Terminalizing with its obligation fixed: append the settlement (`Recovery.settle`; docs/semantics.md §12)."""


@dataclass(frozen=True, slots=True)
class ToolSafety:
    """What a tool declares about repeating it (docs/design.md §5).

    Attributes:
        idempotent: Safe to run again under the same idempotency key (the outside world dedupes by it).
        reconcilable: Has a reconciler that can prove "never started", recover the result, or answer "unknown".
    """

    idempotent: bool = False
    reconcilable: bool = False


class ReconcileAnswer(enum.StrEnum):
    """A reconciler's answer about one prepared call (docs/semantics.md §10)."""

    NEVER_STARTED = "never_started"
    """Execution provably never started: safe to run it."""
    RECOVERED = "recovered"
    """Execution completed and its result is recovered."""
    UNKNOWN = "unknown"
    """The reconciler cannot tell."""


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """A reconciler's answer with its evidence.

    Attributes:
        answer: The answer.
        result_json: For `ReconcileAnswer.RECOVERED`: the recovered result, canonical JSON (required then, and only
            then).
        reason: Why, in words (recorded in the decision's reason).

    Raises:
        ValueError: ``result_json`` is missing for ``recovered``, present otherwise, or not canonical JSON.
    """

    answer: ReconcileAnswer
    result_json: str | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if (self.answer is ReconcileAnswer.RECOVERED) != (self.result_json is not None):
            raise ValueError(
                f"Reconciliation.result_json is required with answer 'recovered' and only then "
                f"(answer={self.answer.value!r}, result_json={self.result_json!r})"
            )
        if self.result_json is not None and canonicalize_json_text(self.result_json) != self.result_json:
            raise ValueError(f"Reconciliation.result_json is not canonical JSON: {self.result_json!r}")


@dataclass(frozen=True, slots=True)
class OpenCall:
    """A call prepared and neither settled nor marked Unknown.

    Attributes:
        call_id: The call.
        tool: Its tool's name.
        safety: The tool's declared safety (unregistered tools: neither idempotent nor reconcilable).
        reconciliation: The reconciler's answer, once asked.
    """

    call_id: str
    tool: str
    safety: ToolSafety = ToolSafety()
    reconciliation: Reconciliation | None = None


@dataclass(frozen=True, slots=True)
class RecoverySnapshot:
    """A submission's persisted facts, as recovery reads them (docs/semantics.md §14 step 3).

    Attributes:
        submission_id: The submission.
        state: Its folded state; None when the log holds no admission for it.
        attempt_id: The interrupted (current) attempt's id.
        attempt_count: Attempts charged so far (`Submission.charged_attempts`: started, less graceful revokes).
        max_attempts: The submission's attempt budget (docs/design.md §5).
        abort_requested: True when an abort is recorded (DUR-012).
        input_applied: True when its input is canonical history (docs/semantics.md §4).
        open_calls: Calls prepared and not settled or marked Unknown.
        unknown_calls: Calls marked Unknown and not resolved (the open waits of kind `unknown`).
        reserved_outcome: The outcome fixed before the settlement, when one is.
        outcome: The terminal outcome, once settled.
        partial_response: True when committed response deltas have no completed response (a stream cut mid-way).
        waits: The open waits of kind signal or approval (`Submission.waits`), sorted.

    Raises:
        ValueError: ``max_attempts`` < 1, ``attempt_count`` < 0, or a call id repeats.
    """

    submission_id: str
    state: SubmissionState | None
    attempt_id: str | None = None
    attempt_count: int = 0
    max_attempts: int = 3
    abort_requested: bool = False
    input_applied: bool = False
    open_calls: tuple[OpenCall, ...] = ()
    unknown_calls: tuple[str, ...] = ()
    reserved_outcome: SettlementOutcome | None = None
    outcome: SettlementOutcome | None = None
    partial_response: bool = False
    waits: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RecoverySnapshot.max_attempts must be >= 1, got {self.max_attempts}")
        if self.attempt_count < 0:
            raise ValueError(f"RecoverySnapshot.attempt_count must be >= 0, got {self.attempt_count}")
        ids = [c.call_id for c in self.open_calls] + list(self.unknown_calls)
        if len(set(ids)) != len(ids):
            raise ValueError(f"RecoverySnapshot: call ids repeat across open_calls and unknown_calls: {sorted(ids)}")

    @classmethod
    def of(
        cls,
        submission_id: str,
        sub: Submission | None,
        calls: Iterable[OpenCall],
        max_attempts: int,
        *,
        partial_response: bool = False,
    ) -> RecoverySnapshot:
        """Build a snapshot from the fold's view of a submission and what the journal says of its open calls.

        Args:
            submission_id: The submission.
            sub: Its folded state (None when not admitted).
            calls: The open calls with their tools' safety (and reconcilers' answers); only those the fold lists
                as open are kept, and an open call the journal does not describe gets an unsafe placeholder.
            max_attempts: The attempt budget.
            partial_response: See `RecoverySnapshot.partial_response`.

        Returns:
            The snapshot.
        """
        if sub is None:
            return cls(submission_id=submission_id, state=None, max_attempts=max_attempts)
        described: Mapping[str, OpenCall] = {c.call_id: c for c in calls}
        open_calls = tuple(described.get(cid, OpenCall(cid, "<unrecorded>")) for cid in sorted(sub.open_calls))
        return cls(
            submission_id=submission_id,
            state=sub.state,
            attempt_id=sub.attempt_id,
            attempt_count=sub.charged_attempts,
            max_attempts=max_attempts,
            abort_requested=sub.abort_requested,
            input_applied=sub.input_applied,
            open_calls=open_calls,
            unknown_calls=tuple(sorted(sub.unknown_calls)),
            waits=tuple(sorted(sub.waits)),
            reserved_outcome=sub.reserved_outcome,
            outcome=sub.outcome,
            partial_response=partial_response,
        )


@dataclass(frozen=True, slots=True)
class Recovery:
    """`classify`'s answer.

    Attributes:
        action: What recovery does.
        reason: Why, in words (also the decision's recorded reason).
        events: For `RecoveryAction.DECIDE`: the events to append in one batch, in order — reconciled results
            (`ToolCallSettled`), calls in doubt (`ToolCallUnknown`), then the `RecoveryDecision`.
        reconcile: For `RecoveryAction.RECONCILE_FIRST`: the calls whose reconcilers must answer first.
        settle: The outcome the submission settles with next: after a ``terminalize`` decision, or for
            `RecoveryAction.SETTLE_RESERVED` (None when the state reserved none: the caller settles ``failed``).
    """

    action: RecoveryAction
    reason: str
    events: tuple[LogEvent, ...] = ()
    reconcile: tuple[str, ...] = ()
    settle: SettlementOutcome | None = None

    @property
    def decision(self) -> RecoveryDecision | None:
        """The recorded decision, for `RecoveryAction.DECIDE`."""
        last = self.events[-1] if self.events else None
        return last if isinstance(last, RecoveryDecision) else None

    @property
    def kind(self) -> RecoveryDecisionKind | None:
        """The decision's kind (resume, safe retry, reconcile, terminalize, Unknown), for `RecoveryAction.DECIDE`."""
        decision = self.decision
        return None if decision is None else decision.decision


def _why_in_doubt(call: OpenCall) -> str:
    rec = call.reconciliation
    if rec is not None and rec.answer is ReconcileAnswer.UNKNOWN:
        detail = f": {rec.reason}" if rec.reason else ""
        return f"tool {call.tool!r} is not idempotent and its reconciler answered unknown{detail}"
    return f"tool {call.tool!r} is neither idempotent nor reconcilable: it may have run (DUR-009)"


def _decide(
    snap: RecoverySnapshot,
    kind: RecoveryDecisionKind,
    reason: str,
    call_ids: Iterable[str],
    facts: tuple[LogEvent, ...] = (),
    settle: SettlementOutcome | None = None,
) -> Recovery:
    decision = RecoveryDecision(
        submission_id=snap.submission_id,
        attempt_id=snap.attempt_id,
        decision=kind,
        reason=reason,
        call_ids=tuple(sorted(call_ids)),
    )
    return Recovery(RecoveryAction.DECIDE, reason, events=(*facts, decision), settle=settle)


def _classify_recovery(snap: RecoverySnapshot) -> Recovery:
    opened = snap.open_calls
    ask = tuple(c.call_id for c in opened if c.safety.reconcilable and c.reconciliation is None)
    if ask:
        return Recovery(
            RecoveryAction.RECONCILE_FIRST,
            f"calls {list(ask)} were prepared without a settlement;"
            " their reconcilers answer first (docs/semantics.md §10)",
            reconcile=ask,
        )
    recovered = [
        c for c in opened if c.reconciliation is not None and c.reconciliation.answer is ReconcileAnswer.RECOVERED
    ]
    never = [
        c for c in opened if c.reconciliation is not None and c.reconciliation.answer is ReconcileAnswer.NEVER_STARTED
    ]
    proven = {c.call_id for c in recovered} | {c.call_id for c in never}
    doubt = [c for c in opened if c.call_id not in proven and not c.safety.idempotent]
    facts: tuple[LogEvent, ...] = tuple(
        ToolCallSettled(
            submission_id=snap.submission_id,
            attempt_id=snap.attempt_id or "",
            call_id=c.call_id,
            result_json=c.reconciliation.result_json,
            result_digest=json_digest(c.reconciliation.result_json),
        )
        for c in recovered
        if c.reconciliation is not None and c.reconciliation.result_json is not None
    )
    if doubt or snap.unknown_calls:
        facts += tuple(
            ToolCallUnknown(submission_id=snap.submission_id, call_id=c.call_id, reason=_why_in_doubt(c)) for c in doubt
        )
        unknown = [*snap.unknown_calls, *(c.call_id for c in doubt)]
        reasons = [f"{c.call_id}: {_why_in_doubt(c)}" for c in doubt]
        reasons += [f"{cid}: already Unknown, waits for a signed resolution" for cid in snap.unknown_calls]
        return _decide(snap, RecoveryDecisionKind.UNKNOWN, "; ".join(reasons), unknown, facts)
    open_ids = [c.call_id for c in opened]
    if snap.abort_requested:
        reason = "an abort is recorded: the submission settles aborted (no rollback is claimed, docs/semantics.md §13)"
        return _decide(snap, RecoveryDecisionKind.TERMINALIZE, reason, open_ids, facts, SettlementOutcome.ABORTED)
    if snap.attempt_count >= snap.max_attempts:
        reason = (
            f"{snap.attempt_count} attempts ended without a settlement (max_attempts {snap.max_attempts}; "
            "docs/design.md §5, docs/semantics.md §16)"
        )
        return _decide(snap, RecoveryDecisionKind.TERMINALIZE, reason, open_ids, facts, SettlementOutcome.FAILED)
    if recovered:
        parts = [f"{c.call_id}: result recovered by the reconciler of {c.tool!r}" for c in recovered]
        parts += [f"{c.call_id}: never started, proven by the reconciler of {c.tool!r}" for c in never]
        parts += [f"{c.call_id}: idempotent tool {c.tool!r}" for c in opened if c.call_id not in proven]
        return _decide(snap, RecoveryDecisionKind.RECONCILE, "; ".join(parts), open_ids, facts)
    if opened:
        parts = [f"{c.call_id}: never started, proven by the reconciler of {c.tool!r}" for c in never]
        parts += [
            f"{c.call_id}: idempotent tool {c.tool!r}, repeated under its idempotency key"
            for c in opened
            if c.call_id not in proven
        ]
        return _decide(snap, RecoveryDecisionKind.SAFE_RETRY, "; ".join(parts), open_ids)
    if not snap.input_applied:
        reason = (
            "no effect is in doubt; the input is not applied yet: the next attempt applies it (docs/semantics.md §15)"
        )
    elif snap.partial_response:
        reason = (
            "a response stream was cut mid-way: its deltas stay as audit;"
            " it is retried as a new response (docs/semantics.md §9)"
        )
    else:
        reason = "no effect is in doubt: the next attempt replays the record and continues from its last boundary"
    return _decide(snap, RecoveryDecisionKind.RESUME, reason, ())


def _why_waiting(snap: RecoverySnapshot) -> str:
    """Say what a suspended run waits for: the deliveries of its open waits, by kind."""
    parts = []
    if snap.unknown_calls:
        calls = list(snap.unknown_calls)
        parts.append(f"calls {calls} are Unknown: the run waits for a signed ResolveUnknown (DUR-009)")
    if snap.waits:
        parts.append(f"waits {list(snap.waits)} are open: the run waits for their delivery or expiry (issue 16)")
    return "; ".join(parts) or "the run waits for the delivery of its waits (issue 16)"


def classify(snap: RecoverySnapshot) -> Recovery:
    """Classify a submission's last durable boundary (docs/semantics.md §14 step 5, §15; DUR-013).

    See the module docstring for the rules.

    Args:
        snap: The submission's persisted facts.

    Returns:
        What recovery does; for a submission in Recovery, the events to append before acting on the decision.
    """
    state = snap.state
    if state is None or state is S.PROPOSED:
        return Recovery(
            RecoveryAction.NOTHING, "nothing was accepted: the client retries with the same key (docs/semantics.md §15)"
        )
    if state in TERMINAL_STATES:
        outcome = snap.outcome.value if snap.outcome is not None else state.value
        return Recovery(
            RecoveryAction.NOTHING, f"settled {outcome}: the recorded settlement is the answer (docs/semantics.md §12)"
        )
    if state is S.ADMITTED:
        return Recovery(
            RecoveryAction.MATERIALIZE, "admitted, not ready: recovery materializes it (docs/semantics.md §4, §15)"
        )
    if state in (S.READY, S.JOINING):
        if snap.attempt_count == 0:
            reason = "ready, never started: a retry with the same key returns the same receipt; the scheduler starts it"
        else:
            reason = f"ready after {snap.attempt_count} attempt(s): the scheduler starts the next one"
        return Recovery(RecoveryAction.SCHEDULE, reason)
    if state in (S.RUNNING, S.JOINED):
        return Recovery(RecoveryAction.WAIT, "an attempt runs under the current owner")
    if state in WAITING_STATES:
        return Recovery(RecoveryAction.WAIT, _why_waiting(snap))
    if state is S.TERMINALIZING:
        settle = snap.reserved_outcome
        if snap.abort_requested:
            settle = SettlementOutcome.ABORTED
        return Recovery(
            RecoveryAction.SETTLE_RESERVED,
            "the settlement obligation is fixed: append it (docs/semantics.md §12)",
            settle=settle,
        )
    return _classify_recovery(snap)
