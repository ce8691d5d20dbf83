"""The submission state machine as one table of edges (docs/semantics.md §3, §12, §13; docs/design.md §5).

`EDGES` is the whole machine. Every state change the fold (`settled.protocol.apply`) makes is one of these edges,
looked up with `find_edge`; anything else raises `IllegalTransitionError`. Each edge names the canonical event type(s)
that cause it and, where one event type causes several edges, the value of the event's discriminating field
(`cause_qualifier`: ``RecoveryDecision.decision``, ``UnknownResolved.kind``, ``Settlement.outcome``).

What the table adds to the spec's diagram, and why:

* **Unknown → Ready, twice** (docs/design.md §5): resolved with the call's outcome (the next attempt continues with
  it) and resolved as safe to retry (the call is prepared again); each after the resolution is recorded.
* **Ready → Terminalizing and Admitted → Terminalizing on an aborted settlement** (docs/semantics.md §13): "If the
  submission is accepted but inactive, it may settle as aborted without an execution attempt. An aborted, never-claimed
  queued submission settles immediately — without waiting to head its lane". The diagram draws no edge for it; these two
  carry it, and only for outcome ``aborted`` with an abort intent recorded.
* **Terminalizing is entered and left by one `Settlement`** when the run decides its own outcome (issue 5 item 5):
  the spec's reserve → canonical append → ledger finalize sequence spans separate stores; here the canonical
  `Settlement` and the ``settled.settlements`` record commit in one Kafka transaction, which is the whole boundary,
  so one `Settlement` event takes the path Running → Terminalizing → outcome (two edges, both in this table).
  Terminalizing is a resting state only after a recorded decision that fixes the obligation first
  (`RecoveryDecision` ``terminalize``, `UnknownResolved` ``outcome_for_submission``).
* **Running → Recovery** is caused by the new owner's `OwnershipClaimed` (the worker disappeared: its attempt is
  still running in the log), by `AttemptInterrupted` while a call is in doubt, and by `ToolCallUnknown` (a call in
  flight timed out; docs/design.md §5: "A tool timeout or an abort while a call is in flight goes Running → Recovery,
  and the classifier decides").
* **Running → Waiting → Ready** (issue 16): a run that asks to wait (`WaitRequested`: a signal by name, an
  approval) is suspended by that canonical record, holds its conversation's lane and no worker; it goes back to
  Ready once every wait it asked for is decided by a canonical `WaitResolved` (a delivery, or an expiry at the
  wait's deadline), and the next attempt replays up to the waits. No separate "suspended" record is written (spec
  §8). **Waiting → Terminalizing** on an aborted settlement: an abort ends the wait.
* **One wait, two labels** (issue 16 item 1): Unknown is the generic wait of kind `unknown` (`WaitKind.UNKNOWN`;
  its wait id is the call's id). Its request is the classifier's `RecoveryDecision` ``unknown`` after the calls'
  `ToolCallUnknown` marks, its delivery the signed `UnknownResolved`; the suspended state keeps the label
  `unknown` (`waiting_state`) so the spec's Recovery → Unknown → Ready / Terminalizing edges stay as drawn.
  `WAITING_STATES` is the one "suspended, holding its lane, no worker slot" state under both labels.
* **Ready → Waiting** (issue 22 item 4): a charged attempt (a death, an uncaught error) ended within the budget; the
  owner appends `SubmissionRetryScheduled` and its timed wait (`WaitRequested`, deadline = the wake-up) in one batch,
  so the backoff holds the lane and no worker, and the sweeper's expiry makes it Ready again.
* **Joining** (issue 22 item 2, docs/semantics.md §5, DUR-016): one `SubmissionsJoined` takes each submission it
  names Ready → Joining → Joined (two edges, one event, as a `Settlement` passes through Terminalizing): the record is
  the joined input made canonical, so Joining is never a resting state. A joined submission leaves Joined only by
  a `Settlement` naming its host (`Settlement.joined_to`), after the host's own, with the host's outcome.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from settled.schemas import (
    AttemptInterrupted,
    AttemptStarted,
    AvroRecord,
    OwnershipClaimed,
    RecoveryDecision,
    Settlement,
    SettlementOutcome,
    SubmissionAdmitted,
    SubmissionReady,
    SubmissionsJoined,
    ToolCallUnknown,
    UnknownResolved,
    WaitKind,
    WaitRequested,
    WaitResolved,
)

__all__ = [
    "EDGES",
    "NONTERMINAL_STATES",
    "TERMINAL_STATES",
    "WAITING_STATES",
    "Edge",
    "SubmissionState",
    "cause_qualifier",
    "edges_from",
    "find_edge",
    "outcome_state",
    "waiting_state",
]


class SubmissionState(enum.StrEnum):
    """A submission's state (docs/semantics.md §3)."""

    PROPOSED = "proposed"
    """Published to the inbox, not admitted. A submission the fold does not hold is in this state."""
    ADMITTED = "admitted"
    """Ledger admission is canonical (`SubmissionAdmitted`)."""
    READY = "ready"
    """Materialized and queued (`SubmissionReady`); also a run between attempts."""
    RUNNING = "running"
    """An attempt is running (`AttemptStarted`)."""
    JOINING = "joining"
    """Claimed by the active run of its conversation (docs/semantics.md §5; not produced by schema v1)."""
    JOINED = "joined"
    """Its canonical input is applied to the host run (docs/semantics.md §5; not produced by schema v1)."""
    TERMINALIZING = "terminalizing"
    """The settlement obligation is fixed; the canonical settlement is next (docs/semantics.md §12)."""
    RECOVERY = "recovery"
    """The attempt stopped without an explanation that allows continuing; the classifier decides (DUR-013)."""
    UNKNOWN = "unknown"
    """The generic wait of kind `unknown`, under its own label: a call is in doubt; the run waits for an authorized
    resolution, holds its lane and no worker (DUR-009; `waiting_state`)."""
    WAITING = "waiting"
    """The generic wait of kind signal or approval (`WaitRequested`); holds its lane but no worker (issue 16)."""
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"


S = SubmissionState

TERMINAL_STATES: frozenset[SubmissionState] = frozenset({S.COMPLETED, S.FAILED, S.ABORTED})
"""States with no outgoing edge (DUR-002: one terminal outcome)."""

NONTERMINAL_STATES: frozenset[SubmissionState] = frozenset(S) - TERMINAL_STATES
"""Every other state."""

WAITING_STATES: frozenset[SubmissionState] = frozenset({S.WAITING, S.UNKNOWN})
"""The generic wait (issue 16): the run is suspended on open waits, holds its conversation's lane and no worker
slot, and resumes only on a canonical delivery (or expiry) of its last open wait. `unknown` labels the wait of kind
`unknown`, `waiting` every other kind (`waiting_state`)."""

_WAITING_LABEL = {WaitKind.UNKNOWN: S.UNKNOWN, WaitKind.SIGNAL: S.WAITING, WaitKind.APPROVAL: S.WAITING}


def waiting_state(kind: WaitKind) -> SubmissionState:
    """Return the label of the waiting state a run suspended on a wait of ``kind`` is in.

    Args:
        kind: The wait's kind.

    Returns:
        `SubmissionState.UNKNOWN` for a call in doubt, `SubmissionState.WAITING` for a signal or an approval: one
        state (`WAITING_STATES`) under two labels, so the spec's Unknown edges keep their names.
    """
    return _WAITING_LABEL[kind]


_OUTCOME_STATE = {
    SettlementOutcome.COMPLETED: S.COMPLETED,
    SettlementOutcome.FAILED: S.FAILED,
    SettlementOutcome.ABORTED: S.ABORTED,
}


def outcome_state(outcome: SettlementOutcome) -> SubmissionState:
    """Return the terminal state of a settlement outcome.

    Args:
        outcome: Completed, failed or aborted.

    Returns:
        `SubmissionState.COMPLETED`, `FAILED` or `ABORTED`.
    """
    return _OUTCOME_STATE[outcome]


@dataclass(frozen=True, slots=True)
class Edge:
    """One edge of the submission state machine.

    Attributes:
        source: The state left.
        target: The state entered.
        causes: The canonical event types that take this edge.
        qualifiers: When not empty, the edge is taken only when `cause_qualifier` of the event is one of these.
        label: The spec's label of the edge (or the added edge's name).
        origin: Where the edge comes from: ``"docs/semantics.md §3"``, ``"docs/semantics.md §13"``,
            ``"docs/design.md §5"``.
    """

    source: SubmissionState
    target: SubmissionState
    causes: tuple[type[AvroRecord], ...]
    qualifiers: frozenset[str]
    label: str
    origin: str

    def admits(self, event: AvroRecord) -> bool:
        """Tell whether ``event`` takes this edge (its type is a cause and its qualifier fits).

        Args:
            event: A canonical event.

        Returns:
            True when the event is one of `causes` and, if `qualifiers` is not empty, its qualifier is in it.
        """
        if not isinstance(event, self.causes):
            return False
        return not self.qualifiers or cause_qualifier(event) in self.qualifiers

    def __str__(self) -> str:
        causes = ", ".join(cause.__name__ for cause in self.causes)
        when = f" [{', '.join(sorted(self.qualifiers))}]" if self.qualifiers else ""
        return f"{self.source.value} -> {self.target.value}: {self.label} ({causes}{when}; {self.origin})"


def cause_qualifier(event: AvroRecord) -> str | None:
    """Return the value of the field that selects among an event type's edges.

    Args:
        event: A canonical event.

    Returns:
        ``decision`` of a `RecoveryDecision`, ``kind`` of an `UnknownResolved`, ``outcome`` of a `Settlement`;
        None for every other event.
    """
    if isinstance(event, RecoveryDecision):
        return event.decision.value
    if isinstance(event, UnknownResolved):
        return event.kind.value
    if isinstance(event, Settlement):
        return event.outcome.value
    return None


def _e(
    source: SubmissionState,
    target: SubmissionState,
    causes: tuple[type[AvroRecord], ...],
    label: str,
    origin: str = "docs/semantics.md §3",
    qualifiers: tuple[str, ...] = (),
) -> Edge:
    return Edge(source, target, causes, frozenset(qualifiers), label, origin)


_C, _F, _A = SettlementOutcome.COMPLETED.value, SettlementOutcome.FAILED.value, SettlementOutcome.ABORTED.value

EDGES: tuple[Edge, ...] = (
    # -- docs/semantics.md §3 ------------------------------------------------------------------------------------------
    _e(S.PROPOSED, S.ADMITTED, (SubmissionAdmitted,), "ledger commit"),
    _e(S.ADMITTED, S.READY, (SubmissionReady,), "conversation materialized"),
    _e(S.READY, S.RUNNING, (AttemptStarted,), "head claimed"),
    _e(S.READY, S.JOINING, (SubmissionsJoined,), "active run claims queued input", "docs/semantics.md §3, §5"),
    _e(S.JOINING, S.JOINED, (SubmissionsJoined,), "canonical input applied", "docs/semantics.md §3, §5"),
    _e(S.JOINED, S.COMPLETED, (Settlement,), "settles with host", "docs/semantics.md §3, §5", (_C,)),
    _e(S.JOINED, S.FAILED, (Settlement,), "settles with host", "docs/semantics.md §3, §5", (_F,)),
    _e(S.JOINED, S.ABORTED, (Settlement,), "settles with host", "docs/semantics.md §3, §5", (_A,)),
    _e(S.RUNNING, S.TERMINALIZING, (Settlement,), "settlement obligation acquired", "docs/semantics.md §3, §12"),
    _e(
        S.TERMINALIZING, S.COMPLETED, (Settlement,), "canonical settlement appended", "docs/semantics.md §3, §12", (_C,)
    ),
    _e(S.TERMINALIZING, S.FAILED, (Settlement,), "canonical settlement appended", "docs/semantics.md §3, §12", (_F,)),
    _e(S.TERMINALIZING, S.ABORTED, (Settlement,), "canonical settlement appended", "docs/semantics.md §3, §12", (_A,)),
    _e(S.RUNNING, S.READY, (AttemptInterrupted,), "ownership lost before unsafe effect"),
    _e(
        S.RUNNING,
        S.RECOVERY,
        (OwnershipClaimed, AttemptInterrupted, ToolCallUnknown),
        "worker disappears (or a call is in doubt)",
        "docs/semantics.md §3; docs/design.md §5",
    ),
    _e(
        S.RECOVERY,
        S.READY,
        (RecoveryDecision,),
        "provably safe retry",
        "docs/semantics.md §3, §14",
        ("resume", "safe_retry", "reconcile"),
    ),
    _e(
        S.RECOVERY,
        S.TERMINALIZING,
        (RecoveryDecision,),
        "deterministic failure/abort",
        "docs/semantics.md §3",
        ("terminalize",),
    ),
    _e(
        S.RECOVERY,
        S.UNKNOWN,
        (RecoveryDecision,),
        "unresolved ordinary side effect",
        "docs/semantics.md §3",
        ("unknown",),
    ),
    _e(
        S.UNKNOWN,
        S.TERMINALIZING,
        (UnknownResolved,),
        "operator or reconciler decides",
        "docs/semantics.md §3",
        ("outcome_for_submission",),
    ),
    # -- docs/design.md §5: the two resolutions that let the run continue --------------------------------------------
    _e(
        S.UNKNOWN,
        S.READY,
        (UnknownResolved,),
        "resolved with the call's outcome",
        "docs/design.md §5",
        ("call_outcome",),
    ),
    _e(S.UNKNOWN, S.READY, (UnknownResolved,), "resolved as safe to retry", "docs/design.md §5", ("safe_to_retry",)),
    # -- docs/semantics.md §13: an accepted but inactive submission settles aborted without an attempt -----------------
    _e(
        S.READY,
        S.TERMINALIZING,
        (Settlement,),
        "abort of an accepted, inactive submission",
        "docs/semantics.md §13",
        (_A,),
    ),
    _e(
        S.ADMITTED,
        S.TERMINALIZING,
        (Settlement,),
        "abort of an accepted, inactive submission",
        "docs/semantics.md §13",
        (_A,),
    ),
    # -- issue 16: the generic wait (signals, approvals) ---------------------------------------------------------
    _e(S.RUNNING, S.WAITING, (WaitRequested,), "the run waits (a canonical request)", "issue 16"),
    _e(S.WAITING, S.READY, (WaitResolved,), "every wait decided (a canonical delivery or expiry)", "issue 16"),
    _e(S.WAITING, S.TERMINALIZING, (Settlement,), "abort of a waiting run", "issue 16; docs/semantics.md §13", (_A,)),
    # -- issue 22 item 4: a retry's backoff is a timed wait of the owner's (after SubmissionRetryScheduled) ----------
    _e(S.READY, S.WAITING, (WaitRequested,), "a retry's backoff (the owner's timed wait)", "issue 22"),
)
"""Every edge of the submission state machine."""

_BY_SOURCE: dict[SubmissionState, tuple[Edge, ...]] = {
    state: tuple(edge for edge in EDGES if edge.source is state) for state in SubmissionState
}


def edges_from(state: SubmissionState) -> tuple[Edge, ...]:
    """Return the edges leaving a state.

    Args:
        state: The state.

    Returns:
        Its outgoing edges in table order (none for a terminal state).
    """
    return _BY_SOURCE[state]


def find_edge(source: SubmissionState, target: SubmissionState, event: AvroRecord) -> Edge | None:
    """Return the edge from ``source`` to ``target`` that ``event`` takes, if the table has one.

    Args:
        source: The state left.
        target: The state entered.
        event: The causing canonical event.

    Returns:
        The one matching edge, or None when the table has no such edge (the transition is illegal).
    """
    for edge in _BY_SOURCE[source]:
        if edge.target is target and edge.admits(event):
            return edge
    return None
