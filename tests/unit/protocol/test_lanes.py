"""Lane policies in the pure core (issue 22 item 1): the lane recorded on the opening admission, and its fold."""

from __future__ import annotations

import pytest

from settled.protocol import ConversationState, LanePolicy, admit, fold
from settled.schemas import LogBatch, SubmissionAdmitted

from ._sim import T0, Log, proposal


def _conv(log: Log, cid: str = "c1") -> ConversationState:
    return log.state.conversation(cid)


def _admitted(log: Log) -> list[SubmissionAdmitted]:
    return [e for b in log.batches for e in b.events if isinstance(e, SubmissionAdmitted)]


def _opened(lane: LanePolicy | None, default_lane: LanePolicy) -> Log:
    log = Log()
    log.claim()
    first = proposal("s1", "k1").model_copy(update={"lane": lane})
    log.commit("c1", admit(_conv(log), first, log.ref(), T0, default_lane=default_lane))
    return log


def test_a_conversation_opened_before_lanes_existed_folds_to_queue() -> None:
    assert ConversationState(conversation_id="c1").lane is LanePolicy.QUEUE
    log = Log()
    log.claim()
    log.commit("c1", admit(_conv(log), proposal("s1", "k1"), log.ref(), T0))
    assert _admitted(log)[0].lane is LanePolicy.QUEUE
    assert _conv(log).lane is LanePolicy.QUEUE


@pytest.mark.parametrize("lane", list(LanePolicy))
def test_the_opening_proposals_lane_is_recorded_on_its_admission_and_folded(lane: LanePolicy) -> None:
    log = _opened(lane, LanePolicy.QUEUE)
    assert _admitted(log)[0].lane is lane
    assert _conv(log).lane is lane


def test_without_a_proposed_lane_the_apps_default_is_recorded() -> None:
    log = _opened(None, LanePolicy.REJECT)
    assert _admitted(log)[0].lane is LanePolicy.REJECT
    assert _conv(log).lane is LanePolicy.REJECT


def test_a_later_submissions_lane_and_the_default_change_nothing() -> None:
    log = _opened(LanePolicy.KEEP_NEWEST, LanePolicy.QUEUE)
    later = proposal("s2", "k2").model_copy(update={"lane": LanePolicy.REJECT})
    log.commit("c1", admit(_conv(log), later, log.ref(), T0, default_lane=LanePolicy.INTERRUPT))
    assert [a.lane for a in _admitted(log)] == [LanePolicy.KEEP_NEWEST, None]
    assert _conv(log).lane is LanePolicy.KEEP_NEWEST


def test_replay_reads_the_lane_from_the_log_not_from_any_default() -> None:
    log = _opened(None, LanePolicy.INTERRUPT)
    log.commit("c1", admit(_conv(log), proposal("s2", "k2"), log.ref(), T0, default_lane=LanePolicy.QUEUE))
    replayed = fold(Log().state, [LogBatch.model_validate(b.model_dump()) for b in log.batches])
    assert replayed.conversation("c1").lane is LanePolicy.INTERRUPT
    assert replayed.conversation("c1") == _conv(log)


def test_lanes_are_per_conversation() -> None:
    log = _opened(LanePolicy.REJECT, LanePolicy.QUEUE)
    other = proposal("t1", "k1", conversation_id="c2")
    log.commit("c2", admit(_conv(log, "c2"), other, log.ref(), T0, default_lane=LanePolicy.KEEP_NEWEST))
    assert _conv(log, "c1").lane is LanePolicy.REJECT
    assert _conv(log, "c2").lane is LanePolicy.KEEP_NEWEST
