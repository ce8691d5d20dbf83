"""Joining in the pure core (issue 22 item 2, DUR-016): the `join` decision, its fold and the group's settlement."""

from __future__ import annotations

import pytest

from settled.protocol import (
    ConversationState,
    IllegalTransitionError,
    LanePolicy,
    LogInconsistencyError,
    Submission,
    SubmissionState,
    abort,
    admit,
    check_joining,
    check_lane_history,
    interrupt,
    join,
    joinable_prefix,
    joined_submissions,
    schedule,
    start_attempt,
    terminalize,
)
from settled.schemas import (
    AttemptStarted,
    Settlement,
    SettlementOutcome,
    SubmissionAdmitted,
    SubmissionsJoined,
)

from ._sim import T0, Log, abort_cmd, proposal

S = SubmissionState


def _log(*submissions: str, lane: LanePolicy = LanePolicy.JOIN) -> Log:
    """A conversation opened in ``lane`` with these submissions admitted and ready, the first one running."""
    log = Log()
    log.claim()
    for n, sid in enumerate(submissions, 1):
        log.commit(
            "c1", admit(_conv(log), proposal(sid, f"k{n}", value=f"input {sid}"), log.ref(), T0, default_lane=lane)
        )
    log.commit("c1", start_attempt(_conv(log), submissions[0], "a1", log.epoch))
    return log


def _conv(log: Log) -> ConversationState:
    return log.state.conversation("c1")


def _sub(log: Log, sid: str) -> Submission:
    sub = _conv(log).submission(sid)
    assert sub is not None
    return sub


def _join(log: Log, host: str, attempt_id: str, ordinal: int) -> SubmissionsJoined:
    d = join(_conv(log), host, attempt_id, ordinal)
    assert d is not None
    log.commit("c1", d)
    joined = d.events[0]
    assert isinstance(joined, SubmissionsJoined)
    return joined


def _journal(log: Log) -> list[object]:
    return [e for b in log.batches if b.conversation_id == "c1" for e in b.events]


def test_a_running_run_joins_the_ready_prefix_once_and_each_settles_with_it() -> None:
    log = _log("A", "B", "D")
    d = join(_conv(log), "A", "a1", 2)
    assert d is not None and d.receipt is None and d.settlement is None
    assert d.events == (
        SubmissionsJoined(submission_id="A", attempt_id="a1", response_ordinal=2, joined_ids=("B", "D")),
    )
    trace = log.commit("c1", d)
    assert [(t.submission_id, t.edge.source, t.edge.target) for t in trace] == [
        ("B", S.READY, S.JOINING),
        ("B", S.JOINING, S.JOINED),
        ("D", S.READY, S.JOINING),
        ("D", S.JOINING, S.JOINED),
    ]
    assert (_sub(log, "B").joined_to, _sub(log, "D").joined_to, _sub(log, "A").joined) == ("A", "A", ("B", "D"))
    assert join(_conv(log), "A", "a1", 3) is None  # nothing more is queued: joined once
    assert schedule(_conv(log)) is None  # a joined submission never starts as its own attempt

    done = terminalize(_conv(log), "A", SettlementOutcome.COMPLETED, T0, reply_json='"hi"')
    assert [(type(e), e.submission_id, getattr(e, "joined_to", None)) for e in done.events] == [
        (Settlement, "A", None),
        (Settlement, "B", "A"),
        (Settlement, "D", "A"),
    ]
    assert done.settlement is not None and done.settlement.submission_id == "A"
    assert [(r.submission_id, r.joined_to, r.outcome, r.reply_json) for r in done.joined_settlements] == [
        ("B", "A", SettlementOutcome.COMPLETED, '"hi"'),
        ("D", "A", SettlementOutcome.COMPLETED, '"hi"'),
    ]
    log.commit("c1", done)
    assert [_sub(log, s).state for s in "ABD"] == [S.COMPLETED] * 3
    assert _conv(log).queue == () and _conv(log).active_submission_id is None
    assert [r.submission_id for r in log.settlements] == ["A", "B", "D"]  # each once
    assert joined_submissions(_journal(log), "A") == ["B", "D"]
    assert check_joining(_journal(log)) == []


def test_only_a_join_lane_joins() -> None:
    for lane in (LanePolicy.QUEUE, LanePolicy.REJECT):
        log = _log("A", "B", lane=lane)
        assert join(_conv(log), "A", "a1", 0) is None


def test_an_aborted_and_settled_queued_submission_is_no_gap_an_admitted_not_ready_one_ends_the_prefix() -> None:
    log = _log("A", "B", "D")
    log.commit("c1", abort(_conv(log), abort_cmd("x1", "B"), log.ref(), T0))
    assert _sub(log, "B").state is S.ABORTED
    admitted = admit(_conv(log), proposal("E", "k4"), log.ref(), T0).events
    log.append("c1", [e for e in admitted if isinstance(e, SubmissionAdmitted)])  # admitted, not yet ready
    log.commit("c1", admit(_conv(log), proposal("F", "k5"), log.ref(), T0))
    assert joinable_prefix(_conv(log).queue, _conv(log).submissions, "A") == ["D"]
    d = join(_conv(log), "A", "a1", 1)
    assert d is not None and d.events[0] == SubmissionsJoined(
        submission_id="A", attempt_id="a1", response_ordinal=1, joined_ids=("D",)
    )
    log.commit("c1", d)
    assert (_sub(log, "E").state, _sub(log, "F").state) == (S.ADMITTED, S.READY)


def test_the_next_attempt_keeps_what_it_joined_and_joins_only_what_came_since() -> None:
    log = _log("A", "B")
    _join(log, "A", "a1", 0)
    log.commit("c1", interrupt(_conv(log), "A", "graceful_revoke"))
    log.commit("c1", admit(_conv(log), proposal("D", "k3"), log.ref(), T0))
    assert _sub(log, "B").state is S.JOINED  # still joined while its host is between attempts
    log.commit("c1", start_attempt(_conv(log), "A", "a2", log.epoch))
    with pytest.raises(IllegalTransitionError):
        join(_conv(log), "A", "a1", 1)  # the old attempt joins nothing more
    assert _join(log, "A", "a2", 1).joined_ids == ("D",)
    assert _sub(log, "A").joined == ("B", "D")


def test_the_fold_refuses_a_joined_submission_settled_or_started_on_its_own() -> None:
    log = _log("A", "B", "D")
    _join(log, "A", "a1", 0)
    alone = Settlement(
        submission_id="B", outcome=SettlementOutcome.COMPLETED, attempt_count=0, settled_at=T0, joined_to="A"
    )
    with pytest.raises(IllegalTransitionError, match="settles only with its host"):
        log.append("c1", [alone])
    with pytest.raises(LogInconsistencyError, match="joined_to"):
        log.append("c1", [alone.model_copy(update={"joined_to": None})])
    with pytest.raises(IllegalTransitionError, match="settles only with its host"):
        terminalize(_conv(log), "B", SettlementOutcome.COMPLETED, T0)
    host_only = terminalize(_conv(log), "A", SettlementOutcome.COMPLETED, T0).events[:1]
    with pytest.raises(IllegalTransitionError, match="settles only with its host"):
        # its host settled failed: a joined submission takes the host's outcome, no other
        log.append("c1", [host_only[0].model_copy(update={"outcome": SettlementOutcome.FAILED}), alone])
    log.append("c1", host_only)  # the host settles alone (its joined ones stay joined) ...
    with pytest.raises(IllegalTransitionError, match="in the same batch"):
        log.append("c1", [alone])  # ... and they can never settle apart from it, in a later batch
    with pytest.raises(IllegalTransitionError, match="joined into run 'A'"):
        log.append("c1", [AttemptStarted(submission_id="B", attempt=1, attempt_id="b1", owner_epoch=log.epoch)])


def test_the_fold_refuses_a_join_that_is_not_the_ready_prefix() -> None:
    log = _log("A", "B", "D")
    for ids in (("D",), ("B", "D", "B"), ()):
        with pytest.raises(LogInconsistencyError, match="joined_ids"):
            log.append(
                "c1", [SubmissionsJoined(submission_id="A", attempt_id="a1", response_ordinal=0, joined_ids=ids)]
            )
    with pytest.raises(LogInconsistencyError, match="attempt_id"):
        log.append(
            "c1", [SubmissionsJoined(submission_id="A", attempt_id="old", response_ordinal=0, joined_ids=("B",))]
        )


def test_an_abort_of_a_joined_submission_aborts_the_group() -> None:
    log = _log("A", "B")
    _join(log, "A", "a1", 0)
    aborted = abort(_conv(log), abort_cmd("x1", "B", reason="not needed"), log.ref(), T0)
    assert [type(e).__name__ for e in aborted.events] == ["AbortRecorded"]  # B is active through its host
    log.commit("c1", aborted)
    done = terminalize(_conv(log), "A", SettlementOutcome.COMPLETED, T0, reply_json='"hi"')
    log.commit("c1", done)
    assert [(_sub(log, s).state, _sub(log, s).outcome) for s in "AB"] == [(S.ABORTED, SettlementOutcome.ABORTED)] * 2
    assert [r.error_reason for r in log.settlements] == ["not needed", "not needed"]


def test_a_host_aborted_between_attempts_settles_with_what_it_joined() -> None:
    log = _log("A", "B")
    _join(log, "A", "a1", 0)
    log.commit("c1", interrupt(_conv(log), "A", "graceful_revoke"))
    log.commit("c1", abort(_conv(log), abort_cmd("x1", "A"), log.ref(), T0))
    assert [_sub(log, s).state for s in "AB"] == [S.ABORTED, S.ABORTED]
    assert [(r.submission_id, r.joined_to) for r in log.settlements] == [("A", None), ("B", "A")]


def test_the_checker_names_each_broken_promise_of_joining() -> None:
    log = _log("A", "B", "D")
    _join(log, "A", "a1", 0)
    log.commit("c1", terminalize(_conv(log), "A", SettlementOutcome.COMPLETED, T0))
    log.commit("c1", admit(_conv(log), proposal("E", "k4"), log.ref(), T0))
    events = _journal(log)
    assert check_joining(events) == []
    # The host settles alone, the log goes on, and the joined ones settle later (a log the fold refuses, read as is).
    host, b, d, *admitted = events[-5:]
    apart = [*events[:-5], host, *admitted, b, d]
    assert check_joining(apart) == [
        "B: not settled with its host A: other records between their settlements",
        "D: not settled with its host A: other records between their settlements",
    ]
    # The lane checker of a join lane runs it: a queue's promises for the rest, joining's for the joined ones.
    assert check_lane_history(events[:-2], ["A", "B", "D"]) == []  # before E's admission
    assert set(check_joining(apart)) <= set(check_lane_history(apart))
    at = next(i for i, e in enumerate(events) if isinstance(e, SubmissionsJoined))
    twice = [*events[: at + 1], events[at].model_copy(update={"joined_ids": ("D",)}), *events[at + 1 :]]
    assert "D: joined twice (into A and A)" in check_joining(twice)
    started = [*events, AttemptStarted(submission_id="B", attempt=1, attempt_id="b1", owner_epoch=1)]
    assert "B: joined into A and started as its own attempt" in check_joining(started)
    unsettled = [e for e in events if not (isinstance(e, Settlement) and e.submission_id == "D")]
    assert check_joining(unsettled)[-1] == "D: joined into A, settled 0 times"
