"""Lane policies in the pure core (issue 22 item 1): the lane recorded on the opening admission, and its fold."""

from __future__ import annotations

import pytest

from settled.protocol import (
    ACCESS_ALL,
    LANE_ABORT_PREFIX,
    LANE_BUSY,
    LANE_INTERRUPTED,
    LANE_SUPERSEDED,
    ConversationState,
    Decision,
    LanePolicy,
    LogInconsistencyError,
    SettleAborted,
    StartAttempt,
    abort,
    admit,
    fold,
    grant_access,
    interrupt,
    reason_code,
    schedule,
    set_lane,
    start_attempt,
    terminalize,
)
from settled.schemas import (
    AbortRecorded,
    AccessLevel,
    CommandKind,
    CommandRejected,
    CommandRejectReason,
    GrantAccess,
    LaneSet,
    LogBatch,
    ReceiptOutcome,
    SetLane,
    SettlementOutcome,
    SubmissionAdmitted,
    SubmissionRejected,
    SubmissionRejectReason,
)

from ._sim import T0, Log, abort_cmd, proposal


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


# -- the policies, decided with the admission ---------------------------------------------------------------------


def _lane_log(lane: LanePolicy) -> Log:
    log = Log()
    log.claim()
    opening = proposal("s1", "k1").model_copy(update={"lane": lane})
    log.commit("c1", admit(_conv(log), opening, log.ref(), T0))
    return log


def _step(log: Log) -> str | None:
    """Run the scheduler once as the conductor does: settle a recorded abort, or start the next attempt."""
    nxt = schedule(_conv(log))
    if isinstance(nxt, SettleAborted):
        log.commit("c1", terminalize(_conv(log), nxt.submission_id, SettlementOutcome.ABORTED, T0))
        return f"settled {nxt.submission_id}"
    if isinstance(nxt, StartAttempt):
        log.commit("c1", start_attempt(_conv(log), nxt.submission_id, f"a-{nxt.submission_id}", log.epoch))
        return f"started {nxt.submission_id}"
    return None


def _submit(log: Log, sid: str, key: str) -> Decision:
    d = admit(_conv(log), proposal(sid, key), log.ref(), T0)
    log.commit("c1", d)
    return d


def _settled(log: Log) -> dict[str, tuple[SettlementOutcome, str | None]]:
    return {r.submission_id: (r.outcome, r.error_reason) for r in log.settlements}


def test_reject_refuses_a_submission_while_one_runs_and_admits_it_once_the_lane_is_free() -> None:
    log = _lane_log(LanePolicy.REJECT)
    assert _step(log) == "started s1"
    d = _submit(log, "s2", "k2")
    assert [type(e) for e in d.events] == [SubmissionRejected]
    rejected = d.events[0]
    assert isinstance(rejected, SubmissionRejected) and rejected.reason is SubmissionRejectReason.BUSY
    assert d.receipt is not None and d.receipt.outcome is ReceiptOutcome.REJECTED
    assert reason_code(d.receipt.reason or "") == LANE_BUSY and "'s1' holds its lane" in (d.receipt.reason or "")
    assert _conv(log).submission("s2") is None and _conv(log).last_submission_seq == 1
    log.commit("c1", terminalize(_conv(log), "s1", SettlementOutcome.COMPLETED, T0, reply_json='"ok"'))
    again = _submit(log, "s2", "k2")  # the same key once the lane is free: never admitted before, so admitted now
    assert again.receipt is not None and again.receipt.outcome is ReceiptOutcome.ADMITTED
    assert again.receipt.submission_seq == 2


def test_reject_refuses_while_one_is_queued_even_before_it_started() -> None:
    log = _lane_log(LanePolicy.REJECT)
    d = _submit(log, "s2", "k2")
    assert d.receipt is not None and reason_code(d.receipt.reason or "") == LANE_BUSY


def test_under_reject_a_resent_admitted_key_is_still_a_duplicate() -> None:
    log = _lane_log(LanePolicy.REJECT)
    d = admit(_conv(log), proposal("s1-again", "k1"), log.ref(), T0)
    assert d.receipt is not None and d.receipt.outcome is ReceiptOutcome.DUPLICATE


def test_interrupt_aborts_the_running_and_the_queued_ones_and_the_new_one_starts_after_their_settlements() -> None:
    log = _lane_log(LanePolicy.QUEUE)
    assert _step(log) == "started s1"
    _submit(log, "s2", "k2")  # queued behind s1 under queue
    log.commit("c1", set_lane(_conv(log), _set("l1", LanePolicy.INTERRUPT), log.ref(), T0))
    d = _submit(log, "s3", "k3")
    aborts = [e for e in d.events if isinstance(e, AbortRecorded)]
    assert [a.submission_id for a in aborts] == ["s1", "s2"]
    assert all(a.reason is not None and reason_code(a.reason) == LANE_INTERRUPTED for a in aborts)
    assert all(a.command_id.startswith(LANE_ABORT_PREFIX) and a.principal == "alice" for a in aborts)
    assert _step(log) == "settled s2"  # the queued one settles aborted at once
    assert _step(log) is None  # s1 still runs (its cancellation is the worker's): s3 waits, one active (DUR-005)
    log.commit("c1", terminalize(_conv(log), "s1", SettlementOutcome.COMPLETED, T0, reply_json='"late"'))
    assert _step(log) == "started s3"
    settled = _settled(log)
    assert settled["s1"][0] is SettlementOutcome.ABORTED  # the canonical abort wins over the run's own outcome
    assert settled["s2"][0] is SettlementOutcome.ABORTED
    assert all(reason_code(settled[s][1] or "") == LANE_INTERRUPTED for s in ("s1", "s2"))


def test_interrupt_on_an_idle_conversation_aborts_nothing() -> None:
    log = _lane_log(LanePolicy.INTERRUPT)
    assert _step(log) == "started s1"
    log.commit("c1", terminalize(_conv(log), "s1", SettlementOutcome.COMPLETED, T0, reply_json='"ok"'))
    d = _submit(log, "s2", "k2")
    assert not [e for e in d.events if isinstance(e, AbortRecorded)]


def test_keep_newest_supersedes_the_queued_ones_and_lets_the_running_one_finish() -> None:
    log = _lane_log(LanePolicy.KEEP_NEWEST)
    assert _step(log) == "started s1"
    _submit(log, "s2", "k2")
    d = _submit(log, "s3", "k3")
    assert [e.submission_id for e in d.events if isinstance(e, AbortRecorded)] == ["s2"]
    assert _step(log) == "settled s2"
    assert _step(log) is None  # s1 runs on
    d = _submit(log, "s4", "k4")
    assert [e.submission_id for e in d.events if isinstance(e, AbortRecorded)] == ["s3"]
    assert _step(log) == "settled s3"
    log.commit("c1", terminalize(_conv(log), "s1", SettlementOutcome.COMPLETED, T0, reply_json='"ok"'))
    assert _step(log) == "started s4"
    settled = _settled(log)
    assert settled["s1"] == (SettlementOutcome.COMPLETED, None)
    assert all(
        settled[s][0] is SettlementOutcome.ABORTED and reason_code(settled[s][1] or "") == LANE_SUPERSEDED
        for s in ("s2", "s3")
    )


def test_keep_newest_never_supersedes_a_started_submission_between_attempts() -> None:
    log = _lane_log(LanePolicy.KEEP_NEWEST)
    assert _step(log) == "started s1"
    log.commit("c1", interrupt(_conv(log), "s1", "graceful_revoke"))  # back in Ready, still holding the lane
    d = _submit(log, "s2", "k2")
    assert not [e for e in d.events if isinstance(e, AbortRecorded)]


def test_a_lane_abort_never_reuses_a_command_id_a_client_applied() -> None:
    log = _lane_log(LanePolicy.KEEP_NEWEST)
    _submit(log, "s2", "k2")
    taken = f"{LANE_ABORT_PREFIX}s3/s2"
    log.commit("c1", abort(_conv(log), abort_cmd(taken, "s1"), log.ref(), T0))
    d = _submit(log, "s3", "k3")
    assert [e.command_id for e in d.events if isinstance(e, AbortRecorded)] == [f"{taken}#2"]


# -- SetLane ------------------------------------------------------------------------------------------------------


def _set(command_id: str, lane: LanePolicy, principal: str = "alice") -> SetLane:
    return SetLane(command_id=command_id, principal=principal, conversation_id="c1", lane=lane, requested_at=T0)


def test_set_lane_changes_the_lane_for_later_submissions_and_a_repeat_is_a_duplicate() -> None:
    log = _lane_log(LanePolicy.QUEUE)
    d = set_lane(_conv(log), _set("l1", LanePolicy.REJECT), log.ref(), T0)
    assert [type(e) for e in d.events] == [LaneSet]
    assert d.receipt is not None and d.receipt.outcome is ReceiptOutcome.APPLIED
    log.commit("c1", d)
    assert _conv(log).lane is LanePolicy.REJECT
    again = set_lane(_conv(log), _set("l1", LanePolicy.REJECT), log.ref(), T0)
    assert again.receipt is not None and again.receipt.outcome is ReceiptOutcome.DUPLICATE
    log.commit("c1", again)
    assert _conv(log).lane is LanePolicy.REJECT
    other = set_lane(_conv(log), _set("l1", LanePolicy.QUEUE), log.ref(), T0)
    assert other.receipt is not None and reason_code(other.receipt.reason or "") == "invalid"
    assert "command_id 'l1' was already applied" in (other.receipt.reason or "")


def test_set_lane_by_a_stranger_is_unauthorized_and_by_a_grantee_with_act_is_applied() -> None:
    log = _lane_log(LanePolicy.QUEUE)
    d = set_lane(_conv(log), _set("l1", LanePolicy.REJECT, principal="mallory"), log.ref(), T0)
    assert [type(e) for e in d.events] == [CommandRejected]
    assert d.receipt is not None and reason_code(d.receipt.reason or "") == "unauthorized"
    admin = set_lane(_conv(log), _set("l2", LanePolicy.REJECT, principal="ops"), log.ref(), T0, access=ACCESS_ALL)
    assert admin.receipt is not None and admin.receipt.outcome is ReceiptOutcome.APPLIED
    grant = GrantAccess(
        command_id="g1", principal="alice", conversation_id="c1", grantee="bob", access=AccessLevel.ACT, requested_at=T0
    )
    log.commit("c1", grant_access(_conv(log), grant, log.ref(), T0))
    d = set_lane(_conv(log), _set("l3", LanePolicy.INTERRUPT, principal="bob"), log.ref(), T0)
    assert d.receipt is not None and d.receipt.outcome is ReceiptOutcome.APPLIED


def test_set_lane_on_a_conversation_nobody_opened_is_an_unknown_target() -> None:
    log = Log()
    log.claim()
    d = set_lane(_conv(log), _set("l1", LanePolicy.REJECT), log.ref(), T0)
    rejected = d.events[0]
    assert isinstance(rejected, CommandRejected) and rejected.command_kind is CommandKind.LANE
    assert rejected.reason is CommandRejectReason.UNKNOWN_TARGET


def test_the_fold_refuses_a_lane_set_whose_command_id_set_another_lane() -> None:
    log = _lane_log(LanePolicy.QUEUE)
    log.commit("c1", set_lane(_conv(log), _set("l1", LanePolicy.REJECT), log.ref(), T0))
    with pytest.raises(LogInconsistencyError, match="command already applied"):
        log.append("c1", [LaneSet(command_id="l1", principal="alice", lane=LanePolicy.QUEUE)])
