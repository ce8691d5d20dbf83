"""Case tests of the decision functions (DUR-001/004/005/011/012).

docs/design.md §3, §4, §5; docs/semantics.md §4, §5, §12, §13.
"""

from __future__ import annotations

import pytest

from settled.protocol import (
    ConversationState,
    IllegalTransitionError,
    InputAlreadyDecidedError,
    SettleAborted,
    StartAttempt,
    SubmissionState,
    TerminalOutcomeConflictError,
    UnknownSubmissionError,
    WrongConversationError,
    abort,
    admit,
    interrupt,
    quarantine,
    reason_code,
    reject_submission,
    resolve,
    schedule,
    start_attempt,
    terminalize,
)
from settled.schemas import (
    AbortRecorded,
    AttemptStarted,
    CommandRejected,
    CommandRejectReason,
    InputApplied,
    InputQuarantined,
    QuarantineReason,
    ReceiptOutcome,
    RecoveryDecision,
    RecoveryDecisionKind,
    RequestKind,
    ResolutionKind,
    ResolveUnknown,
    Settlement,
    SettlementOutcome,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionReady,
    SubmissionRejected,
    SubmissionRejectReason,
    ToolCallPrepared,
    ToolCallUnknown,
    json_digest,
)

from ._sim import T0, Log, abort_cmd, at, proposal

S = SubmissionState


@pytest.fixture
def log() -> Log:
    log = Log()
    log.claim()
    return log


def admit_one(log: Log, sid: str, key: str, *, cid: str = "c1", value: object = "hello") -> None:
    decision = admit(log.state.conversation(cid), proposal(sid, key, conversation_id=cid, value=value), log.ref(), T0)
    assert isinstance(decision.events[0], SubmissionAdmitted), decision
    log.commit(cid, decision)


def run(log: Log, sid: str, attempt_id: str = "a1", cid: str = "c1") -> None:
    log.commit(cid, start_attempt(log.state.conversation(cid), sid, attempt_id, log.epoch))


def conv(log: Log, cid: str = "c1") -> ConversationState:
    return log.state.conversation(cid)


# -------------------------------------------------------------------------------------------------- admission


def test_admission_allocates_sequences_and_answers_with_a_payload_free_receipt(log: Log) -> None:
    ref = log.ref()
    decision = admit(conv(log), proposal("s1", "k1", value={"q": 1}, tools=("search",)), ref, at(1))
    admitted, ready = decision.events
    assert isinstance(admitted, SubmissionAdmitted) and isinstance(ready, SubmissionReady)
    assert (admitted.submission_seq, ready.submission_seq, admitted.input_ref) == (1, 1, ref)
    assert admitted.input_json == '{"q":1}' and admitted.tools_offered == ("search",)
    receipt = decision.receipt
    assert receipt is not None
    assert (receipt.request_kind, receipt.request_id, receipt.outcome, receipt.submission_seq) == (
        RequestKind.SUBMISSION,
        "s1",
        ReceiptOutcome.ADMITTED,
        1,
    )
    assert receipt.decided_at == at(1) and decision.submission_id == "s1"
    log.commit("c1", decision)
    second = admit(conv(log), proposal("s2", "k2"), log.ref(), T0)
    assert second.receipt is not None and second.receipt.submission_seq == 2
    assert conv(log).state_of("s1") is S.READY


def test_a_retry_with_the_same_key_and_payload_is_a_duplicate_pointing_at_the_original(log: Log) -> None:
    admit_one(log, "s1", "k1", value={"a": [1, 2.5]})
    admit_one(log, "s2", "k2")
    retry = proposal("s1-retry", "k1", value={"a": [1, 2.5]})
    decision = admit(conv(log), retry, log.ref(), at(5))
    (duplicate,) = decision.events
    assert isinstance(duplicate, SubmissionDuplicate)
    assert (duplicate.submission_id, duplicate.original_submission_id) == ("s1-retry", "s1")
    receipt = decision.receipt
    assert receipt is not None
    assert (receipt.outcome, receipt.original_submission_id, receipt.submission_seq) == (
        ReceiptOutcome.DUPLICATE,
        "s1",
        1,
    )
    log.commit("c1", decision)
    assert conv(log).last_submission_seq == 2, "a duplicate allocates no sequence"


def test_the_same_key_with_another_payload_is_rejected_naming_the_key(log: Log) -> None:
    admit_one(log, "s1", "k1", value="one")
    decision = admit(conv(log), proposal("s2", "k1", value="two"), log.ref(), T0)
    (rejected,) = decision.events
    assert isinstance(rejected, SubmissionRejected)
    assert rejected.reason is SubmissionRejectReason.IDEMPOTENCY_CONFLICT
    assert rejected.field == "idempotency_key" and "'k1'" in rejected.detail
    assert decision.receipt is not None and decision.receipt.outcome is ReceiptOutcome.REJECTED
    assert decision.receipt.reason is not None and reason_code(decision.receipt.reason) == "idempotency_conflict"
    assert "'k1'" in decision.receipt.reason


def test_key_scope_is_principal_plus_conversation(log: Log) -> None:
    admit_one(log, "s1", "k1")
    other_principal = admit(conv(log), proposal("s2", "k1", principal="bob", value="x"), log.ref(), T0)
    assert isinstance(other_principal.events[0], SubmissionAdmitted)
    other_conversation = admit(conv(log, "c2"), proposal("s3", "k1", conversation_id="c2", value="y"), log.ref(), T0)
    assert isinstance(other_conversation.events[0], SubmissionAdmitted)


def test_a_payload_digest_that_is_not_the_canonical_payloads_is_rejected_naming_the_field(log: Log) -> None:
    decision = admit(conv(log), proposal("s1", "k1", digest="0" * 64), log.ref(), T0)
    (rejected,) = decision.events
    assert isinstance(rejected, SubmissionRejected)
    assert (rejected.reason, rejected.field) == (SubmissionRejectReason.DIGEST_MISMATCH, "payload_digest")


@pytest.mark.parametrize(
    ("sid", "key", "principal", "tools", "field"),
    [
        ("s1", "k1", " ", (), "principal"),
        ("s1", "", "alice", (), "idempotency_key"),
        ("", "k1", "alice", (), "submission_id"),
        ("s1", "k1", "alice", ("a", "a"), "payload.tools_offered"),
        ("s1", "k1", "alice", ("",), "payload.tools_offered"),
    ],
)
def test_a_decodable_but_invalid_proposal_is_rejected_naming_the_field(
    log: Log, sid: str, key: str, principal: str, tools: tuple[str, ...], field: str
) -> None:
    decision = admit(conv(log), proposal(sid, key, principal=principal, tools=tools), log.ref(), T0)
    (rejected,) = decision.events
    assert isinstance(rejected, SubmissionRejected)
    assert (rejected.reason, rejected.field) == (SubmissionRejectReason.INVALID, field)
    log.commit("c1", decision)
    assert conv(log).submissions == {}


def test_a_submission_id_reused_under_another_key_is_rejected(log: Log) -> None:
    admit_one(log, "s1", "k1")
    decision = admit(conv(log), proposal("s1", "k2", value="other"), log.ref(), T0)
    (rejected,) = decision.events
    assert isinstance(rejected, SubmissionRejected) and rejected.field == "submission_id"


def test_one_key_proposed_twice_inside_one_open_transaction_is_admitted_once(log: Log) -> None:
    """docs/design.md §3 pending overlay: the scratch state (committed + pending batches) answers admission."""
    committed = log.state
    first = admit(committed.conversation("c1"), proposal("s1", "k1"), log.ref(), T0)
    log.commit("c1", first)  # folded into the scratch state only
    second = admit(log.state.conversation("c1"), proposal("s1", "k1"), log.ref(), T0)
    assert isinstance(second.events[0], SubmissionDuplicate)
    assert second.receipt is not None and second.receipt.submission_seq == 1
    # The committed state did not move: if the transaction aborts, both inputs are decided again from it.
    assert committed.conversation("c1").submissions == {}


def test_a_decided_input_is_not_decided_again_and_inputs_stay_in_their_conversation(log: Log) -> None:
    ref = log.ref()
    log.commit("c1", admit(conv(log), proposal("s1", "k1"), ref, T0))
    with pytest.raises(InputAlreadyDecidedError):
        admit(conv(log), proposal("s1", "k1"), ref, T0)
    assert log.state.is_decided(ref, "c1") and not log.state.is_decided(ref, "c2")
    with pytest.raises(WrongConversationError):
        admit(conv(log, "c2"), proposal("s9", "k9"), log.ref(), T0)


def test_shell_rejections_share_the_shape(log: Log) -> None:
    decision = reject_submission(
        conv(log),
        proposal("s1", "k1"),
        log.ref(),
        T0,
        reason=SubmissionRejectReason.MISROUTED,
        detail="key hashes to partition 3, read from 0",
    )
    assert isinstance(decision.events[0], SubmissionRejected)
    assert (
        decision.receipt is not None and decision.receipt.reason == "misrouted: key hashes to partition 3, read from 0"
    )


def test_quarantine_sets_the_input_aside_with_its_reason_and_truncated_bytes(log: Log) -> None:
    ref = log.ref()
    decision = quarantine(
        ref,
        QuarantineReason.UNDECODABLE,
        "bad magic",
        raw=b"x" * 100,
        raw_size_bytes=100,
        now=T0,
        raw_limit_bytes=10,
        key=b"k" * 20,
    )
    (event,) = decision.events
    assert isinstance(event, InputQuarantined) and event.input_ref == ref and event.raw_size_bytes == 100
    record = decision.quarantine
    assert record is not None and (record.raw, record.key, record.offset) == (b"x" * 10, b"k" * 10, ref.offset)
    log.commit("~partition/0", decision)
    assert log.state.is_decided(ref), "found without knowing the conversation"


# ------------------------------------------------------------------------------------------------ scheduling


def test_schedule_is_fifo_with_at_most_one_active(log: Log) -> None:
    for i in (1, 2, 3):
        admit_one(log, f"s{i}", f"k{i}")
    assert schedule(conv(log)) == StartAttempt("s1", 1)
    run(log, "s1")
    assert schedule(conv(log)) is None, "DUR-005: s1 holds the lane"
    with pytest.raises(IllegalTransitionError) as info:
        start_attempt(conv(log), "s2", "a2", log.epoch)
    assert (info.value.submission_id, info.value.from_state, info.value.to_state) == ("s2", S.READY, S.RUNNING)
    log.commit("c1", terminalize(conv(log), "s1", SettlementOutcome.COMPLETED, T0, reply_json='"hi"'))
    assert conv(log).active_submission_id is None, "the lane is released with the settlement"
    assert schedule(conv(log)) == StartAttempt("s2", 1)


def test_start_attempt_records_the_attempt_count_before_the_run_and_applies_the_input_once(log: Log) -> None:
    admit_one(log, "s1", "k1", value={"x": 1})
    decision = start_attempt(conv(log), "s1", "a1", log.epoch)
    started, applied = decision.events
    assert isinstance(started, AttemptStarted) and (started.attempt, started.owner_epoch) == (1, log.epoch)
    assert isinstance(applied, InputApplied) and applied.input_digest == json_digest('{"x":1}')
    log.commit("c1", decision)
    log.commit("c1", interrupt(conv(log), "s1", "graceful_revoke"))
    assert conv(log).state_of("s1") is S.READY
    assert schedule(conv(log)) == StartAttempt("s1", 2)
    again = start_attempt(conv(log), "s1", "a2", log.epoch)
    assert [type(e) for e in again.events] == [AttemptStarted]
    assert isinstance(again.events[0], AttemptStarted) and again.events[0].attempt == 2


def test_an_admitted_but_not_ready_head_blocks_the_queue(log: Log) -> None:
    decision = admit(conv(log), proposal("s1", "k1"), log.ref(), T0)
    log.append("c1", decision.events[:1])  # admitted only (materialization comes with a later issue)
    admit_one(log, "s2", "k2")
    assert conv(log).state_of("s1") is S.ADMITTED
    assert schedule(conv(log)) is None


def test_start_and_terminalize_of_an_unknown_submission_raise(log: Log) -> None:
    with pytest.raises(UnknownSubmissionError):
        start_attempt(conv(log), "nope", "a", log.epoch)
    with pytest.raises(UnknownSubmissionError):
        terminalize(conv(log), "nope", SettlementOutcome.COMPLETED, T0)


# ------------------------------------------------------------------------------------------- terminalization


def test_terminalize_appends_the_settlement_with_its_record(log: Log) -> None:
    admit_one(log, "s1", "k1")
    run(log, "s1")
    decision = terminalize(conv(log), "s1", SettlementOutcome.COMPLETED, at(9), reply_json='{"ok":true}')
    (settlement,) = decision.events
    assert isinstance(settlement, Settlement)
    record = decision.settlement
    assert record is not None
    assert (record.submission_id, record.submission_seq, record.outcome, record.attempt_count) == (
        "s1",
        1,
        SettlementOutcome.COMPLETED,
        1,
    )
    assert record.reply_digest == settlement.reply_digest == json_digest('{"ok":true}')
    trace = log.commit("c1", decision)
    assert [(t.edge.source, t.edge.target) for t in trace] == [
        (S.RUNNING, S.TERMINALIZING),
        (S.TERMINALIZING, S.COMPLETED),
    ]


def test_conflicting_terminal_outcomes_are_rejected(log: Log) -> None:
    admit_one(log, "s1", "k1")
    run(log, "s1")
    log.commit("c1", terminalize(conv(log), "s1", SettlementOutcome.FAILED, T0, error_type="E", error_reason="x"))
    for outcome in SettlementOutcome:
        with pytest.raises(TerminalOutcomeConflictError) as info:
            terminalize(conv(log), "s1", outcome, T0)
        assert info.value.winning_outcome is SettlementOutcome.FAILED and info.value.settled


def test_a_queued_submission_cannot_settle_completed(log: Log) -> None:
    admit_one(log, "s1", "k1")
    with pytest.raises(IllegalTransitionError):
        terminalize(conv(log), "s1", SettlementOutcome.COMPLETED, T0)


# -------------------------------------------------------------------------------------------------------- abort


def test_a_queued_abort_settles_at_once_before_the_running_submission_ahead_of_it(log: Log) -> None:
    admit_one(log, "s1", "k1")
    admit_one(log, "s2", "k2")
    run(log, "s1")
    decision = abort(conv(log), abort_cmd("x1", "s2"), log.ref(), T0)
    recorded, settlement = decision.events
    assert isinstance(recorded, AbortRecorded) and isinstance(settlement, Settlement)
    assert settlement.outcome is SettlementOutcome.ABORTED and settlement.attempt_count == 0
    assert decision.settlement is not None and decision.settlement.outcome is SettlementOutcome.ABORTED
    assert decision.receipt is not None and decision.receipt.outcome is ReceiptOutcome.APPLIED
    log.commit("c1", decision)
    assert conv(log).state_of("s2") is S.ABORTED and conv(log).state_of("s1") is S.RUNNING
    log.commit("c1", terminalize(conv(log), "s1", SettlementOutcome.COMPLETED, T0))
    assert [r.submission_id for r in log.settlements] == ["s2", "s1"]
    assert schedule(conv(log)) is None, "the aborted row never gets an attempt"


def test_an_active_abort_is_canonical_first_and_wins_the_settlement(log: Log) -> None:
    admit_one(log, "s1", "k1")
    run(log, "s1")
    decision = abort(conv(log), abort_cmd("x1", "s1", reason="user cancelled"), log.ref(), T0)
    assert [type(e) for e in decision.events] == [AbortRecorded]
    assert decision.settlement is None
    assert decision.receipt is not None and decision.receipt.outcome is ReceiptOutcome.APPLIED
    log.commit("c1", decision)
    assert conv(log).state_of("s1") is S.RUNNING
    settled = terminalize(conv(log), "s1", SettlementOutcome.COMPLETED, T0, reply_json='"done"')
    assert settled.settlement is not None
    assert settled.settlement.outcome is SettlementOutcome.ABORTED
    assert settled.settlement.error_reason == "user cancelled" and settled.settlement.reply_json is None
    log.commit("c1", settled)


def test_a_repeated_abort_is_a_duplicate_even_after_the_settlement(log: Log) -> None:
    admit_one(log, "s1", "k1")
    run(log, "s1")
    log.commit("c1", abort(conv(log), abort_cmd("x1", "s1"), log.ref(), T0))
    again = abort(conv(log), abort_cmd("x1", "s1"), log.ref(), T0)
    assert again.receipt is not None and again.receipt.outcome is ReceiptOutcome.DUPLICATE
    assert [type(e) for e in again.events] == [AbortRecorded]
    before = conv(log).submission("s1")
    log.commit("c1", again)
    assert conv(log).submission("s1") == before
    log.commit("c1", terminalize(conv(log), "s1", SettlementOutcome.ABORTED, T0))
    late = abort(conv(log), abort_cmd("x1", "s1"), log.ref(), T0)
    assert late.receipt is not None and late.receipt.outcome is ReceiptOutcome.DUPLICATE
    log.commit("c1", late)


@pytest.mark.parametrize("outcome", [SettlementOutcome.COMPLETED, SettlementOutcome.FAILED])
def test_abort_of_a_settled_submission_is_rejected_naming_the_outcome_that_won(
    log: Log, outcome: SettlementOutcome
) -> None:
    admit_one(log, "s1", "k1")
    run(log, "s1")
    log.commit("c1", terminalize(conv(log), "s1", outcome, T0))
    decision = abort(conv(log), abort_cmd("x1", "s1"), log.ref(), T0)
    (rejected,) = decision.events
    assert isinstance(rejected, CommandRejected)
    assert (rejected.reason, rejected.winning_outcome) == (CommandRejectReason.ALREADY_TERMINAL, outcome)
    assert decision.receipt is not None and decision.receipt.reason is not None
    assert decision.receipt.reason.startswith(f"already_terminal: {outcome.value} won")
    log.commit("c1", decision)
    assert conv(log).state_of("s1").value == outcome.value


def test_abort_of_an_unknown_target_is_rejected_and_nothing_else_is_appended(log: Log) -> None:
    admit_one(log, "s1", "k1")
    before = conv(log)
    decision = abort(conv(log), abort_cmd("x1", "ghost"), log.ref(), T0)
    (rejected,) = decision.events
    assert isinstance(rejected, CommandRejected) and rejected.reason is CommandRejectReason.UNKNOWN_TARGET
    assert decision.settlement is None
    assert decision.receipt is not None and reason_code(decision.receipt.reason or "") == "unknown_target"
    log.commit("c1", decision)
    after = conv(log)
    assert after.submissions == before.submissions and after.applied_commands == before.applied_commands


# ---------------------------------------------------------------------------------------------- Unknown calls


def _into_unknown(log: Log) -> None:
    admit_one(log, "s1", "k1")
    run(log, "s1")
    args = "{}"
    log.append(
        "c1",
        [
            ToolCallPrepared(
                submission_id="s1",
                run_id="r1",
                attempt_id="a1",
                call_id="call1",
                ordinal=0,
                tool="pay",
                args_json=args,
                args_digest=json_digest(args),
                idempotency_key="ik",
                owner_epoch=log.epoch,
            )
        ],
    )
    log.append(
        "c1",
        [
            ToolCallUnknown(submission_id="s1", call_id="call1", reason="timeout"),
            RecoveryDecision(
                submission_id="s1",
                attempt_id="a1",
                decision=RecoveryDecisionKind.UNKNOWN,
                reason="not idempotent",
                call_ids=("call1",),
            ),
        ],
    )
    assert conv(log).state_of("s1") is S.UNKNOWN


def _resolve(
    kind: ResolutionKind, outcome: SettlementOutcome | None = None, submission_id: str = "s1"
) -> ResolveUnknown:
    return ResolveUnknown(
        command_id="res1",
        principal="operator",
        conversation_id="c1",
        submission_id=submission_id,
        call_id="call1",
        kind=kind,
        outcome=outcome,
        result_json='{"paid":true}' if kind is not ResolutionKind.SAFE_TO_RETRY else None,
        key_id="ops-2026",
        signature=b"verified-by-the-caller",
        requested_at=T0,
    )


def test_a_call_outcome_resolution_makes_the_run_ready_for_its_next_attempt(log: Log) -> None:
    _into_unknown(log)
    assert schedule(conv(log)) is None, "Unknown holds the lane and starts nothing"
    decision = resolve(conv(log), _resolve(ResolutionKind.CALL_OUTCOME), log.ref(), T0)
    assert decision.receipt is not None and decision.receipt.outcome is ReceiptOutcome.APPLIED
    trace = log.commit("c1", decision)
    assert [t.edge.label for t in trace] == ["resolved with the call's outcome"]
    assert schedule(conv(log)) == StartAttempt("s1", 2)
    again = resolve(conv(log), _resolve(ResolutionKind.CALL_OUTCOME), log.ref(), T0)
    assert again.receipt is not None and again.receipt.outcome is ReceiptOutcome.DUPLICATE
    log.commit("c1", again)


def test_an_outcome_resolution_settles_and_a_recorded_abort_makes_it_aborted(log: Log) -> None:
    _into_unknown(log)
    log.commit("c1", abort(conv(log), abort_cmd("x1", "s1"), log.ref(), T0))
    decision = resolve(
        conv(log), _resolve(ResolutionKind.OUTCOME_FOR_SUBMISSION, SettlementOutcome.COMPLETED), log.ref(), T0
    )
    assert decision.settlement is not None and decision.settlement.outcome is SettlementOutcome.ABORTED
    trace = log.commit("c1", decision)
    assert [(t.edge.source, t.edge.target) for t in trace] == [
        (S.UNKNOWN, S.TERMINALIZING),
        (S.TERMINALIZING, S.ABORTED),
    ]


def test_resolutions_aimed_at_nothing_are_rejected(log: Log) -> None:
    _into_unknown(log)
    ghost = resolve(conv(log), _resolve(ResolutionKind.SAFE_TO_RETRY, submission_id="ghost"), log.ref(), T0)
    assert isinstance(ghost.events[0], CommandRejected)
    assert ghost.events[0].reason is CommandRejectReason.UNKNOWN_TARGET
    log.commit("c1", resolve(conv(log), _resolve(ResolutionKind.SAFE_TO_RETRY), log.ref(), T0))
    other = _resolve(ResolutionKind.SAFE_TO_RETRY).model_copy(update={"command_id": "res2"})
    not_unknown = resolve(conv(log), other, log.ref(), T0)
    assert isinstance(not_unknown.events[0], CommandRejected)
    assert not_unknown.events[0].reason is CommandRejectReason.NOT_UNKNOWN


def test_schedule_settles_an_interrupted_run_with_a_recorded_abort_instead_of_restarting_it(log: Log) -> None:
    admit_one(log, "s1", "k1")
    admit_one(log, "s2", "k2")
    run(log, "s1")
    log.commit("c1", abort(conv(log), abort_cmd("x1", "s1"), log.ref(), T0))
    log.commit("c1", interrupt(conv(log), "s1", "graceful_revoke"))
    assert schedule(conv(log)) == SettleAborted("s1")
    with pytest.raises(IllegalTransitionError):
        start_attempt(conv(log), "s1", "a2", log.epoch)
    log.commit("c1", terminalize(conv(log), "s1", SettlementOutcome.ABORTED, T0))
    assert schedule(conv(log)) == StartAttempt("s2", 1)


def test_an_admitted_but_not_ready_submission_aborts_without_an_attempt(log: Log) -> None:
    decision = admit(conv(log), proposal("s1", "k1"), log.ref(), T0)
    log.append("c1", decision.events[:1])
    aborted = abort(conv(log), abort_cmd("x1", "s1"), log.ref(), T0)
    trace = log.commit("c1", aborted)
    assert [(t.edge.source, t.edge.target, t.edge.origin) for t in trace] == [
        (S.ADMITTED, S.TERMINALIZING, "docs/semantics.md §13"),
        (S.TERMINALIZING, S.ABORTED, "docs/semantics.md §3, §12"),
    ]


def test_recovery_of_an_aborted_run_terminalizes_it_aborted(log: Log) -> None:
    admit_one(log, "s1", "k1")
    run(log, "s1")
    log.commit("c1", abort(conv(log), abort_cmd("x1", "s1"), log.ref(), T0))
    log.claim("w2")  # the worker disappeared before settling
    assert conv(log).state_of("s1") is S.RECOVERY
    with pytest.raises(IllegalTransitionError):
        terminalize(conv(log), "s1", SettlementOutcome.ABORTED, T0)  # DUR-013: recovery decides first
    trace = log.append(
        "c1",
        [
            RecoveryDecision(
                submission_id="s1", decision=RecoveryDecisionKind.TERMINALIZE, reason="abort recorded", call_ids=()
            )
        ],
    )
    assert [(t.edge.source, t.edge.target) for t in trace] == [(S.RECOVERY, S.TERMINALIZING)]
    settled = terminalize(conv(log), "s1", SettlementOutcome.COMPLETED, T0)
    assert settled.settlement is not None and settled.settlement.outcome is SettlementOutcome.ABORTED
    log.commit("c1", settled)


def test_a_reserved_outcome_wins_over_a_later_terminalize_or_abort(log: Log) -> None:
    _into_unknown(log)
    decision = resolve(
        conv(log), _resolve(ResolutionKind.OUTCOME_FOR_SUBMISSION, SettlementOutcome.COMPLETED), log.ref(), T0
    )
    log.append("c1", decision.events[:1])  # the resolution alone: Terminalizing with completed reserved
    assert conv(log).state_of("s1") is S.TERMINALIZING
    with pytest.raises(TerminalOutcomeConflictError) as info:
        terminalize(conv(log), "s1", SettlementOutcome.FAILED, T0)
    assert info.value.winning_outcome is SettlementOutcome.COMPLETED and not info.value.settled
    late = abort(conv(log), abort_cmd("x1", "s1"), log.ref(), T0)
    (rejected,) = late.events
    assert isinstance(rejected, CommandRejected) and rejected.winning_outcome is SettlementOutcome.COMPLETED
    log.commit("c1", late)
    log.commit("c1", terminalize(conv(log), "s1", SettlementOutcome.COMPLETED, T0, reply_json='{"paid":true}'))
    assert conv(log).state_of("s1") is S.COMPLETED
