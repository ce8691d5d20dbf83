"""The generic wait (issue 16): what a run waits for, and the decisions that end a wait. Pure.

A run asks to wait by appending `WaitRequested` records as its last records (a signal by name, an approval): the
fold takes it Running → Waiting, where it holds its conversation's lane (later submissions queue behind it) but no
worker slot, and survives every restart (the request is canonical). The owner ends a wait with one canonical
`WaitResolved` — a delivery, or an expiry at the wait's deadline — and once every wait of the run is decided the fold
takes it Waiting → Ready; the next attempt replays up to its waits and reads their outcomes from its journal. The
attempt that ended by waiting is not charged to ``max_attempts`` (`settled.protocol.Submission.charged_attempts`).

Deadlines are absolute instants stored with the request and never recomputed: `expired_waits` compares them with
the clock reading the caller passes (the worker's clock, offset in tests), so a wait expires once, at or after its
instant, whichever owner reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from settled.protocol._decide import Decision
from settled.protocol._errors import IllegalTransitionError, UnknownSubmissionError
from settled.protocol._fold import ConversationState
from settled.protocol._states import WAITING_STATES, SubmissionState
from settled.schemas import (
    LogEvent,
    SignalReceived,
    WaitKind,
    WaitOutcome,
    WaitRequested,
    WaitResolved,
    canonicalize_json_text,
)

__all__ = ["deliveries", "expired_waits", "open_waits", "resolve_wait", "wait_id_for"]


def wait_id_for(run_id: str, ordinal: int) -> str:
    """Return the id of the wait at a callsite ordinal of a run: the same on every attempt.

    Args:
        run_id: The run id (the submission id for agent runs).
        ordinal: The callsite ordinal.

    Returns:
        ``<run_id>#w<ordinal>``.
    """
    return f"{run_id}#w{ordinal}"


def open_waits(state: ConversationState, submission_id: str, requests: Iterable[WaitRequested]) -> list[WaitRequested]:
    """Return the requests of a submission's waits that are still open, in the order given (log order).

    Args:
        state: The conversation's state.
        submission_id: The submission.
        requests: Its `WaitRequested` records (e.g. from its journal).

    Returns:
        Those whose wait is open in ``state`` (none unless the submission is Waiting).
    """
    sub = state.submission(submission_id)
    if sub is None or sub.state not in WAITING_STATES:
        return []
    seen: set[str] = set()
    found: list[WaitRequested] = []
    for request in requests:
        if request.submission_id == submission_id and request.wait_id in sub.waits and request.wait_id not in seen:
            seen.add(request.wait_id)
            found.append(request)
    return found


def deliveries(
    state: ConversationState, submission_id: str, journal: Sequence[LogEvent]
) -> list[tuple[WaitRequested, SignalReceived]]:
    """Pair a waiting run's open signal waits with the signals that deliver them (issue 16).

    The rule, deterministic from the log: per name, the run's signal waits in ordinal order take that name's
    signals in log order, each signal once. A signal is consumed when a `WaitResolved` names it as its source; a
    repeated signal id counts once. A signal that arrived before the run reached its wait is delivered once the wait
    is requested; one that arrived while no worker ran, once an owner reads the log.

    Args:
        state: The conversation's state.
        submission_id: The run's submission.
        journal: Its committed records in log order (`WaitRequested`, `WaitResolved` and `SignalReceived` are read).

    Returns:
        (open wait, signal delivering it) pairs; empty unless the run is Waiting on a signal with one available.
    """
    requests = [e for e in journal if isinstance(e, WaitRequested) and e.kind is WaitKind.SIGNAL]
    waiting = sorted(open_waits(state, submission_id, requests), key=lambda r: r.ordinal)
    if not waiting:
        return []
    consumed = {e.source_id for e in journal if isinstance(e, WaitResolved) and e.source_id is not None}
    available: dict[str, list[SignalReceived]] = {}
    seen: set[str] = set()
    for e in journal:
        if isinstance(e, SignalReceived) and e.submission_id == submission_id and e.command_id not in seen:
            seen.add(e.command_id)
            if e.command_id not in consumed:
                available.setdefault(e.name, []).append(e)
    pairs: list[tuple[WaitRequested, SignalReceived]] = []
    for request in waiting:
        queue = available.get(request.name)
        if queue:
            pairs.append((request, queue.pop(0)))
    return pairs


def expired_waits(requests: Iterable[WaitRequested], now: datetime) -> list[WaitRequested]:
    """Return the requests whose deadline has passed at ``now`` (a deadline equal to ``now`` has passed).

    Args:
        requests: Open waits' requests (`open_waits`).
        now: The clock reading (aware).

    Returns:
        The expired ones, in the order given.
    """
    return [r for r in requests if r.deadline is not None and r.deadline <= now]


def resolve_wait(
    state: ConversationState,
    submission_id: str,
    wait_id: str,
    outcome: WaitOutcome,
    now: datetime,
    *,
    source_id: str | None = None,
    payload_json: str | None = None,
) -> Decision:
    """Decide one open wait: a delivery (with its source and payload) or an expiry.

    Args:
        state: The conversation's scratch state.
        submission_id: The waiting submission.
        wait_id: The wait.
        outcome: Delivered or expired.
        now: When the owner decides it.
        source_id: What delivered it (a signal id, an approval command id); None for an expiry.
        payload_json: The delivered payload as JSON text (canonicalized here), or None.

    Returns:
        The decision: one `WaitResolved`.

    Raises:
        UnknownSubmissionError: The conversation holds no such submission.
        IllegalTransitionError: The submission is not Waiting, or the wait is not open.
        CanonicalJsonError: ``payload_json`` is not JSON.
    """
    sub = state.submission(submission_id)
    if sub is None:
        raise UnknownSubmissionError(state.conversation_id, submission_id)
    kind = sub.suspended_on(wait_id)
    if kind is None or kind is WaitKind.UNKNOWN:
        why = (
            "a wait of kind unknown is delivered by a signed ResolveUnknown (protocol.resolve)"
            if kind is WaitKind.UNKNOWN
            else f"wait {wait_id!r} is not open (open: {sorted(sub.waits)})"
        )
        raise IllegalTransitionError(submission_id, sub.state, SubmissionState.READY, "WaitResolved", why)
    payload = None if payload_json is None else canonicalize_json_text(payload_json)
    event = WaitResolved(
        submission_id=submission_id,
        wait_id=wait_id,
        outcome=outcome,
        source_id=source_id,
        payload_json=payload,
        decided_at=now,
    )
    return Decision(events=(event,))
