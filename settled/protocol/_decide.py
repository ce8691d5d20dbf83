"""Decision functions: state + one input (+ time and ids) → the events to append and the side records to emit.

Each function reads a `ConversationState` (the worker passes its *scratch* state: the committed state with the
open transaction's pending batches folded in, docs/design.md §3, so one key proposed twice inside one open transaction
is admitted once) and returns a `Decision`: the log events, in order, and the receipt, settlement record or
quarantine record that must commit in the same Kafka transaction. Nothing here reads a clock, makes an id or does
I/O: ``now`` and ids are arguments (docs/design.md §1b).

Every inbox input yields exactly one log event carrying its ``input_ref`` (docs/design.md §3): `SubmissionAdmitted`,
`SubmissionDuplicate`, `SubmissionRejected`, `InputQuarantined`, `AbortRecorded`, `CommandRejected` or
`UnknownResolved`. A decision asked for an input that is already decided raises `InputAlreadyDecidedError`: the caller
skips re-read inputs (`ConversationState.is_decided`, `PartitionState.is_decided`).

Receipt reasons read ``"<code>: <detail>"``; ``<code>`` is a `SubmissionRejectReason` or `CommandRejectReason`
value (`reason_code` splits it off). A lost abort race reads ``"already_terminal: <outcome> won: ..."``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from settled.protocol._contract import (
    Violation,
    bounded_id,
    bounded_text,
    check_command,
    check_proposal,
    filing_conversation,
    quarantine_conversation,
)
from settled.protocol._errors import (
    IllegalTransitionError,
    InputAlreadyDecidedError,
    TerminalOutcomeConflictError,
    UnknownSubmissionError,
    WrongConversationError,
)
from settled.protocol._flows import flow_invocation, flow_run_id_for
from settled.protocol._fold import ConversationState, PartitionState, Submission
from settled.protocol._joining import aborted_in_group, joinable_prefix
from settled.protocol._lanes import DEFAULT_LANE, LanePolicy, lane_aborts, lane_busy, opening_lane
from settled.protocol._states import SubmissionState, outcome_state
from settled.protocol._workflows import run_control_problem
from settled.schemas import (
    AbortRecorded,
    AbortRequested,
    AttemptInterrupted,
    AttemptStarted,
    CommandKind,
    CommandRejected,
    CommandRejectReason,
    DecideApproval,
    GrantAccess,
    InputApplied,
    InputQuarantined,
    InputRef,
    LogEvent,
    OwnershipClaimed,
    QuarantineReason,
    QuarantineRecord,
    Receipt,
    ReceiptOutcome,
    RequestKind,
    ResolutionKind,
    ResolveUnknown,
    RetrySubmission,
    RevokeAccess,
    SendSignal,
    SetLane,
    Settlement,
    SettlementOutcome,
    SettlementRecord,
    SignalReceived,
    SteeringReceived,
    SteerRun,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionProposed,
    SubmissionReady,
    SubmissionRejected,
    SubmissionRejectReason,
    SubmissionsJoined,
    UnknownResolved,
    WaitKind,
    json_digest,
    payload_digest,
)

__all__ = [
    "Decision",
    "SettleAborted",
    "StartAttempt",
    "abort",
    "admit",
    "claim",
    "interrupt",
    "join",
    "quarantine",
    "reason_code",
    "reject_command",
    "reject_invalid",
    "reject_submission",
    "resolve",
    "schedule",
    "start_attempt",
    "terminalize",
]

S = SubmissionState


@dataclass(frozen=True, slots=True)
class Decision:
    """What one decision appends and emits, all in one Kafka transaction (docs/design.md §3, §4).

    Attributes:
        events: Log events for the conversation's next canonical batch, in order.
        receipt: The reply for ``settled.receipts``, when the input is a submission or a command.
        settlement: The ``settled.settlements`` record, when the decision settles a submission (issue 5 item 5:
            it commits with the canonical `Settlement`, which is the whole terminalization boundary).
        quarantine: The ``settled.quarantine`` record, when the input is set aside.
        joined_settlements: The ``settled.settlements`` records of the submissions the settled one joined (issue 22
            item 2): they settle with it, in the same batch and transaction.
    """

    events: tuple[LogEvent, ...]
    receipt: Receipt | None = None
    settlement: SettlementRecord | None = None
    quarantine: QuarantineRecord | None = None
    joined_settlements: tuple[SettlementRecord, ...] = ()

    @property
    def submission_id(self) -> str | None:
        """The submission the batch is about (the envelope's ``submission_id``), when its first event names one."""
        return getattr(self.events[0], "submission_id", None) if self.events else None


@dataclass(frozen=True, slots=True)
class StartAttempt:
    """`schedule`'s answer: start the next attempt of this submission (docs/semantics.md §5).

    Attributes:
        submission_id: The submission.
        attempt: The attempt number `start_attempt` will record.
    """

    submission_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class SettleAborted:
    """`schedule`'s answer: an inactive submission with a recorded abort settles aborted now (docs/semantics.md §13).

    Call `terminalize` with `SettlementOutcome.ABORTED`.

    Attributes:
        submission_id: The submission.
    """

    submission_id: str


def reason_code(reason: str) -> str:
    """Return the code part of a receipt reason (``"<code>: <detail>"``).

    Args:
        reason: A receipt's ``reason``.

    Returns:
        The code, e.g. ``"idempotency_conflict"``.
    """
    return reason.split(":", 1)[0]


def _reason(code: str, detail: str) -> str:
    return f"{code}: {detail}"


def check_input_undecided(state: ConversationState, conversation_id: str, input_ref: InputRef) -> None:
    """Check that ``state`` files ``conversation_id``'s inputs and ``input_ref`` is not decided yet.

    Args:
        state: The conversation's state.
        conversation_id: The input's conversation.
        input_ref: Where it was read.

    Raises:
        WrongConversationError: ``state`` is not the conversation that files it.
        InputAlreadyDecidedError: ``input_ref`` is already decided.
    """
    _check_input(state, conversation_id, input_ref)


def _check_input(state: ConversationState, conversation_id: str, input_ref: InputRef) -> None:
    if conversation_id != state.conversation_id:
        raise WrongConversationError(state.conversation_id, conversation_id)
    if state.is_decided(input_ref):
        raise InputAlreadyDecidedError(input_ref)


def _check_rejected_input(state: ConversationState, conversation_id: str, input_ref: InputRef) -> None:
    """A rejection is filed under its conversation, or under ``~quarantine/<p>``, which takes any input of ``p``."""
    if state.conversation_id == quarantine_conversation(input_ref.partition):
        if state.is_decided(input_ref):
            raise InputAlreadyDecidedError(input_ref)
        return
    _check_input(state, filing_conversation(conversation_id, input_ref.partition), input_ref)


def _get(state: ConversationState, submission_id: str) -> Submission:
    found = state.submission(submission_id)
    if found is None:
        raise UnknownSubmissionError(state.conversation_id, submission_id)
    return found


# ------------------------------------------------------------------------------------------------- admission


def admit(
    state: ConversationState,
    proposal: SubmissionProposed,
    input_ref: InputRef,
    now: datetime,
    *,
    check_contract: bool = True,
    default_lane: LanePolicy = DEFAULT_LANE,
    apply_lane: bool = True,
) -> Decision:
    """Decide a `SubmissionProposed` (DUR-001, docs/design.md §4, docs/semantics.md §4).

    In order: a proposal that breaks the input contract (`settled.protocol.check_proposal`) is rejected naming the
    field, the rule and an excerpt of the value, filed under ``~quarantine/<p>`` when its conversation id is what
    breaks it (`filing_conversation`); a ``payload_digest`` that is not the
    digest of the canonical payload (recomputed here with `settled.schemas.payload_digest`) is rejected; the key is
    resolved in scope principal + conversation: a known key with the same digest is a duplicate (a
    `SubmissionDuplicate` and a receipt pointing at the original and its sequence), with another digest a conflict
    (`SubmissionRejected` ``idempotency_conflict`` naming the key); a new key whose ``submission_id`` already names
    another submission is rejected naming ``submission_id``; a flow envelope (`settled.protocol.flow_invocation`,
    issue 18) that does not parse is rejected naming ``input``, and one naming a ``run_id`` the conversation does
    not hold ``unknown_target`` naming ``run_id``; otherwise the next submission sequence is allocated
    and `SubmissionAdmitted` + `SubmissionReady` + an admitted receipt are returned (readiness and the receipt
    commit together: DUR-001). A flow turn's admission and receipt carry its run id: the one it resumes, or the one
    minted for a turn that opens a run (`settled.protocol.flow_run_id_for`); a duplicate's receipt carries its
    original's. The admission that opens the conversation records its lane (`settled.protocol.opening_lane`: the
    proposal's ``lane``, else ``default_lane``; issue 22 item 1). The conversation's lane then decides what a new
    submission does to a busy conversation, in this same decision (`settled.protocol.lane_busy`,
    `settled.protocol.lane_aborts`): ``reject`` rejects it ``busy`` while the lane is held; ``interrupt`` records an
    `AbortRecorded` for every earlier unsettled submission, ``keep_newest`` for every queued one not started, after
    its admission. A duplicate is answered as a duplicate under every lane.

    Args:
        state: The conversation's scratch state (committed + pending; docs/design.md §3).
        proposal: The decoded, upcast proposal.
        input_ref: Where it was read.
        now: The decision time (receipt ``decided_at``).
        check_contract: Whether to check the input contract; ``False`` only under the fault switch
            ``id_contract_unchecked`` (tests/fault_switches.toml).
        default_lane: The app's default lane (``App(lane=...)``), recorded when the proposal opens the conversation
            and names no lane of its own.
        apply_lane: Whether the conversation's lane decides what the proposal does to a busy lane; ``False`` only
            under the fault switch ``lane_policy_ignored`` (tests/fault_switches.toml): every lane then queues.

    Returns:
        The decision.

    Raises:
        WrongConversationError: If ``state`` is not the conversation that files this proposal.
        InputAlreadyDecidedError: If ``input_ref`` is already decided.
    """
    violation = check_proposal(proposal) if check_contract else None
    if violation is not None:
        return reject_invalid(state, proposal, input_ref, now, violation)
    _check_input(state, proposal.conversation_id, input_ref)
    digest = payload_digest(proposal.payload)
    if digest != proposal.payload_digest:
        return reject_submission(
            state,
            proposal,
            input_ref,
            now,
            reason=SubmissionRejectReason.DIGEST_MISMATCH,
            field="payload_digest",
            detail=f"payload_digest {proposal.payload_digest} is not the canonical payload's digest {digest}",
        )
    known = state.lookup_key(proposal.principal, proposal.idempotency_key)
    if known is not None:
        if known.payload_digest != digest:
            return reject_submission(
                state,
                proposal,
                input_ref,
                now,
                reason=SubmissionRejectReason.IDEMPOTENCY_CONFLICT,
                field="idempotency_key",
                detail=(
                    f"idempotency key {proposal.idempotency_key!r} of principal {proposal.principal!r} was admitted "
                    f"as submission {known.submission_id!r} with another payload"
                ),
            )
        return Decision(
            events=(
                SubmissionDuplicate(
                    submission_id=proposal.submission_id,
                    original_submission_id=known.submission_id,
                    idempotency_key=proposal.idempotency_key,
                    input_ref=input_ref,
                ),
            ),
            receipt=Receipt(
                request_kind=RequestKind.SUBMISSION,
                request_id=proposal.submission_id,
                outcome=ReceiptOutcome.DUPLICATE,
                original_submission_id=known.submission_id,
                submission_seq=known.submission_seq,
                conversation_id=state.conversation_id,
                decided_at=now,
                run_id=_duplicate_run_id(state, proposal, known.submission_id),
            ),
        )
    if state.submission(proposal.submission_id) is not None:
        return reject_submission(
            state,
            proposal,
            input_ref,
            now,
            reason=SubmissionRejectReason.INVALID,
            field="submission_id",
            detail=f"submission_id {proposal.submission_id!r} already names a submission admitted under another key",
        )
    try:
        flow = flow_invocation(proposal.payload.input_json)
    except ValueError as exc:
        return reject_submission(
            state, proposal, input_ref, now, reason=SubmissionRejectReason.INVALID, field="input", detail=str(exc)
        )
    run_id: str | None = None
    if flow is not None and flow.run_id is not None:
        if flow.run_id not in state.flow_runs:
            # Fail-closed (issue 18): an invented run id and another conversation's get this same rejection.
            return reject_submission(
                state,
                proposal,
                input_ref,
                now,
                reason=SubmissionRejectReason.UNKNOWN_TARGET,
                field="run_id",
                detail=f"conversation {state.conversation_id!r} holds no flow run {flow.run_id!r}",
            )
        # An operator's restart opens a new run (its id minted for this turn); abandon and a resume keep the run.
        run_id = (
            flow_run_id_for(state.conversation_id, proposal.submission_id)
            if flow.operator == "restart"
            else flow.run_id
        )
    elif flow is not None:
        run_id = flow_run_id_for(state.conversation_id, proposal.submission_id)
    busy = lane_busy(state) if apply_lane else None
    if busy is not None:  # lane reject (issue 22 item 1): never admitted while the lane is held
        return reject_submission(state, proposal, input_ref, now, reason=SubmissionRejectReason.BUSY, detail=busy)
    seq = state.last_submission_seq + 1
    return Decision(
        events=(
            SubmissionAdmitted(
                submission_id=proposal.submission_id,
                conversation_id=state.conversation_id,
                principal=proposal.principal,
                idempotency_key=proposal.idempotency_key,
                payload_digest=digest,
                submission_seq=seq,
                tools_offered=proposal.payload.tools_offered,
                input_json=proposal.payload.input_json,
                input_ref=input_ref,
                flow_run_id=run_id,
                lane=opening_lane(state, proposal.lane, default_lane),
            ),
            SubmissionReady(submission_id=proposal.submission_id, submission_seq=seq),
            *(lane_aborts(state, proposal.submission_id, proposal.principal) if apply_lane else ()),
        ),
        receipt=Receipt(
            request_kind=RequestKind.SUBMISSION,
            request_id=proposal.submission_id,
            outcome=ReceiptOutcome.ADMITTED,
            submission_seq=seq,
            conversation_id=state.conversation_id,
            decided_at=now,
            run_id=run_id,
        ),
    )


def _duplicate_run_id(state: ConversationState, proposal: SubmissionProposed, original_id: str) -> str | None:
    """The flow run of a duplicate's original (its payload is the original's): resumed, or opened by the original."""
    try:
        flow = flow_invocation(proposal.payload.input_json)
    except ValueError:
        return None  # an envelope that does not parse was never admitted: no run
    if flow is None:
        return None
    if flow.run_id is not None and flow.operator != "restart":
        return flow.run_id
    return flow_run_id_for(state.conversation_id, original_id)


def reject_submission(
    state: ConversationState,
    proposal: SubmissionProposed,
    input_ref: InputRef,
    now: datetime,
    *,
    reason: SubmissionRejectReason,
    detail: str,
    field: str | None = None,
) -> Decision:
    """Reject a decodable proposal: `SubmissionRejected` + a rejected receipt (docs/design.md §4).

    `admit` uses it; the worker calls it directly for what only the shell can see (``misrouted``: the key hashes to
    another partition, docs/design.md §2). Whatever the proposal held, the rejection is bounded: ids that break the
    input contract are replaced by their excerpt (`bounded_id`) and the detail is cut (`bounded_text`).

    Args:
        state: The conversation's scratch state.
        proposal: The proposal.
        input_ref: Where it was read.
        now: The decision time.
        reason: The reason code.
        detail: Human-readable detail, naming the field or key.
        field: The offending field, when one is.

    Returns:
        The decision.

    Raises:
        WrongConversationError: If ``state`` is neither the conversation that files this proposal
            (`filing_conversation`) nor ``~quarantine/<p>`` (where the worker files what does not belong to this
            partition: ``misrouted``).
        InputAlreadyDecidedError: If ``input_ref`` is already decided.
    """
    _check_rejected_input(state, proposal.conversation_id, input_ref)
    submission_id = bounded_id(proposal.submission_id)
    detail = bounded_text(detail)
    return Decision(
        events=(
            SubmissionRejected(
                submission_id=submission_id,
                idempotency_key=bounded_id(proposal.idempotency_key),
                reason=reason,
                field=field,
                detail=detail,
                input_ref=input_ref,
            ),
        ),
        receipt=Receipt(
            request_kind=RequestKind.SUBMISSION,
            request_id=submission_id,
            outcome=ReceiptOutcome.REJECTED,
            reason=_reason(reason.value, detail),
            conversation_id=state.conversation_id,
            decided_at=now,
        ),
    )


def reject_invalid(
    state: ConversationState,
    record: SubmissionProposed
    | AbortRequested
    | ResolveUnknown
    | SendSignal
    | DecideApproval
    | GrantAccess
    | RevokeAccess
    | RetrySubmission
    | SteerRun
    | SetLane,
    input_ref: InputRef,
    now: datetime,
    violation: Violation,
) -> Decision:
    """Reject an input that breaks the input contract, naming the field, the rule and an excerpt of the value.

    Args:
        state: The scratch state of the conversation that files it (`filing_conversation`: ``~quarantine/<p>`` when
            the conversation id itself breaks the contract).
        record: The decoded input.
        input_ref: Where it was read.
        now: The decision time.
        violation: What breaks the contract (`check_proposal`, `check_command`).

    Returns:
        The decision: `SubmissionRejected` or `CommandRejected` (reason ``invalid``, ``field`` named) and a rejected
        receipt, all bounded in size whatever the input held.

    Raises:
        WrongConversationError: If ``state`` is not the conversation that files this input.
        InputAlreadyDecidedError: If ``input_ref`` is already decided.
    """
    if isinstance(record, SubmissionProposed):
        return reject_submission(
            state,
            record,
            input_ref,
            now,
            reason=SubmissionRejectReason.INVALID,
            field=violation.field,
            detail=violation.detail,
        )
    return reject_command(state, record, input_ref, now, reason=CommandRejectReason.INVALID, detail=violation.detail)


def quarantine(
    input_ref: InputRef,
    reason: QuarantineReason,
    detail: str,
    *,
    raw: bytes,
    raw_size_bytes: int,
    now: datetime,
    raw_limit_bytes: int,
    key: bytes | None = None,
) -> Decision:
    """Set aside an inbox record that cannot be decoded or is over the hard size limit (docs/design.md §4, issue 4).

    A decodable but invalid submission is rejected instead (`admit`). The caller folds `InputQuarantined` into any
    conversation's batch (the record's key when it is one, else a partition-level id); `PartitionState.is_decided`
    finds it whatever the conversation.

    Args:
        input_ref: Where it was read.
        reason: The reason code.
        detail: Human-readable detail (e.g. the decode error), cut to ``MAX_DETAIL_CHARS`` here.
        raw: The record's value (truncated here to ``raw_limit_bytes``).
        raw_size_bytes: The value's full size.
        now: The decision time.
        raw_limit_bytes: How much of ``raw`` (and ``key``) the quarantine record keeps.
        key: The record's key, when it had one.

    Returns:
        The decision: `InputQuarantined` and the quarantine record.

    Raises:
        ValueError: If ``raw_limit_bytes`` or ``raw_size_bytes`` is negative.
    """
    if raw_limit_bytes < 0:
        raise ValueError(f"raw_limit_bytes must be >= 0, got {raw_limit_bytes}")
    if raw_size_bytes < 0:
        raise ValueError(f"raw_size_bytes must be >= 0, got {raw_size_bytes}")
    detail = bounded_text(detail)
    return Decision(
        events=(InputQuarantined(reason=reason, detail=detail, raw_size_bytes=raw_size_bytes, input_ref=input_ref),),
        quarantine=QuarantineRecord(
            topic=input_ref.topic,
            partition=input_ref.partition,
            offset=input_ref.offset,
            reason=reason,
            detail=detail,
            key=None if key is None else key[:raw_limit_bytes],
            raw=raw[:raw_limit_bytes],
            raw_size_bytes=raw_size_bytes,
            quarantined_at=now,
        ),
    )


# ------------------------------------------------------------------------------------------------ scheduling


def schedule(state: ConversationState) -> StartAttempt | SettleAborted | None:
    """Return what the conversation does next (DUR-004, DUR-005, docs/semantics.md §5, §13).

    First, an inactive submission (admitted, ready, or waiting; issue 16) with a recorded abort (its own, or one of
    the submissions it joined: issue 22 item 2) settles aborted, lowest sequence first, without waiting for its turn
    (docs/semantics.md §13). Else, when the lane is held (an active submission), its next attempt starts only if it
    is back in Ready (interrupted, an Unknown resolved, its waits decided); otherwise nothing starts
    (at most one active, DUR-005). Else the queue's head starts if it is Ready (FIFO by submission sequence,
    DUR-004); settled rows (aborted ones included) are not in the queue, and an admitted-but-not-ready head blocks.

    Args:
        state: The conversation's scratch state.

    Returns:
        `SettleAborted`, `StartAttempt`, or None when nothing is to do.
    """
    for submission_id in state.queue:
        sub = state.submissions[submission_id]
        if sub.state in (S.ADMITTED, S.READY, S.WAITING) and aborted_in_group(state, sub) is not None:
            return SettleAborted(submission_id)  # with the submissions it joined, when one of them is aborted
    active = state.active()
    if active is not None:
        return StartAttempt(active.submission_id, active.attempt_count + 1) if active.state is S.READY else None
    if not state.queue:
        return None
    head = state.submissions[state.queue[0]]
    return StartAttempt(head.submission_id, head.attempt_count + 1) if head.state is S.READY else None


def start_attempt(state: ConversationState, submission_id: str, attempt_id: str, owner_epoch: int) -> Decision:
    """Start the next attempt: `AttemptStarted` (the attempt count, canonical before it runs; docs/design.md §5).

    On the submission's first attempt `InputApplied` follows: its input enters the conversation's history before
    the model can read it (docs/semantics.md §4).

    Args:
        state: The conversation's scratch state.
        submission_id: The submission `schedule` named.
        attempt_id: A new attempt id (made by the caller).
        owner_epoch: The worker's current owner epoch (the batch's).

    Returns:
        The decision.

    Raises:
        UnknownSubmissionError: If the conversation holds no such submission.
        IllegalTransitionError: If `schedule` does not name this submission to start.
    """
    sub = _get(state, submission_id)
    nxt = schedule(state)
    if not (isinstance(nxt, StartAttempt) and nxt.submission_id == submission_id):
        raise IllegalTransitionError(
            submission_id,
            sub.state,
            S.RUNNING,
            "AttemptStarted",
            f"the scheduler's next step is {nxt!r}"
            " (DUR-004 FIFO, DUR-005 one active, docs/semantics.md §13 aborts first)",
        )
    started = AttemptStarted(
        submission_id=submission_id, attempt=nxt.attempt, attempt_id=attempt_id, owner_epoch=owner_epoch
    )
    if sub.input_applied or sub.input_json is None:
        return Decision(events=(started,))
    applied = InputApplied(submission_id=submission_id, attempt_id=attempt_id, input_digest=json_digest(sub.input_json))
    return Decision(events=(started, applied))


def interrupt(state: ConversationState, submission_id: str, reason: str) -> Decision:
    """Record that a running attempt stops for an ownership change the log explains (a graceful revoke).

    Folded, it takes Running → Ready, or Running → Recovery when a call is in doubt (docs/design.md §5).

    Args:
        state: The conversation's scratch state.
        submission_id: The running submission.
        reason: Why, e.g. ``"graceful_revoke"``.

    Returns:
        The decision: one `AttemptInterrupted`.

    Raises:
        UnknownSubmissionError: If the conversation holds no such submission.
        IllegalTransitionError: If it is not running.
    """
    sub = _get(state, submission_id)
    if sub.state is not S.RUNNING or sub.attempt_id is None:
        raise IllegalTransitionError(submission_id, sub.state, S.READY, "AttemptInterrupted", "only a running attempt")
    return Decision(events=(AttemptInterrupted(submission_id=submission_id, attempt_id=sub.attempt_id, reason=reason),))


def join(state: ConversationState, submission_id: str, attempt_id: str, response_ordinal: int) -> Decision | None:
    """Decide what a running run takes in at a model boundary (issue 22 item 2, DUR-016): `SubmissionsJoined`.

    Asked by the run before a model call it makes live (never a replayed one). In a conversation whose lane is
    ``join``, the contiguous ready prefix of the submissions queued behind the run (`joinable_prefix`: an aborted and
    settled one is not in the queue and so no gap; an admitted-but-not-ready one ends it) is joined: the record
    commits before their inputs reach the model, and each then settles with the run (`terminalize`).

    Args:
        state: The conversation's scratch state.
        submission_id: The running submission (the host).
        attempt_id: Its running attempt.
        response_ordinal: The ordinal of the model call about to be made.

    Returns:
        The decision (one `SubmissionsJoined`), or None when the lane is not ``join`` or nothing is queued ready.

    Raises:
        UnknownSubmissionError: If the conversation holds no such submission.
        IllegalTransitionError: If that attempt of it is not running.
    """
    host = _get(state, submission_id)
    if host.state is not S.RUNNING or host.attempt_id != attempt_id:
        raise IllegalTransitionError(
            submission_id,
            host.state,
            S.RUNNING,
            "SubmissionsJoined",
            f"only a running attempt joins queued submissions (its attempt is {host.attempt_id!r}, not {attempt_id!r})",
        )
    if state.lane is not LanePolicy.JOIN:
        return None
    ids = joinable_prefix(state.queue, state.submissions, submission_id)
    if not ids:
        return None
    joined = SubmissionsJoined(
        submission_id=submission_id, attempt_id=attempt_id, response_ordinal=response_ordinal, joined_ids=tuple(ids)
    )
    return Decision(events=(joined,))


def claim(state: PartitionState, worker_id: str, now: datetime) -> OwnershipClaimed:
    """Return the new owner's claim, claim step 5 (docs/design.md §3): the latest claim's epoch + 1.

    The batch carrying it must have that epoch as its owner epoch; folded, every running attempt of the partition
    goes to Recovery (its worker disappeared).

    Args:
        state: The restored partition state.
        worker_id: The claiming worker.
        now: The claim time.

    Returns:
        The `OwnershipClaimed` event.
    """
    return OwnershipClaimed(
        partition=state.partition, owner_epoch=state.claim_epoch + 1, worker_id=worker_id, claimed_at=now
    )


# -------------------------------------------------------------------------------------------- terminalization


def _settle(
    state: ConversationState,
    sub: Submission,
    outcome: SettlementOutcome,
    now: datetime,
    *,
    reply_json: str | None = None,
    reply_digest: str | None = None,
    reply_ref: str | None = None,
    error_type: str | None = None,
    error_reason: str | None = None,
    joined_to: str | None = None,
) -> tuple[Settlement, SettlementRecord]:
    if reply_json is not None and reply_digest is None:
        reply_digest = json_digest(reply_json)
    settlement = Settlement(
        submission_id=sub.submission_id,
        outcome=outcome,
        reply_json=reply_json,
        reply_digest=reply_digest,
        reply_ref=reply_ref,
        error_type=error_type,
        error_reason=error_reason,
        attempt_count=sub.attempt_count,
        settled_at=now,
        joined_to=joined_to,
    )
    record = SettlementRecord(
        conversation_id=state.conversation_id,
        submission_id=sub.submission_id,
        submission_seq=sub.submission_seq,
        outcome=outcome,
        reply_json=reply_json,
        reply_digest=reply_digest,
        reply_ref=reply_ref,
        error_type=error_type,
        error_reason=error_reason,
        attempt_count=sub.attempt_count,
        settled_at=now,
        joined_to=joined_to,
    )
    return settlement, record


def _settle_with_joined(
    state: ConversationState,
    sub: Submission,
    outcome: SettlementOutcome,
    now: datetime,
    *,
    reply_json: str | None = None,
    reply_digest: str | None = None,
    reply_ref: str | None = None,
    error_type: str | None = None,
    error_reason: str | None = None,
) -> tuple[tuple[Settlement, ...], SettlementRecord, tuple[SettlementRecord, ...]]:
    """Settle ``sub`` and, right after it, each submission it joined, with its outcome and reply (issue 22 item 2).

    Returns:
        The settlements (the host's first), the host's settlement record, the joined ones' records.
    """
    kept = {
        "reply_json": reply_json,
        "reply_digest": reply_digest,
        "reply_ref": reply_ref,
        "error_type": error_type,
        "error_reason": error_reason,
    }
    settlement, record = _settle(state, sub, outcome, now, **kept)
    events = [settlement]
    records = []
    for joined_id in sub.joined:
        e, r = _settle(state, state.submissions[joined_id], outcome, now, joined_to=sub.submission_id, **kept)
        events.append(e)
        records.append(r)
    return tuple(events), record, tuple(records)


def _abort_reason(sub: Submission) -> str:
    return sub.abort_reason if sub.abort_reason else "aborted by request"


def terminalize(
    state: ConversationState,
    submission_id: str,
    outcome: SettlementOutcome,
    now: datetime,
    *,
    reply_json: str | None = None,
    reply_digest: str | None = None,
    reply_ref: str | None = None,
    error_type: str | None = None,
    error_reason: str | None = None,
) -> Decision:
    """Settle a submission: the canonical `Settlement` and its ``settled.settlements`` record (DUR-011).

    See docs/semantics.md §12.

    The spec's reserve → canonical append → ledger finalize spans separate stores; here the `Settlement` and the
    settlements record commit in one Kafka transaction, which is the whole boundary (issue 5 item 5). The lane is
    released when the settlement is folded.

    An abort recorded before the settlement wins (DUR-012, docs/semantics.md §13: the abort became canonical first and
    its receipt said ``applied``): whatever ``outcome`` is asked, the settlement is ``aborted`` with the abort's reason
    and no reply; read the outcome from ``Decision.settlement``.

    Args:
        state: The conversation's scratch state.
        submission_id: The submission.
        outcome: The outcome the run decided.
        now: Settlement time.
        reply_json: Final reply or return value, canonical JSON, when inline.
        reply_digest: Its digest (computed from ``reply_json`` when not given; required with ``reply_ref``).
        reply_ref: Where an over-limit reply is found (the caller stores it first).
        error_type: For failed: the error type.
        error_reason: For failed or aborted: the reason.

    Returns:
        The decision: one `Settlement` and the settlement record.

    Raises:
        UnknownSubmissionError: If the conversation holds no such submission.
        TerminalOutcomeConflictError: If the submission is already settled, or another outcome is reserved.
        IllegalTransitionError: If its state does not allow settling (e.g. queued without an abort, Unknown, Recovery).
    """
    sub = _get(state, submission_id)
    if sub.outcome is not None:
        raise TerminalOutcomeConflictError(submission_id, sub.outcome, outcome, settled=True)
    if sub.joined_to is not None:
        raise IllegalTransitionError(
            submission_id,
            sub.state,
            outcome_state(outcome),
            "Settlement",
            f"joined into run {sub.joined_to!r}: it settles only with its host (issue 22 item 2)",
        )
    aborted = aborted_in_group(state, sub)
    if aborted is not None:
        outcome = SettlementOutcome.ABORTED
        reply_json = reply_digest = reply_ref = error_type = None
        error_reason = _abort_reason(aborted)
    elif sub.reserved_outcome is not None and sub.reserved_outcome is not outcome:
        raise TerminalOutcomeConflictError(submission_id, sub.reserved_outcome, outcome, settled=False)
    settles_inactive = sub.state in (S.ADMITTED, S.READY, S.WAITING) and outcome is SettlementOutcome.ABORTED
    if not (sub.state in (S.RUNNING, S.TERMINALIZING, S.JOINED) or settles_inactive):
        raise IllegalTransitionError(
            submission_id,
            sub.state,
            outcome_state(outcome),
            "Settlement",
            "a submission settles when running, terminalizing or joined, or aborted while inactive"
            " (docs/semantics.md §3, §13)",
        )
    settlements, record, joined = _settle_with_joined(
        state,
        sub,
        outcome,
        now,
        reply_json=reply_json,
        reply_digest=reply_digest,
        reply_ref=reply_ref,
        error_type=error_type,
        error_reason=error_reason,
    )
    return Decision(events=settlements, settlement=record, joined_settlements=joined)


# ------------------------------------------------------------------------------------------------------ commands


def reject_command(
    state: ConversationState,
    command: AbortRequested
    | ResolveUnknown
    | SendSignal
    | DecideApproval
    | GrantAccess
    | RevokeAccess
    | RetrySubmission
    | SteerRun
    | SetLane,
    input_ref: InputRef,
    now: datetime,
    *,
    reason: CommandRejectReason,
    detail: str,
    winning_outcome: SettlementOutcome | None = None,
) -> Decision:
    """Reject a command: `CommandRejected` + a rejected receipt, nothing else (docs/design.md §4; issue 5 items 6, 7).

    `abort` and `resolve` use it; the worker calls it directly for a forged or unsigned resolution
    (``bad_signature``, ``unsigned``, ``unknown_key``) or a misrouted command. Bounded like `reject_submission`.

    Args:
        state: The conversation's scratch state.
        command: The command.
        input_ref: Where it was read.
        now: The decision time.
        reason: The reason code.
        detail: Human-readable detail.
        winning_outcome: For ``already_terminal``: the outcome that won (DUR-012).

    Returns:
        The decision.

    Raises:
        WrongConversationError: If ``state`` is neither the conversation that files this command (`filing_conversation`)
            nor ``~quarantine/<p>``.
        InputAlreadyDecidedError: If ``input_ref`` is already decided.
    """
    _check_rejected_input(state, command.conversation_id, input_ref)
    kind = (
        CommandKind.ABORT
        if isinstance(command, AbortRequested)
        else CommandKind.SIGNAL
        if isinstance(command, SendSignal)
        else CommandKind.APPROVAL
        if isinstance(command, DecideApproval)
        else CommandKind.ACCESS
        if isinstance(command, GrantAccess | RevokeAccess)
        else CommandKind.RETRY
        if isinstance(command, RetrySubmission)
        else CommandKind.STEER
        if isinstance(command, SteerRun)
        else CommandKind.LANE
        if isinstance(command, SetLane)
        else CommandKind.RESOLVE_UNKNOWN
    )
    target = None if isinstance(command, GrantAccess | RevokeAccess | SetLane) else bounded_id(command.submission_id)
    command_id = bounded_id(command.command_id)
    detail = bounded_text(detail)
    return Decision(
        events=(
            CommandRejected(
                command_id=command_id,
                command_kind=kind,
                submission_id=target,
                reason=reason,
                detail=detail,
                winning_outcome=winning_outcome,
                input_ref=input_ref,
            ),
        ),
        receipt=_command_receipt(state, command_id, ReceiptOutcome.REJECTED, now, _reason(reason.value, detail)),
    )


def _command_receipt(
    state: ConversationState, command_id: str, outcome: ReceiptOutcome, now: datetime, reason: str | None = None
) -> Receipt:
    return command_receipt(state, command_id, outcome, now, reason)


def command_receipt(
    state: ConversationState, command_id: str, outcome: ReceiptOutcome, now: datetime, reason: str | None = None
) -> Receipt:
    """Return a command's receipt (applied, duplicate or rejected) for the conversation.

    Args:
        state: The conversation's state.
        command_id: The command answered.
        outcome: The receipt's outcome.
        now: The decision time.
        reason: For a rejection: ``"<code>: <detail>"``.

    Returns:
        The receipt.
    """
    return Receipt(
        request_kind=RequestKind.COMMAND,
        request_id=command_id,
        outcome=outcome,
        reason=reason,
        conversation_id=state.conversation_id,
        decided_at=now,
    )


def recorded_command(state: ConversationState, command_id: str, event: LogEvent, now: datetime) -> Decision:
    """Return an accepted command's decision: its one record and its receipt.

    The receipt is ``applied`` the first time and ``duplicate`` when ``command_id`` was already applied (the record is
    then written again with its new ``input_ref``: it changes nothing).

    Args:
        state: The conversation's state.
        command_id: The command answered.
        event: The command's record (e.g. `SignalReceived`, `AccessGranted`).
        now: The decision time.

    Returns:
        The decision.
    """
    outcome = ReceiptOutcome.DUPLICATE if command_id in state.applied_commands else ReceiptOutcome.APPLIED
    return Decision(events=(event,), receipt=command_receipt(state, command_id, outcome, now))


def _precheck_command(
    state: ConversationState,
    command: AbortRequested | ResolveUnknown | SendSignal | SteerRun,
    input_ref: InputRef,
    now: datetime,
    check_contract: bool,
) -> Decision | Submission:
    """Shared checks: the input contract, a repeated command id, an unknown target, a settled target.

    Returns the target if none hit.
    """
    violation = check_command(command) if check_contract else None
    if violation is not None:
        return reject_invalid(state, command, input_ref, now, violation)
    _check_input(state, command.conversation_id, input_ref)
    previous_target = state.applied_commands.get(command.command_id)
    if previous_target is not None and previous_target != command.submission_id:
        return reject_command(
            state,
            command,
            input_ref,
            now,
            reason=CommandRejectReason.INVALID,
            detail=f"command_id {command.command_id!r} was already applied to submission {previous_target!r}",
        )
    sub = state.submission(command.submission_id)
    if sub is None:
        return reject_command(
            state,
            command,
            input_ref,
            now,
            reason=CommandRejectReason.UNKNOWN_TARGET,
            detail=f"conversation {state.conversation_id!r} has no submission {command.submission_id!r}",
        )
    if previous_target is None and sub.outcome is not None:
        return reject_command(
            state,
            command,
            input_ref,
            now,
            reason=CommandRejectReason.ALREADY_TERMINAL,
            detail=f"{sub.outcome.value} won: submission {sub.submission_id!r} settled {sub.outcome.value} first",
            winning_outcome=sub.outcome,
        )
    return sub


def abort(
    state: ConversationState,
    command: AbortRequested,
    input_ref: InputRef,
    now: datetime,
    *,
    check_contract: bool = True,
) -> Decision:
    """Decide an `AbortRequested` (DUR-012, docs/semantics.md §13).

    * unknown target → `CommandRejected` ``unknown_target`` and nothing else;
    * the same command again (its id already applied) → a duplicate receipt; the log gets the same `AbortRecorded`
      again with the new ``input_ref`` (it changes nothing; it records that input as decided);
    * target settled → `CommandRejected` ``already_terminal`` naming the winning outcome (a completed or failed
      submission cannot later become aborted);
    * target with another outcome reserved (Terminalizing) → the same rejection naming the reserved outcome;
    * target admitted, ready or waiting (queued, never claimed, between attempts, or waiting: no attempt runs)
      → `AbortRecorded` and an aborted
      `Settlement` at once, without an attempt or waiting for its turn, + the settlement record + applied receipt;
    * target active (running, in recovery, Unknown, terminalizing without a reserved outcome, joining, joined) →
      `AbortRecorded` (canonical before the worker is interrupted) + applied receipt. The worker then interrupts
      the attempt and settles aborted (`terminalize`); recovery and resolutions settle it aborted later.

    Args:
        state: The conversation's scratch state.
        command: The decoded command.
        input_ref: Where it was read.
        now: The decision time.
        check_contract: Whether to check the input contract first (`check_command`: a breach is rejected
            ``invalid`` naming the field); ``False`` only under the fault switch ``id_contract_unchecked``.

    Returns:
        The decision.

    Raises:
        WrongConversationError: If ``state`` is not the conversation that files this command (`filing_conversation`).
        InputAlreadyDecidedError: If ``input_ref`` is already decided.
    """
    checked = _precheck_command(state, command, input_ref, now, check_contract)
    if isinstance(checked, Decision):
        return checked
    sub = checked
    recorded = AbortRecorded(
        command_id=command.command_id,
        submission_id=command.submission_id,
        principal=command.principal,
        reason=command.reason,
        input_ref=input_ref,
    )
    if command.command_id in state.applied_commands:
        return Decision(
            events=(recorded,), receipt=_command_receipt(state, command.command_id, ReceiptOutcome.DUPLICATE, now)
        )
    if sub.reserved_outcome is not None and sub.reserved_outcome is not SettlementOutcome.ABORTED:
        return reject_command(
            state,
            command,
            input_ref,
            now,
            reason=CommandRejectReason.ALREADY_TERMINAL,
            detail=f"{sub.reserved_outcome.value} won: submission {sub.submission_id!r} is terminalizing",
            winning_outcome=sub.reserved_outcome,
        )
    applied = _command_receipt(state, command.command_id, ReceiptOutcome.APPLIED, now)
    if sub.state in (S.ADMITTED, S.READY, S.WAITING):
        reason = command.reason if command.reason else (sub.abort_reason or "aborted by request")
        settlements, record, joined = _settle_with_joined(
            state, sub, SettlementOutcome.ABORTED, now, error_reason=reason
        )
        return Decision(events=(recorded, *settlements), receipt=applied, settlement=record, joined_settlements=joined)
    return Decision(events=(recorded,), receipt=applied)


def signal(
    state: ConversationState,
    command: SendSignal,
    input_ref: InputRef,
    now: datetime,
    *,
    check_contract: bool = True,
) -> Decision:
    """Decide a `SendSignal` (issue 16): accepted for an unsettled run whatever it waits for at that moment.

    * unknown run → `CommandRejected` ``unknown_target``; settled run → ``already_terminal`` naming its outcome:
      a rejection's only records are that decision and its receipt (docs/design.md §3);
    * the same signal id again → the same `SignalReceived` again with the new ``input_ref`` (it changes nothing)
      and a duplicate receipt;
    * a workflow run's pause or resume the run cannot take (`run_control_problem`: not a workflow run, a resume of a
      run not paused, a pause of a paused one) → `CommandRejected` with that reason and its receipt;
    * otherwise `SignalReceived` + applied receipt. The owner then delivers it to the run's first open wait with its
      name (`deliveries`), in a later decision, once it is canonical.

    Args:
        state: The conversation's scratch state.
        command: The decoded command.
        input_ref: Where it was read.
        now: The decision time.
        check_contract: Whether to check the input contract first (`check_command`).

    Returns:
        The decision.

    Raises:
        WrongConversationError: If ``state`` is not the conversation that files this command (`filing_conversation`).
        InputAlreadyDecidedError: If ``input_ref`` is already decided.
    """
    checked = _precheck_command(state, command, input_ref, now, check_contract)
    if isinstance(checked, Decision):
        return checked
    control = None if command.command_id in state.applied_commands else run_control_problem(checked, command.name)
    if control is not None:
        reason, detail = control
        return reject_command(state, command, input_ref, now, reason=reason, detail=detail)
    received = SignalReceived(
        command_id=command.command_id,
        submission_id=command.submission_id,
        name=command.name,
        payload_json=command.payload_json,
        principal=command.principal,
        input_ref=input_ref,
    )
    return recorded_command(state, command.command_id, received, now)


def steer(
    state: ConversationState,
    command: SteerRun,
    input_ref: InputRef,
    now: datetime,
    *,
    check_contract: bool = True,
) -> Decision:
    """Decide a `SteerRun` (issue 22 item 3): a steering message joins an unsettled run's ordered steering stream.

    * unknown run → `CommandRejected` ``unknown_target``; settled run → ``already_terminal`` naming its outcome:
      a rejection's only records are that decision and its receipt (docs/design.md §3);
    * the same command id again → the same `SteeringReceived` again with the new ``input_ref`` (it changes
      nothing: the stream holds the message once) and a duplicate receipt;
    * otherwise `SteeringReceived` + applied receipt. The run's next model call shows it to the model (the runtime
      reads it from the committed journal), so it is canonical before it affects the run.

    Args:
        state: The conversation's scratch state.
        command: The decoded command.
        input_ref: Where it was read.
        now: The decision time.
        check_contract: Whether to check the input contract first (`check_command`).

    Returns:
        The decision.

    Raises:
        WrongConversationError: If ``state`` is not the conversation that files this command (`filing_conversation`).
        InputAlreadyDecidedError: If ``input_ref`` is already decided.
    """
    checked = _precheck_command(state, command, input_ref, now, check_contract)
    if isinstance(checked, Decision):
        return checked
    received = SteeringReceived(
        command_id=command.command_id,
        submission_id=command.submission_id,
        text=command.text,
        principal=command.principal,
        input_ref=input_ref,
    )
    return recorded_command(state, command.command_id, received, now)


def resolve(
    state: ConversationState,
    command: ResolveUnknown,
    input_ref: InputRef,
    now: datetime,
    *,
    check_contract: bool = True,
) -> Decision:
    """Decide a `ResolveUnknown` whose signature the caller has verified (docs/design.md §4, §5; DUR-009).

    The worker verifies the Ed25519 signature first and answers a forged or unsigned command with
    `reject_command`. Then: unknown target → ``unknown_target``; settled target → ``already_terminal`` naming the
    winner; the same command again → duplicate receipt (the same `UnknownResolved` again with the new
    ``input_ref``); a call that is not Unknown → ``not_unknown``. Otherwise `UnknownResolved` + applied receipt;
    ``outcome_for_submission`` also settles the submission in the same batch (Unknown → Terminalizing → outcome;
    aborted when an abort was recorded, docs/design.md §5), ``call_outcome`` / ``safe_to_retry`` make it Ready once its
    last Unknown call is resolved.

    Args:
        state: The conversation's scratch state.
        command: The verified command.
        input_ref: Where it was read.
        now: The decision time.
        check_contract: Whether to check the input contract first (`check_command`: a breach is rejected
            ``invalid`` naming the field); ``False`` only under the fault switch ``id_contract_unchecked``.

    Returns:
        The decision.

    Raises:
        WrongConversationError: If ``state`` is not the conversation that files this command (`filing_conversation`).
        InputAlreadyDecidedError: If ``input_ref`` is already decided.
    """
    checked = _precheck_command(state, command, input_ref, now, check_contract)
    if isinstance(checked, Decision):
        return checked
    sub = checked
    result_digest = None if command.result_json is None else json_digest(command.result_json)
    resolved = UnknownResolved(
        command_id=command.command_id,
        submission_id=command.submission_id,
        call_id=command.call_id,
        kind=command.kind,
        outcome=command.outcome,
        result_json=command.result_json,
        result_digest=result_digest,
        principal=command.principal,
        key_id=command.key_id,
        input_ref=input_ref,
    )
    if command.command_id in state.applied_commands:
        return Decision(
            events=(resolved,), receipt=_command_receipt(state, command.command_id, ReceiptOutcome.DUPLICATE, now)
        )
    if sub.suspended_on(command.call_id) is not WaitKind.UNKNOWN:  # the delivery of a wait of kind unknown
        return reject_command(
            state,
            command,
            input_ref,
            now,
            reason=CommandRejectReason.NOT_UNKNOWN,
            detail=f"call {command.call_id!r} of submission {sub.submission_id!r} ({sub.state.value}) is not Unknown",
        )
    applied = _command_receipt(state, command.command_id, ReceiptOutcome.APPLIED, now)
    if command.kind is not ResolutionKind.OUTCOME_FOR_SUBMISSION or command.outcome is None:
        return Decision(events=(resolved,), receipt=applied)
    aborted = aborted_in_group(state, sub)
    if aborted is not None:
        settlements, record, joined = _settle_with_joined(
            state, sub, SettlementOutcome.ABORTED, now, error_reason=_abort_reason(aborted)
        )
    else:
        by = f"resolved by {command.principal} (key {command.key_id}, command {command.command_id})"
        failed = command.outcome is SettlementOutcome.FAILED
        settlements, record, joined = _settle_with_joined(
            state,
            sub,
            command.outcome,
            now,
            reply_json=command.result_json if command.outcome is SettlementOutcome.COMPLETED else None,
            error_type="UnknownResolved" if failed else None,
            error_reason=None if command.outcome is SettlementOutcome.COMPLETED else by,
        )
    return Decision(events=(resolved, *settlements), receipt=applied, settlement=record, joined_settlements=joined)
