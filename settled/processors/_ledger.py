"""The ledger decider: the protocol core's decisions behind the worker loop (issue 5; docs/design.md §3, §4).

`LedgerDecider` adapts `settled.protocol` (a fold over canonical batches and decisions that are functions of state
and one input) to the loop's `Decider`: admission with its key index and the pending overlay, aborts, signed
Unknown resolutions, quarantine, and misrouted records (a key that does not hash to the partition it arrived on).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from settled import protocol
from settled._faults import fault_enabled
from settled.processors._partition import Decision, InboxInput
from settled.producers import partition_for_key
from settled.protocol import ConversationState, PartitionState
from settled.protocol import Decision as ProtocolDecision
from settled.schemas import (
    RESULT_TOO_LARGE,
    AbortRequested,
    AttemptStarted,
    CommandRejectReason,
    DecideApproval,
    GrantAccess,
    InboxRecord,
    InputApplied,
    LogBatch,
    QuarantineReason,
    ResolveUnknown,
    RetrySubmission,
    RevokeAccess,
    SendSignal,
    SetLane,
    Settlement,
    SettlementOutcome,
    SteerRun,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionProposed,
    SubmissionRejectReason,
    ToolCallSettled,
    ToolError,
    canonical_json,
    json_digest,
)

__all__ = ["QUARANTINE_RAW_LIMIT_BYTES", "LedgerDecider", "load_public_key", "to_loop_decision"]

#: How much of a quarantined record's key and value the quarantine record keeps.
QUARANTINE_RAW_LIMIT_BYTES = 4096


def to_loop_decision(conversation_id: str, d: protocol.Decision, inputs: frozenset[int] = frozenset()) -> Decision:
    """Wrap a protocol decision as one canonical batch of ``conversation_id`` with its side records.

    Args:
        conversation_id: The conversation whose log the events extend.
        d: The protocol's decision.
        inputs: The inbox offsets it decides.

    Returns:
        The loop's `Decision`.
    """
    return Decision(
        conversation_id=conversation_id,
        events=d.events,
        submission_id=d.submission_id,
        receipts=(d.receipt,) if d.receipt is not None else (),
        settlements=(*((d.settlement,) if d.settlement is not None else ()), *d.joined_settlements),
        quarantined=(d.quarantine,) if d.quarantine is not None else (),
        inputs=inputs,
    )


@dataclass
class LedgerDecider:
    """Admission, aborts, resolutions and quarantine for one partition, from the protocol core.

    Attributes:
        partition: The owned partition.
        partition_count: The topics' partition count (for the misroute check, docs/design.md §2).
        resolver_keys: Ed25519 public keys allowed to sign ``ResolveUnknown`` and ``RetrySubmission`` commands, by key
            id (docs/design.md §4).
        approver_keys: Ed25519 public keys allowed to sign ``DecideApproval`` commands, by key id (issue 16 item 4).
        api_keys: Ed25519 public keys of HTTP APIs whose signed records are access-checked, by key id (issue 20;
            `settled.protocol.may_access`).
        default_lane: The app's default lane (``App(lane=...)``): recorded on the admission that opens a
            conversation whose proposal names none (issue 22 item 1).
    """

    partition: int
    partition_count: int
    resolver_keys: Mapping[str, Ed25519PublicKey] = field(default_factory=dict)
    approver_keys: Mapping[str, Ed25519PublicKey] = field(default_factory=dict)
    api_keys: Mapping[str, Ed25519PublicKey] = field(default_factory=dict)
    default_lane: protocol.LanePolicy = protocol.DEFAULT_LANE

    def initial_state(self, partition: int) -> PartitionState:
        """Return an empty partition's state."""
        return PartitionState(partition=partition)

    def fold(self, state: PartitionState, batch: LogBatch) -> PartitionState:
        """Fold one canonical batch with the protocol's fold (chain, epochs and edges checked)."""
        return protocol.apply(state, batch)

    def decide(self, state: PartitionState, inp: InboxInput, now: datetime) -> Sequence[Decision]:
        """Decide one inbox input (docs/design.md §3: exactly one log record carrying its offset).

        Args:
            state: Committed state plus the pending overlay.
            inp: The consumed record.
            now: The decision time.

        Returns:
            One decision.
        """
        inputs = frozenset({inp.offset})
        record = inp.record
        if record is None or inp.error is not None:
            conversation = protocol.conversation_for_key(inp.key, inp.partition)
            if inp.key and partition_for_key(inp.key, self.partition_count) != inp.partition:
                conversation = protocol.quarantine_conversation(inp.partition)  # its conversation lives elsewhere
            d = protocol.quarantine(
                inp.ref,
                QuarantineReason(inp.error_reason or QuarantineReason.OTHER),
                inp.error or "unknown",
                raw=inp.value or b"",
                raw_size_bytes=len(inp.value or b""),
                now=now,
                raw_limit_bytes=QUARANTINE_RAW_LIMIT_BYTES,
                key=inp.key,
            )
            return [to_loop_decision(conversation, d, inputs)]
        # Fault switch (DUR-001; tests/fault_switches.toml): the input contract is not checked at admission, so an id
        # with a NUL, a control character or 400 KB is admitted. Breaks the contract check only, on purpose.
        check_contract = not fault_enabled("id_contract_unchecked")
        # An input whose conversation id breaks the input contract is decided (rejected) under ~quarantine/<p>.
        filed_under = (
            protocol.filing_conversation(record.conversation_id, inp.partition)
            if check_contract
            else record.conversation_id
        )
        conv = state.conversation(filed_under)
        violation = protocol.check_input(record) if check_contract else None
        misrouted = None if violation is not None else self._misrouted(inp, record.conversation_id)
        if misrouted is not None:
            # The conversation lives on another partition (or the key names another one): filing the rejection under
            # it would start a second chain of that conversation here. It goes under ~quarantine/<p> instead.
            filed_under = protocol.quarantine_conversation(inp.partition)
            conv = state.conversation(filed_under)
        signed = protocol.api_signature_of(inp.headers)
        if signed is not None and violation is None and misrouted is None:
            # A record the HTTP API signed (issue 20): its principal is the caller's token's, checked against the
            # conversation's access. Unsigned records come from trusted inbox writers and are decided as before.
            refused = self._api_signature_problem(signed, inp.value or b"")
            if refused is not None:
                return [to_loop_decision(filed_under, self._refuse(conv, record, inp, now, refused), inputs)]
            # Fault switch (issue 20; tests/fault_switches.toml): the owner skips the access check, so a token of
            # another principal acts on a conversation it may not see. Breaks the access check only, on purpose.
            checked = not fault_enabled("api_access_unchecked")
            granting = isinstance(record, GrantAccess | RevokeAccess)
            sees = protocol.may_access(conv, record.principal, signed.access, acting=False)
            acts = protocol.may_access(conv, record.principal, signed.access) and (
                not granting or protocol.may_grant(conv, record.principal, signed.access)
            )
            if checked and not acts:
                refused_why = (
                    f"principal {record.principal!r} may not "
                    + ("grant or revoke access to" if granting else "act on")
                    + f" conversation {protocol.excerpt(record.conversation_id)}: "
                    + ("only its opener or an admin may" if granting else "its access is read")
                )
                if isinstance(record, SubmissionProposed):
                    d = protocol.reject_submission(
                        conv,
                        record,
                        inp.ref,
                        now,
                        reason=SubmissionRejectReason.UNAUTHORIZED,
                        field="conversation_id",
                        detail=refused_why
                        if sees
                        else f"conversation {protocol.excerpt(record.conversation_id)} is not found",
                    )
                    return [to_loop_decision(filed_under, d, inputs)]
                if sees:  # it may see the conversation, so it learns it may not act: unauthorized
                    d = protocol.reject_command(
                        conv, record, inp.ref, now, reason=CommandRejectReason.UNAUTHORIZED, detail=refused_why
                    )
                    return [to_loop_decision(filed_under, d, inputs)]
                conv = protocol.hidden(conv)  # decided exactly as if nothing it names existed: unknown_target
        if isinstance(record, SubmissionProposed):
            if misrouted is not None:
                d = protocol.reject_submission(
                    conv, record, inp.ref, now, reason=SubmissionRejectReason.MISROUTED, field="key", detail=misrouted
                )
            else:
                if fault_enabled("admission_without_key_index"):
                    # Fault switch (DUR-001; tests/fault_switches.toml): admission resolves keys against an empty
                    # key index, so a resubmitted key looks new. Breaks key resolution only, on purpose.
                    conv = dataclasses.replace(conv, key_index={})
                # Fault switch (issue 22 item 1; tests/fault_switches.toml): admission ignores the conversation's
                # lane, so every lane queues. Breaks the lane policies only, on purpose.
                d = protocol.admit(
                    conv,
                    record,
                    inp.ref,
                    now,
                    check_contract=check_contract,
                    default_lane=self.default_lane,
                    apply_lane=not fault_enabled("lane_policy_ignored"),
                )
        elif misrouted is not None:
            d = protocol.reject_command(
                conv, record, inp.ref, now, reason=CommandRejectReason.MISROUTED, detail=misrouted
            )
        elif isinstance(record, AbortRequested):
            d = protocol.abort(conv, record, inp.ref, now, check_contract=check_contract)
        elif isinstance(record, SendSignal):
            d = protocol.signal(conv, record, inp.ref, now, check_contract=check_contract)
        elif isinstance(record, SteerRun):
            d = protocol.steer(conv, record, inp.ref, now, check_contract=check_contract)
        elif isinstance(record, GrantAccess):
            d = protocol.grant_access(conv, record, inp.ref, now, check_contract=check_contract)
        elif isinstance(record, RevokeAccess):
            d = protocol.revoke_access(conv, record, inp.ref, now, check_contract=check_contract)
        elif isinstance(record, SetLane):
            # Only the opener or a principal granted act may change the lane (issue 22 item 1): an admin token of
            # the HTTP API carries access "all"; every other record is checked as its principal's own.
            lane_access = signed.access if signed is not None else protocol.ACCESS_OWNER
            d = protocol.set_lane(conv, record, inp.ref, now, access=lane_access, check_contract=check_contract)
        elif isinstance(record, ResolveUnknown):
            problem = None if violation is not None else self._signature_problem(record)
            if problem is not None:
                reason, why = problem
                d = protocol.reject_command(conv, record, inp.ref, now, reason=reason, detail=why)
            else:
                d = protocol.resolve(conv, record, inp.ref, now, check_contract=check_contract)
        elif isinstance(record, RetrySubmission):
            # Signed like a resolution (issue 22 item 4): verified against the resolver keys before deciding.
            problem = None if violation is not None else self._signature_problem(record)
            if problem is not None:
                reason, why = problem
                d = protocol.reject_command(conv, record, inp.ref, now, reason=reason, detail=why)
            else:
                d = protocol.retry_submission(conv, record, inp.ref, now, check_contract=check_contract)
        elif isinstance(record, DecideApproval):
            problem = None if violation is not None else self._signature_problem(record)
            if violation is not None:
                d = protocol.reject_invalid(conv, record, inp.ref, now, violation)
            elif problem is not None:
                reason, why = problem
                d = protocol.reject_command(conv, record, inp.ref, now, reason=reason, detail=why)
            else:
                # Fault switch (issue 16; tests/fault_switches.toml): a decision whose argument digest differs from
                # the approval's is accepted. Breaks the digest binding only, on purpose.
                check_digest = not fault_enabled("approval_digest_unchecked")
                d = protocol.decide_approval(conv, record, inp.ref, now, check_digest=check_digest)
        else:  # pragma: no cover - the codec only returns inbox types here
            raise TypeError(f"not an inbox record: {type(record).__name__}")
        return [to_loop_decision(filed_under, d, inputs)]

    def poison(
        self, state: PartitionState, decisions: Sequence[Decision], reason: str, now: datetime
    ) -> Sequence[Decision]:
        """Replace decisions that cannot be appended by typed failures deciding the same inputs (docs/design.md §3).

        An admission becomes a rejection naming the reason; a duplicate answered from the pending overlay with an
        admission replaced here becomes a rejection too (the same payload, the same failure); a settlement becomes a
        failed settlement of type ``result_too_large``. A run's record holding tool settlements (e.g. the shared
        settlement record of parallel calls) is split, one event per batch, so each call's result that fits alone is
        kept; a record holding just one tool settlement becomes that call's error result ``result_too_large``,
        naming the tool, its result's size and the reason (which names the record's size and the limit). An
        attempt start (``AttemptStarted`` + ``InputApplied``,
        deciding no input) is dropped: nothing ran yet (a run starts only once its start is committed) and the
        conductor forgets a staged start that never commits, so the scheduler decides again from what did commit.
        The conductor stages that start in the same turn as the admission or settlement before it, so it shares
        their run. Anything else cannot be replaced.

        Raises:
            ValueError: A decision that has no typed failure.
        """
        out: list[Decision] = []
        rejected: dict[str, SubmissionAdmitted] = {}
        for d in decisions:
            conv = state.conversation(d.conversation_id)
            admitted = next((e for e in d.events if isinstance(e, SubmissionAdmitted)), None)
            duplicate = next((e for e in d.events if isinstance(e, SubmissionDuplicate)), None)
            settled = next((e for e in d.events if isinstance(e, Settlement)), None)
            if admitted is not None and admitted.input_ref is not None:
                proposal = _proposal_of(admitted, now)
                r = protocol.reject_submission(
                    conv, proposal, admitted.input_ref, now, reason=SubmissionRejectReason.OTHER, detail=reason
                )
                rejected[admitted.submission_id] = admitted
                out.append(to_loop_decision(d.conversation_id, r, d.inputs))
            elif (
                duplicate is not None
                and duplicate.input_ref is not None
                and duplicate.original_submission_id in rejected
            ):
                original = rejected[duplicate.original_submission_id]
                copy = _proposal_of(original, now).model_copy(update={"submission_id": duplicate.submission_id})
                r = protocol.reject_submission(
                    conv, copy, duplicate.input_ref, now, reason=SubmissionRejectReason.OTHER, detail=reason
                )
                out.append(to_loop_decision(d.conversation_id, r, d.inputs))
            elif settled is not None:
                r = protocol.terminalize(
                    conv,
                    settled.submission_id,
                    SettlementOutcome.FAILED,
                    now,
                    error_type="result_too_large",
                    error_reason=reason,
                )
                out.append(to_loop_decision(d.conversation_id, r, d.inputs))
            elif not d.inputs and d.events and all(isinstance(e, (AttemptStarted, InputApplied)) for e in d.events):
                continue
            elif not d.inputs and any(isinstance(e, ToolCallSettled) for e in d.events):
                out.extend(_tool_settlements_replaced(d, reason))
            else:
                raise ValueError(f"no typed failure replaces {[type(e).__name__ for e in d.events]}: {reason}")
        return out

    def _api_signature_problem(self, signed: protocol.ApiSignature, value: bytes) -> tuple[str, str] | None:
        """Why the API's signature on a record is refused (reason code, detail), or ``None``."""
        if not signed.key_id or not signed.signature:
            return "unsigned", "a record with the HTTP API's headers must carry its key id and signature"
        if signed.access not in (protocol.ACCESS_OWNER, protocol.ACCESS_ALL):
            return "invalid", f"settled.api.access must be owner or all, got {protocol.excerpt(signed.access)}"
        key = self.api_keys.get(signed.key_id)
        if key is None:
            return "unknown_key", f"key id {protocol.excerpt(signed.key_id)} is not a configured API key"
        try:
            key.verify(signed.signature, protocol.api_signing_bytes(value, signed.access))
        except InvalidSignature:
            return "bad_signature", f"the signature does not verify with API key {signed.key_id!r}"
        return None

    @staticmethod
    def _refuse(
        conv: ConversationState, record: InboxRecord, inp: InboxInput, now: datetime, refused: tuple[str, str]
    ) -> ProtocolDecision:
        """Reject a record whose API signature is refused: a submission as unauthorized, a command with the reason."""
        reason, detail = refused
        if isinstance(record, SubmissionProposed):
            return protocol.reject_submission(
                conv,
                record,
                inp.ref,
                now,
                reason=SubmissionRejectReason.UNAUTHORIZED,
                field="signature",
                detail=f"{reason}: {detail}",
            )
        code = CommandRejectReason(reason) if reason in {r.value for r in CommandRejectReason} else None
        return protocol.reject_command(
            conv, record, inp.ref, now, reason=code or CommandRejectReason.INVALID, detail=detail
        )

    def _misrouted(self, inp: InboxInput, conversation_id: str) -> str | None:
        key = inp.key or b""
        if key != conversation_id.encode():
            return f"record key {protocol.excerpt(key)} is not the conversation id {conversation_id!r}"
        expected = partition_for_key(key, self.partition_count)
        if expected != inp.partition:
            return (
                f"key {conversation_id!r} hashes (murmur2) to partition {expected}, but the record arrived on "
                f"partition {inp.partition}: produce with the murmur2 partitioner (docs/design.md §2)"
            )
        return None

    def _signature_problem(
        self, command: ResolveUnknown | DecideApproval | RetrySubmission
    ) -> tuple[CommandRejectReason, str] | None:
        """Why a signature is refused, or ``None``.

        Only a configured resolver resolves (DUR-009) or retries a dead letter (issue 22 item 4), only a configured
        approver decides an approval (issue 16).
        """
        role, keys = (
            ("approver", self.approver_keys)
            if isinstance(command, DecideApproval)
            else ("resolver", self.resolver_keys)
        )
        name = type(command).__name__
        if not command.signature or not command.key_id:
            return CommandRejectReason.UNSIGNED, f"{name} must be signed (Ed25519) by a configured {role} key"
        key = keys.get(command.key_id)
        if key is None:
            return CommandRejectReason.UNKNOWN_KEY, f"key id {command.key_id!r} is not a configured {role} key"
        try:
            key.verify(command.signature, command.signing_bytes())
        except InvalidSignature:
            return (
                CommandRejectReason.BAD_SIGNATURE,
                f"the signature does not verify with {role} key {command.key_id!r}",
            )
        return None


def _tool_settlements_replaced(d: Decision, reason: str) -> list[Decision]:
    """A run's record with tool settlements, too large to append: split it, or fail its one settlement alone.

    Args:
        d: The run's decision (no inputs), holding at least one ``ToolCallSettled``.
        reason: Why it cannot be appended.

    Returns:
        One decision per event when ``d`` holds several; else the settlement as the error ``result_too_large``.
    """
    if len(d.events) > 1:
        return [dataclasses.replace(d, events=(event,)) for event in d.events]
    (settled,) = d.events
    assert isinstance(settled, ToolCallSettled)  # the caller checked
    tool = dict(d.call_tools).get(settled.call_id, "<unknown tool>")
    if settled.result_json is not None:
        recorded = settled.result_json
        digest = settled.result_digest or json_digest(recorded)
        what = "result"
    else:
        recorded = settled.error.message if settled.error is not None else ""
        digest = settled.result_digest or json_digest(canonical_json(recorded))
        what = "error"
    size_bytes = len(recorded.encode("utf-8", "surrogatepass"))
    message = f"tool {tool!r} call {settled.call_id}: its {what} of {size_bytes} bytes cannot be recorded: {reason}"
    error = ToolError(type=RESULT_TOO_LARGE, message=message, non_retryable=True)
    replaced = ToolCallSettled(
        submission_id=settled.submission_id,
        attempt_id=settled.attempt_id,
        call_id=settled.call_id,
        result_digest=digest,
        error=error,
    )
    return [dataclasses.replace(d, events=(replaced,))]


def _proposal_of(admitted: SubmissionAdmitted, now: datetime) -> SubmissionProposed:
    from settled.schemas import SubmissionPayload

    payload = SubmissionPayload(input_json=admitted.input_json, tools_offered=admitted.tools_offered)
    return SubmissionProposed(
        submission_id=admitted.submission_id,
        principal=admitted.principal,
        conversation_id=admitted.conversation_id,
        idempotency_key=admitted.idempotency_key,
        payload=payload,
        payload_digest=admitted.payload_digest,
        proposed_at=now,
    )


def load_public_key(text: str) -> Ed25519PublicKey:
    """Load an Ed25519 public key from its base64 raw 32 bytes.

    Raises:
        ValueError: The text is not 32 base64-encoded bytes.
    """
    raw = base64.b64decode(text)
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)
