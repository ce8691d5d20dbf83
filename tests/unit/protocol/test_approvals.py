"""Approvals as a kind of the generic wait (issue 16 item 4): ids, argument digests, and why a decision is refused."""

from __future__ import annotations

import json

import pytest

from settled.protocol import (
    ConversationState,
    SubmissionState,
    admit,
    approval_details,
    approval_id_for,
    approval_payload,
    approval_problem,
    arguments_digest,
    decide_approval,
    resolve_wait,
    start_attempt,
    terminalize,
    wait_id_for,
)
from settled.schemas import (
    ApprovalDecided,
    CommandKind,
    CommandRejected,
    CommandRejectReason,
    DecideApproval,
    ReceiptOutcome,
    SettlementOutcome,
    WaitKind,
    WaitOutcome,
    WaitRequested,
    WaitResolved,
)

from ._sim import T0, Log, at, proposal

REFUND_ARGS = '{"order": "o-7", "amount_cents": 12000}'


def _waiting_log() -> Log:
    """A run (s1) waiting on the approval ``s1#w3`` of a refund."""
    log = Log()
    log.claim()
    log.commit("c1", admit(log.state.conversation("c1"), proposal("s1", "k1"), log.ref(), T0))
    log.commit("c1", start_attempt(log.state.conversation("c1"), "s1", "a1", log.epoch))
    request = WaitRequested(
        submission_id="s1",
        attempt_id="a1",
        wait_id=approval_id_for("s1", ordinal=3),
        kind=WaitKind.APPROVAL,
        name="refund",
        ordinal=3,
        details_json=approval_details("refund", "refund order o-7", REFUND_ARGS, tool="refund"),
    )
    log.append("c1", [request])
    return log


def _conv(log: Log) -> ConversationState:
    return log.state.conversation("c1")


def _decision(
    *, submission_id: str = "s1", approval_id: str = "s1#w3", args_json: str = REFUND_ARGS, approved: bool = True
) -> DecideApproval:
    return DecideApproval(
        command_id="d1",
        principal="supervisor",
        conversation_id="c1",
        submission_id=submission_id,
        approval_id=approval_id,
        args_digest=arguments_digest(args_json),
        approved=approved,
        reason="within policy",
        key_id="ops-1",
        signature=b"\x01" * 64,
        requested_at=at(5),
    )


def test_approval_ids_are_derived_from_the_run_and_the_ordinal_or_the_tool_call() -> None:
    assert approval_id_for("s1", ordinal=3) == wait_id_for("s1", 3) == "s1#w3"
    assert approval_id_for("s1", call_id="s1:c2") == "s1#as1:c2"
    with pytest.raises(ValueError, match="exactly one of ordinal and call_id"):
        approval_id_for("s1")
    with pytest.raises(ValueError, match="exactly one of ordinal and call_id"):
        approval_id_for("s1", ordinal=1, call_id="c")


def test_the_argument_digest_is_of_the_canonical_json_whatever_its_spacing_or_key_order() -> None:
    assert arguments_digest('{"amount_cents":12000,"order":"o-7"}') == arguments_digest(REFUND_ARGS)
    assert arguments_digest('{"order": "o-7", "amount_cents": 12001}') != arguments_digest(REFUND_ARGS)
    details = json.loads(approval_details("refund", "refund order o-7", REFUND_ARGS, tool="refund"))
    assert details == {
        "args_digest": arguments_digest(REFUND_ARGS),
        "args_json": '{"amount_cents":12000,"order":"o-7"}',
        "description": "refund order o-7",
        "title": "refund",
        "tool": "refund",
    }


def test_a_decision_bound_to_the_open_approval_and_its_arguments_is_accepted() -> None:
    log = _waiting_log()
    assert approval_problem(_conv(log), _decision()) is None
    assert approval_problem(_conv(log), _decision(approved=False)) is None
    assert json.loads(approval_payload(_decision(approved=False))) == {
        "approved": False,
        "by": "ops-1",
        "principal": "supervisor",
        "reason": "within policy",
    }


def test_a_decision_for_other_arguments_is_refused_as_a_digest_mismatch() -> None:
    log = _waiting_log()
    problem = approval_problem(_conv(log), _decision(args_json='{"order": "o-7", "amount_cents": 99000}'))
    assert problem is not None
    reason, detail = problem
    assert reason is CommandRejectReason.DIGEST_MISMATCH
    assert "args_digest" in detail and arguments_digest(REFUND_ARGS) in detail


def test_a_decision_naming_another_runs_approval_is_refused() -> None:
    log = _waiting_log()
    log.commit("c1", admit(_conv(log), proposal("s2", "k2"), log.ref(), T0))
    problem = approval_problem(_conv(log), _decision(submission_id="s2"))
    assert problem is not None and problem[0] is CommandRejectReason.OTHER_RUN
    assert "'s1#w3'" in problem[1] and "'s2'" in problem[1]


def test_a_decision_for_an_approval_never_requested_or_an_unknown_run_is_refused() -> None:
    log = _waiting_log()
    problem = approval_problem(_conv(log), _decision(approval_id="s1#w9"))
    assert problem is not None and problem[0] is CommandRejectReason.UNKNOWN_TARGET
    signal = WaitRequested(
        submission_id="s1", attempt_id="a1", wait_id="s1#w4", kind=WaitKind.SIGNAL, name="paid", ordinal=4
    )
    log.append("c1", [signal])  # a signal wait is not an approval
    problem = approval_problem(_conv(log), _decision(approval_id="s1#w4"))
    assert problem is not None and problem[0] is CommandRejectReason.UNKNOWN_TARGET
    problem = approval_problem(_conv(log), _decision(submission_id="s9", approval_id="s9#w3"))
    assert problem is not None and problem[0] is CommandRejectReason.UNKNOWN_TARGET


def test_a_decision_for_an_approval_already_decided_or_expired_is_stale() -> None:
    log = _waiting_log()
    log.commit("c1", resolve_wait(_conv(log), "s1", "s1#w3", WaitOutcome.EXPIRED, at(60)))
    problem = approval_problem(_conv(log), _decision())
    assert problem is not None and problem[0] is CommandRejectReason.STALE
    assert "no longer open" in problem[1]


def test_a_decision_for_a_settled_run_is_refused_naming_its_outcome() -> None:
    log = _waiting_log()
    log.commit("c1", resolve_wait(_conv(log), "s1", "s1#w3", WaitOutcome.EXPIRED, at(60)))
    log.commit("c1", start_attempt(_conv(log), "s1", "a2", log.epoch))
    log.commit("c1", terminalize(_conv(log), "s1", SettlementOutcome.FAILED, at(61), error_type="x", error_reason="y"))
    problem = approval_problem(_conv(log), _decision())
    assert problem is not None and problem[0] is CommandRejectReason.ALREADY_TERMINAL


def test_an_accepted_decision_resolves_the_wait_in_the_same_batch_and_the_run_is_ready() -> None:
    log = _waiting_log()
    decision = decide_approval(_conv(log), _decision(approved=False), log.ref(), at(5))
    assert [type(e) for e in decision.events] == [ApprovalDecided, WaitResolved]
    resolved = decision.events[1]
    assert isinstance(resolved, WaitResolved)
    assert (resolved.wait_id, resolved.outcome, resolved.source_id) == ("s1#w3", WaitOutcome.DELIVERED, "d1")
    assert resolved.payload_json == approval_payload(_decision(approved=False))
    assert decision.receipt is not None and decision.receipt.outcome is ReceiptOutcome.APPLIED
    log.commit("c1", decision)
    sub = _conv(log).submission("s1")
    assert sub is not None and sub.state is SubmissionState.READY and sub.waits == frozenset()


def test_the_same_decision_again_gets_a_duplicate_receipt_and_changes_nothing() -> None:
    log = _waiting_log()
    log.commit("c1", decide_approval(_conv(log), _decision(), log.ref(), at(5)))
    before = _conv(log).submission("s1")
    again = decide_approval(_conv(log), _decision(), log.ref(), at(6))
    assert [type(e) for e in again.events] == [ApprovalDecided]
    assert again.receipt is not None and again.receipt.outcome is ReceiptOutcome.DUPLICATE
    log.commit("c1", again)
    assert _conv(log).submission("s1") == before


@pytest.mark.parametrize(
    ("decision", "reason"),
    [
        (_decision(args_json='{"order": "o-7", "amount_cents": 99000}'), CommandRejectReason.DIGEST_MISMATCH),
        (_decision(approval_id="s2#w3"), CommandRejectReason.OTHER_RUN),
        (_decision(approval_id="s1#w8"), CommandRejectReason.UNKNOWN_TARGET),
    ],
)
def test_a_refused_decision_is_rejected_with_its_reason_and_the_wait_stays(
    decision: DecideApproval, reason: CommandRejectReason
) -> None:
    log = _waiting_log()
    before = _conv(log).submission("s1")
    rejected = decide_approval(_conv(log), decision, log.ref(), at(5))
    assert [type(e) for e in rejected.events] == [CommandRejected]
    event = rejected.events[0]
    assert isinstance(event, CommandRejected)
    assert (event.reason, event.command_kind) == (reason, CommandKind.APPROVAL)
    assert rejected.receipt is not None and rejected.receipt.outcome is ReceiptOutcome.REJECTED
    assert rejected.receipt.reason is not None and rejected.receipt.reason.startswith(f"{reason.value}: ")
    log.commit("c1", rejected)
    after = _conv(log).submission("s1")
    assert after == before and after is not None and after.waits == {"s1#w3"}
