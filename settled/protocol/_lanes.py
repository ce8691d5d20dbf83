"""Lane policies (issue 22 item 1): what a new submission does to a busy conversation.

A conversation's lane is chosen once, by the submission that opens it: the proposal's ``lane``, else the app's
default (``App(lane=...)``, handed to `settled.protocol.admit` as ``default_lane``). That choice is recorded on the
opening `SubmissionAdmitted` (``lane``), so the fold (``ConversationState.lane``) and every later decision read it
from the log and never from the app's configuration: replay with another default gives the same state. A
conversation opened before lanes existed folds to `LanePolicy.QUEUE`; a canonical `LaneSet` (a `SetLane` decided
by `settled.protocol.set_lane`) changes it for the submissions decided after it.

What the lane does to a new submission is part of its admission decision (`settled.protocol.admit`), so it is
canonical in the same batch before it takes effect, and the three terminal outcomes stay the only ones:

* ``queue`` and ``join`` (joining is issue 22 item 2): admitted behind the others, FIFO.
* ``reject``: while the lane is held (`lane_busy`: any unsettled submission) the proposal is rejected ``busy``
  with a rejected receipt; it is never admitted (and not in the key index: the same key may be sent again later).
* ``interrupt``: admitted, and `lane_aborts` records an `AbortRecorded` (reason ``interrupted``) for every earlier
  unsettled submission: a running one is cancelled and settles aborted through the path a user abort takes (abort
  grace, an in-flight call in doubt becomes Unknown and holds the lane until resolved); a queued one settles
  aborted at once (`settled.protocol.schedule`'s ``SettleAborted``). The new one starts only after their aborted
  settlements are canonical: one active submission at a time (DUR-005), aborted inactive ones settled first.
* ``keep_newest``: admitted, and every queued submission not started settles aborted ``superseded`` the same way
  (its abort in the admission's batch, its settlement before anything starts); a running one finishes normally.

`check_lane_history` is a pure checker of these invariants over a conversation's canonical events (used by the
acceptance test, tests/integration/engine/test_engine_lanes.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from settled.protocol._fold import ConversationState
from settled.protocol._joining import check_joining
from settled.protocol._states import SubmissionState
from settled.schemas import (
    AbortRecorded,
    AttemptStarted,
    LanePolicy,
    LaneSet,
    LogEvent,
    Settlement,
    SettlementOutcome,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionRejected,
    SubmissionRejectReason,
)

__all__ = [
    "DEFAULT_LANE",
    "LANE_ABORT_PREFIX",
    "LANE_BUSY",
    "LANE_CHECKERS",
    "LANE_INTERRUPTED",
    "LANE_SUPERSEDED",
    "LaneHistory",
    "LanePolicy",
    "check_lane_history",
    "lane_aborts",
    "lane_busy",
    "opening_lane",
]

DEFAULT_LANE = LanePolicy.QUEUE
"""The lane of an app that names none, and of a conversation whose opening admission recorded none."""


def opening_lane(state: ConversationState, asked: LanePolicy | None, default_lane: LanePolicy) -> LanePolicy | None:
    """Return the lane an admission records: the effective lane when it opens the conversation, else None.

    Args:
        state: The conversation's state before the admission.
        asked: The proposal's ``lane`` (None: it asked for none).
        default_lane: The app's default lane (``App(lane=...)``).

    Returns:
        ``asked`` or else ``default_lane`` for the conversation's first submission; None for every later one (the
        conversation's lane is already recorded; a ``SetLane`` changes it).
    """
    if state.last_submission_seq != 0:
        return None
    return asked if asked is not None else default_lane


LANE_BUSY = "busy"
"""The reason code of a submission rejected by lane ``reject`` (`SubmissionRejectReason.BUSY`)."""

LANE_SUPERSEDED = "superseded"
"""The reason code of a queued submission that lane ``keep_newest`` aborted for a newer one."""

LANE_INTERRUPTED = "interrupted"
"""The reason code of an earlier submission that lane ``interrupt`` aborted for a newer one."""

LANE_ABORT_PREFIX = "settled.lane/"
"""How the command id of a lane's `AbortRecorded` starts: ``settled.lane/<newer submission>/<aborted submission>``."""

_S = SubmissionState
_NOT_STARTED = frozenset({_S.ADMITTED, _S.READY})


def lane_busy(state: ConversationState) -> str | None:
    """Return why lane ``reject`` refuses a new submission now, or None.

    Args:
        state: The conversation's state before the proposal is decided.

    Returns:
        ``None`` unless the lane is ``reject`` and held (an unsettled submission: active, waiting or queued); then
        the rejection's detail, naming the submission that holds it.
    """
    if state.lane is not LanePolicy.REJECT or not state.queue:
        return None
    holder = state.active_submission_id or state.queue[0]
    return (
        f"conversation {state.conversation_id!r} is busy: submission {holder!r} holds its lane "
        f"({len(state.queue)} unsettled; lane reject)"
    )


def _abort_command_id(state: ConversationState, newer_id: str, target_id: str) -> str:
    """A command id for a lane's abort that no command of the conversation applied yet (deterministic)."""
    base = f"{LANE_ABORT_PREFIX}{newer_id}/{target_id}"
    candidate, n = base, 1
    while candidate in state.applied_commands:
        n += 1
        candidate = f"{base}#{n}"
    return candidate


def lane_aborts(state: ConversationState, newer_id: str, principal: str) -> tuple[AbortRecorded, ...]:
    """Return the aborts the conversation's lane records with the admission of ``newer_id``.

    ``interrupt``: every unsettled earlier submission (running, waiting, queued) without an abort already recorded,
    unless another outcome is already reserved for it (it is settling that outcome). ``keep_newest``: every queued
    submission that never started (admitted or ready, no attempt) without an abort recorded. Any other lane: none.
    Each `AbortRecorded` names ``principal`` (who submitted the newer one) and a reason whose code is
    `LANE_INTERRUPTED` or `LANE_SUPERSEDED`; the aborted submission's settlement carries that reason.

    Args:
        state: The conversation's state before the admission.
        newer_id: The submission being admitted.
        principal: Its principal.

    Returns:
        The aborts, in submission-sequence order.
    """
    lane = state.lane
    if lane is LanePolicy.INTERRUPT:
        code = LANE_INTERRUPTED
        targets = [
            sid
            for sid in state.queue
            if not state.submissions[sid].abort_requested
            and state.submissions[sid].reserved_outcome in (None, SettlementOutcome.ABORTED)
        ]
    elif lane is LanePolicy.KEEP_NEWEST:
        code = LANE_SUPERSEDED
        targets = [
            sid
            for sid in state.queue
            if sid != state.active_submission_id
            and state.submissions[sid].state in _NOT_STARTED
            and state.submissions[sid].attempt_count == 0
            and not state.submissions[sid].abort_requested
        ]
    else:
        return ()
    return tuple(
        AbortRecorded(
            command_id=_abort_command_id(state, newer_id, sid),
            submission_id=sid,
            principal=principal,
            reason=f"{code}: by submission {newer_id!r} (lane {lane.value})",
        )
        for sid in targets
    )


# -- the checker of a conversation's history (issue 22 item 1 acceptance) -----------------------------------------


@dataclass
class LaneHistory:
    """What a conversation's canonical events say about its submissions, in log order (positions are indexes).

    Attributes:
        lane: The lane the conversation had at its first event (the opening admission's, else queue); a `LaneSet`
            in the history ends the policy's checks (what it checks is one lane's history).
        decided: Proposal id → how many decisions (admitted, rejected, duplicate) the log holds for it.
        admitted: Admitted submission ids in submission-sequence order.
        admitted_at: Submission id → position of its admission.
        rejected: Submission id → its rejection's reason.
        rejected_at: Submission id → position of its rejection.
        first_start: Submission id → position of its first `AttemptStarted`.
        settlements: Submission id → every `Settlement` of it, with its position.
    """

    lane: LanePolicy = DEFAULT_LANE
    decided: dict[str, int] = field(default_factory=dict)
    admitted: list[str] = field(default_factory=list)
    admitted_at: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, SubmissionRejectReason] = field(default_factory=dict)
    rejected_at: dict[str, int] = field(default_factory=dict)
    first_start: dict[str, int] = field(default_factory=dict)
    settlements: dict[str, list[tuple[int, Settlement]]] = field(default_factory=dict)
    lane_changed_at: int | None = None

    @classmethod
    def of(cls, events: Iterable[LogEvent]) -> LaneHistory:
        """Read a conversation's events (every batch's, in log order).

        Args:
            events: The events.

        Returns:
            The history.
        """
        h = cls()
        for i, e in enumerate(events):
            if isinstance(e, SubmissionAdmitted):
                h.decided[e.submission_id] = h.decided.get(e.submission_id, 0) + 1
                h.admitted.append(e.submission_id)
                h.admitted_at[e.submission_id] = i
                if e.lane is not None and len(h.admitted) == 1:
                    h.lane = e.lane
            elif isinstance(e, SubmissionRejected | SubmissionDuplicate):
                h.decided[e.submission_id] = h.decided.get(e.submission_id, 0) + 1
                if isinstance(e, SubmissionRejected):
                    h.rejected[e.submission_id] = e.reason
                    h.rejected_at[e.submission_id] = i
            elif isinstance(e, AttemptStarted):
                h.first_start.setdefault(e.submission_id, i)
            elif isinstance(e, Settlement):
                h.settlements.setdefault(e.submission_id, []).append((i, e))
            elif isinstance(e, LaneSet) and h.lane_changed_at is None:
                h.lane_changed_at = i
        return h

    def settled_at(self, sid: str) -> int | None:
        """Position of a submission's (first) settlement, or None."""
        found = self.settlements.get(sid)
        return found[0][0] if found else None

    def outcome(self, sid: str) -> SettlementOutcome | None:
        """A submission's (first) outcome, or None."""
        found = self.settlements.get(sid)
        return found[0][1].outcome if found else None

    def reason_code(self, sid: str) -> str | None:
        """The code of a submission's settlement reason (``"superseded: ..."`` → ``superseded``), or None."""
        found = self.settlements.get(sid)
        reason = found[0][1].error_reason if found else None
        return None if reason is None else reason.split(":", 1)[0]

    def unsettled_at(self, sid: str, position: int) -> bool:
        """Whether ``sid`` was admitted before ``position`` and not settled before it."""
        settled = self.settled_at(sid)
        return self.admitted_at[sid] < position and (settled is None or settled > position)


def _common(h: LaneHistory, proposed: Sequence[str]) -> list[str]:
    """What every lane promises: each proposal decided once, each admitted one settled once, one active at a time."""
    out: list[str] = []
    for sid in proposed:
        n = h.decided.get(sid, 0)
        if n != 1:
            out.append(f"{sid}: {'lost: never decided' if n == 0 else f'decided {n} times'}")
    for sid in h.admitted:
        n = len(h.settlements.get(sid, []))
        if n != 1:
            out.append(f"{sid}: {'never settled' if n == 0 else f'settled {n} times'}")
    for sid in h.settlements:
        if sid not in h.admitted_at:
            out.append(f"{sid}: settled but never admitted")
    never = 1 << 62  # an unsettled submission holds the lane to the end of the history
    intervals: list[tuple[int, int, str]] = []
    for sid, start in h.first_start.items():
        end = h.settled_at(sid)
        intervals.append((start, never if end is None else end, sid))
    intervals.sort()
    for (_, end_a, a), (start_b, _, b) in itertools.pairwise(intervals):
        if start_b < end_a:
            out.append(f"two active: {b} started while {a} was unsettled")
    return out


def _check_queue(h: LaneHistory) -> list[str]:
    out = [
        f"{sid}: {h.outcome(sid)} under queue"
        for sid in h.admitted
        if h.outcome(sid) is not SettlementOutcome.COMPLETED
    ]
    started = sorted(h.first_start, key=h.first_start.__getitem__)
    if started != [sid for sid in h.admitted if sid in h.first_start]:
        out.append(f"started out of sequence order: {started}")
    return out


def _check_reject(h: LaneHistory) -> list[str]:
    out = [
        f"{sid}: {h.outcome(sid)} under reject"
        for sid in h.admitted
        if h.outcome(sid) is not SettlementOutcome.COMPLETED
    ]
    for j, later in enumerate(h.admitted):
        held = [earlier for earlier in h.admitted[:j] if h.unsettled_at(earlier, h.admitted_at[later])]
        if held:
            out.append(f"{later}: admitted while {held[0]} held the lane")
    for sid, reason in h.rejected.items():
        if reason is not SubmissionRejectReason.BUSY:
            out.append(f"{sid}: rejected {reason.value}, not busy")
        elif not any(h.unsettled_at(other, h.rejected_at[sid]) for other in h.admitted):
            out.append(f"{sid}: rejected busy while no submission held the lane")
    return out


def _check_interrupt(h: LaneHistory) -> list[str]:
    out: list[str] = []
    for j, later in enumerate(h.admitted):
        for earlier in h.admitted[:j]:
            if not h.unsettled_at(earlier, h.admitted_at[later]):
                continue
            if h.outcome(earlier) is not SettlementOutcome.ABORTED or h.reason_code(earlier) != LANE_INTERRUPTED:
                out.append(
                    f"{earlier}: unsettled when {later} was admitted, settled {h.outcome(earlier)} "
                    f"({h.reason_code(earlier)}), not aborted {LANE_INTERRUPTED}"
                )
            start = h.first_start.get(later)
            settled = h.settled_at(earlier)
            if start is not None and (settled is None or settled > start):
                out.append(f"{later} started before {earlier}'s aborted settlement")
    if h.admitted and h.outcome(h.admitted[-1]) is not SettlementOutcome.COMPLETED:
        out.append(f"the last, {h.admitted[-1]}, settled {h.outcome(h.admitted[-1])}, not completed")
    return out


def _check_keep_newest(h: LaneHistory) -> list[str]:
    out: list[str] = []
    for j, later in enumerate(h.admitted):
        for earlier in h.admitted[:j]:
            if not h.unsettled_at(earlier, h.admitted_at[later]):
                continue
            started = h.first_start.get(earlier)
            if started is not None and started < h.admitted_at[later]:
                if h.outcome(earlier) is not SettlementOutcome.COMPLETED:
                    out.append(
                        f"{earlier}: running when {later} was admitted, settled {h.outcome(earlier)}: "
                        "a running one finishes normally"
                    )
                continue
            if h.outcome(earlier) is not SettlementOutcome.ABORTED or h.reason_code(earlier) != LANE_SUPERSEDED:
                out.append(
                    f"{earlier}: queued when {later} was admitted, settled {h.outcome(earlier)} "
                    f"({h.reason_code(earlier)}), not aborted {LANE_SUPERSEDED}"
                )
            start = h.first_start.get(later)
            settled = h.settled_at(earlier)
            if start is not None and (settled is None or settled > start):
                out.append(f"{later} started before the superseded {earlier} settled")
    if h.admitted and h.outcome(h.admitted[-1]) is not SettlementOutcome.COMPLETED:
        out.append(f"the last, {h.admitted[-1]}, settled {h.outcome(h.admitted[-1])}, not completed")
    return out


LANE_CHECKERS: Mapping[LanePolicy, Callable[[LaneHistory], list[str]]] = {
    LanePolicy.QUEUE: _check_queue,
    LanePolicy.JOIN: _check_queue,  # the turns not joined run as under queue; joining's own: `check_joining`
    LanePolicy.REJECT: _check_reject,
    LanePolicy.INTERRUPT: _check_interrupt,
    LanePolicy.KEEP_NEWEST: _check_keep_newest,
}
"""Each lane's own invariants over a `LaneHistory` (``join`` adds `settled.protocol.check_joining` over the events)."""


def check_lane_history(events: Iterable[LogEvent], proposed: Sequence[str] = ()) -> list[str]:
    """Check a conversation's canonical events against its lane policy; return the violations (none: it holds).

    Every lane: each proposal in ``proposed`` decided exactly once (admitted, rejected or duplicate: none lost or
    doubled), each admitted submission settled exactly once, never two submissions active at once (from a first
    `AttemptStarted` to the `Settlement`). Then the lane's own (`LANE_CHECKERS`): ``queue``: all complete, started
    in sequence order; ``reject``: each admitted one completes and was admitted while no other was unsettled,
    each rejected one is rejected ``busy`` while an admitted one was unsettled; ``interrupt``: each earlier
    submission unsettled at a later one's admission settles aborted ``interrupted`` before that later one starts,
    and the last completes; ``keep_newest``: each one queued
    and not started at a later one's admission settles aborted ``superseded`` before that later one starts, one
    running then completes, and the last completes; ``join``: as ``queue`` (a joined submission never starts and
    completes with its host), and joining's own promises (`settled.protocol.check_joining`: each joined one joined
    once, never started, settled once right after its host, with its outcome). The lane is the opening admission's;
    the history must hold no `LaneSet` (a violation otherwise: it checks one lane's history).

    Args:
        events: The conversation's events, every batch's, in log order.
        proposed: The submission ids proposed to it (each must be decided exactly once).

    Returns:
        Human-readable violations, empty when the history keeps the lane's promises.
    """
    events = list(events)
    h = LaneHistory.of(events)
    out = _common(h, proposed)
    if h.lane_changed_at is not None:
        out.append(f"the lane changed at event {h.lane_changed_at}: one lane's history is checked")
    joining = check_joining(events) if h.lane is LanePolicy.JOIN else []  # issue 22 item 2
    return out + LANE_CHECKERS[h.lane](h) + joining
