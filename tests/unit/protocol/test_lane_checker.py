"""The pure checker of a conversation's lane history (issue 22 item 1), on hand-made histories.

Each lane's good history passes; each violating one (lost, doubled, two active, out of order, an abort after the
newer one started, a wrong reason, a running one superseded, a rejection while idle) is named.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from settled.protocol import LANE_CHECKERS, LanePolicy, check_lane_history
from settled.schemas import (
    AbortRecorded,
    AttemptStarted,
    LaneSet,
    LogEvent,
    Settlement,
    SettlementOutcome,
    SubmissionAdmitted,
    SubmissionRejected,
    SubmissionRejectReason,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DONE, ABORTED = SettlementOutcome.COMPLETED, SettlementOutcome.ABORTED


class H:
    """A hand-made history of conversation c1."""

    def __init__(self, lane: LanePolicy) -> None:
        self.lane = lane
        self.events: list[LogEvent] = []
        self.seq = 0

    def admit(self, sid: str) -> H:
        self.seq += 1
        self.events.append(
            SubmissionAdmitted(
                submission_id=sid, conversation_id="c1", principal="p", idempotency_key=f"k-{sid}",
                payload_digest="0" * 64, submission_seq=self.seq, tools_offered=(), input_json="null",
                lane=self.lane if self.seq == 1 else None,
            )
        )  # fmt: skip
        return self

    def reject(self, sid: str, reason: SubmissionRejectReason = SubmissionRejectReason.BUSY) -> H:
        self.events.append(SubmissionRejected(submission_id=sid, idempotency_key=f"k-{sid}", reason=reason, detail="x"))
        return self

    def start(self, sid: str) -> H:
        self.events.append(AttemptStarted(submission_id=sid, attempt=1, attempt_id=f"a-{sid}", owner_epoch=1))
        return self

    def abort(self, sid: str, code: str) -> H:
        self.events.append(AbortRecorded(command_id=f"x-{sid}", submission_id=sid, principal="p", reason=code))
        return self

    def settle(self, sid: str, outcome: SettlementOutcome = DONE, reason: str | None = None) -> H:
        self.events.append(
            Settlement(submission_id=sid, outcome=outcome, error_reason=reason, attempt_count=1, settled_at=T0)
        )
        return self


def _ok(h: H, proposed: tuple[str, ...] = ()) -> None:
    assert check_lane_history(h.events, proposed) == []


def _bad(h: H, expected: str, proposed: tuple[str, ...] = ()) -> None:
    found = check_lane_history(h.events, proposed)
    assert any(expected in v for v in found), found


def test_every_lane_has_a_checker_and_join_is_the_hook_issue_22_item_2_fills() -> None:
    assert set(LANE_CHECKERS) == set(LanePolicy)


def test_queue_in_sequence_order_passes_and_out_of_order_or_two_active_fail() -> None:
    q = LanePolicy.QUEUE
    _ok(H(q).admit("s1").admit("s2").start("s1").settle("s1").start("s2").settle("s2"), ("s1", "s2"))
    _bad(H(q).admit("s1").admit("s2").start("s2").settle("s2").start("s1").settle("s1"), "out of sequence order")
    _bad(H(q).admit("s1").admit("s2").start("s1").start("s2").settle("s1").settle("s2"), "two active: s2")
    _bad(H(q).admit("s1").start("s1").settle("s1", ABORTED, "stop"), "s1: aborted under queue")


def test_none_lost_or_doubled() -> None:
    h = H(LanePolicy.QUEUE).admit("s1").start("s1").settle("s1")
    _bad(h, "s2: lost: never decided", ("s1", "s2"))
    _bad(H(LanePolicy.QUEUE).admit("s1").start("s1").settle("s1").settle("s1"), "s1: settled 2 times")
    _bad(H(LanePolicy.QUEUE).admit("s1").start("s1"), "s1: never settled")
    _bad(H(LanePolicy.QUEUE).admit("s1").start("s1").settle("s1").reject("s1"), "s1: decided 2 times", ("s1",))


def test_reject_passes_when_busy_and_fails_for_a_rejection_while_idle_or_another_reason() -> None:
    r = LanePolicy.REJECT
    _ok(H(r).admit("s1").reject("s2").start("s1").settle("s1").admit("s3").start("s3").settle("s3"), ("s1", "s2"))
    _bad(H(r).admit("s1").start("s1").settle("s1").reject("s2"), "s2: rejected busy while no submission held")
    _bad(H(r).admit("s1").reject("s2", SubmissionRejectReason.INVALID).start("s1").settle("s1"), "not busy")
    queued = H(r).admit("s1").start("s1").admit("s2").settle("s1").start("s2").settle("s2")
    _bad(queued, "s2: admitted while s1 held the lane")


def test_interrupt_passes_when_each_earlier_aborts_before_the_later_starts() -> None:
    i = LanePolicy.INTERRUPT
    good = H(i).admit("s1").start("s1").admit("s2").abort("s1", "interrupted").admit("s3").abort("s2", "interrupted")
    good.settle("s2", ABORTED, "interrupted: by s3").settle("s1", ABORTED, "interrupted: by s2")
    _ok(good.start("s3").settle("s3"), ("s1", "s2", "s3"))


def test_interrupt_fails_when_the_later_starts_first_or_the_earlier_completes_or_the_last_does_not() -> None:
    i = LanePolicy.INTERRUPT
    early = H(i).admit("s1").start("s1").admit("s2").start("s2").settle("s1", ABORTED, "interrupted: by s2")
    _bad(early.settle("s2"), "s2 started before s1's aborted settlement")
    _bad(H(i).admit("s1").start("s1").admit("s2").settle("s1").start("s2").settle("s2"), "s1: unsettled when s2")
    _bad(H(i).admit("s1").start("s1").settle("s1", ABORTED, "stop"), "the last, s1, settled aborted")


def test_keep_newest_passes_when_queued_ones_are_superseded_and_the_running_one_finishes() -> None:
    k = LanePolicy.KEEP_NEWEST
    h = H(k).admit("s1").start("s1").admit("s2").admit("s3").settle("s2", ABORTED, "superseded: by s3")
    _ok(h.settle("s1").start("s3").settle("s3"), ("s1", "s2", "s3"))


def test_keep_newest_fails_for_a_superseded_running_one_a_queued_one_that_ran_or_a_wrong_reason() -> None:
    k = LanePolicy.KEEP_NEWEST
    running = H(k).admit("s1").start("s1").admit("s2").settle("s1", ABORTED, "superseded: by s2")
    _bad(running.start("s2").settle("s2"), "s1: running when s2 was admitted, settled aborted")
    ran = H(k).admit("s1").start("s1").admit("s2").admit("s3").settle("s1").start("s2").settle("s2")
    _bad(ran.start("s3").settle("s3"), "s2: queued when s3 was admitted, settled completed")
    late = H(k).admit("s1").start("s1").admit("s2").admit("s3").settle("s1").start("s3")
    _bad(late.settle("s2", ABORTED, "superseded: by s3").settle("s3"), "s3 started before the superseded s2 settled")
    why = H(k).admit("s1").start("s1").admit("s2").admit("s3").settle("s2", ABORTED, "stop").settle("s1")
    _bad(why.start("s3").settle("s3"), "s2: queued when s3 was admitted, settled aborted (stop)")


@pytest.mark.parametrize("lane", list(LanePolicy))
def test_a_lane_change_inside_the_history_is_reported(lane: LanePolicy) -> None:
    h = H(lane).admit("s1").start("s1").settle("s1")
    h.events.append(LaneSet(command_id="l1", principal="p", lane=LanePolicy.QUEUE))
    _bad(h, "the lane changed")
