"""Approval decisions at the worker's ledger (issue 16 item 4): raw inbox records through `decode_input` and
`LedgerDecider.decide`, as the worker loop runs them, signed with real Ed25519 keys.

A decision is accepted only when it is signed by a key in the worker's approver keys, names an open approval of its
own run and is bound to that approval's argument digest; every other one is rejected with its reason, and its only
records are that rejection and its receipt (the wait stays). The fault switch ``approval_digest_unchecked``
(tests/fault_switches.toml) makes `test_an_approval_for_other_arguments_is_rejected_and_changes_nothing` fail.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from settled.client import public_key_b64
from settled.processors import Decision, LedgerDecider
from settled.processors._inbox import decode_input
from settled.processors._ledger import load_public_key
from settled.protocol import Submission, SubmissionState, admit, approval_details, approval_id_for, start_attempt
from settled.protocol import arguments_digest as digest_of
from settled.schemas import (
    ApprovalDecided,
    Codec,
    CommandKind,
    CommandRejected,
    CommandRejectReason,
    DecideApproval,
    ReceiptOutcome,
    WaitKind,
    WaitRequested,
    WaitResolved,
)
from tests._promise import promise
from tests.unit.protocol._sim import INBOX, T0, Log, at, proposal

CODEC = Codec()
REFUND_ARGS = '{"order": "o-7", "amount_cents": 12000}'
APPROVER = Ed25519PrivateKey.generate()
STRANGER = Ed25519PrivateKey.generate()


LEDGER = LedgerDecider(
    partition=0, partition_count=1, approver_keys={"ops-1": load_public_key(public_key_b64(APPROVER))}
)


@pytest.fixture
def log() -> Log:
    """Runs s1 and s2 of conversation c1; s1 waits on the approval of a refund (``s1#a` + its call id)."""
    log = Log()
    log.claim()
    for sid, key in (("s1", "k1"), ("s2", "k2")):
        log.commit("c1", admit(log.state.conversation("c1"), proposal(sid, key), log.ref(), T0))
    log.commit("c1", start_attempt(log.state.conversation("c1"), "s1", "a1", log.epoch))
    request = WaitRequested(
        submission_id="s1",
        attempt_id="a1",
        wait_id=approval_id_for("s1", call_id="s1:c0"),
        kind=WaitKind.APPROVAL,
        name="refund",
        ordinal=0,
        details_json=approval_details("refund", "refund order o-7", REFUND_ARGS, tool="refund"),
    )
    log.append("c1", [request])
    return log


def _command(
    *,
    command_id: str = "d1",
    submission_id: str = "s1",
    approval_id: str = "s1#as1:c0",
    args_json: str = REFUND_ARGS,
    approved: bool = True,
    key_id: str = "ops-1",
    signer: Ed25519PrivateKey | None = APPROVER,
) -> DecideApproval:
    unsigned = DecideApproval(
        command_id=command_id,
        principal="supervisor",
        conversation_id="c1",
        submission_id=submission_id,
        approval_id=approval_id,
        args_digest=digest_of(args_json),
        approved=approved,
        reason="refund within policy",
        key_id=key_id,
        signature=b"",
        requested_at=at(5),
    )
    if signer is None:
        return unsigned
    return unsigned.model_copy(update={"signature": signer.sign(unsigned.signing_bytes())})


def _decide(log: Log, command: DecideApproval) -> Decision:
    inp = decode_input(CODEC, INBOX, 0, log.ref().offset, b"c1", CODEC.encode(command), max_input_bytes=1_000_000)
    (decision,) = LEDGER.decide(log.state, inp, at(6))
    return decision


def _run(log: Log) -> Submission:
    sub = log.state.conversation("c1").submission("s1")
    assert sub is not None
    return sub


def _commit(log: Log, decision: Decision) -> None:
    log.append(decision.conversation_id, decision.events)


def test_a_signed_approval_bound_to_the_calls_arguments_resumes_the_run_and_a_repeat_is_a_duplicate(
    log: Log,
) -> None:
    decision = _decide(log, _command())
    assert [type(e) for e in decision.events] == [ApprovalDecided, WaitResolved]
    resolved = decision.events[1]
    assert isinstance(resolved, WaitResolved) and resolved.payload_json is not None
    assert '"approved":true' in resolved.payload_json and '"by":"ops-1"' in resolved.payload_json
    assert [r.outcome for r in decision.receipts] == [ReceiptOutcome.APPLIED]
    _commit(log, decision)
    assert _run(log).state is SubmissionState.READY
    before = _run(log)
    again = _decide(log, _command())
    assert [type(e) for e in again.events] == [ApprovalDecided]
    assert [r.outcome for r in again.receipts] == [ReceiptOutcome.DUPLICATE]
    _commit(log, again)
    assert _run(log) == before


def _rejected_and_nothing_else(log: Log, command: DecideApproval) -> tuple[CommandRejected, str]:
    before = _run(log)
    decision = _decide(log, command)
    assert len(decision.events) == 1 and isinstance(decision.events[0], CommandRejected), decision.events
    rejected = decision.events[0]
    assert rejected.command_kind is CommandKind.APPROVAL
    (receipt,) = decision.receipts
    assert receipt.outcome is ReceiptOutcome.REJECTED and receipt.reason is not None
    assert not decision.settlements and not decision.quarantined
    _commit(log, decision)
    assert _run(log) == before and _run(log).waits == {"s1#as1:c0"}  # the wait stays
    return rejected, receipt.reason


def test_an_approval_for_other_arguments_is_rejected_and_changes_nothing(log: Log) -> None:
    command = _command(args_json='{"order": "o-7", "amount_cents": 99000}')
    decision = _decide(log, command)
    first = decision.events[0]
    promise(
        "WAIT-002.approval-digest-bound",
        isinstance(first, CommandRejected) and first.reason is CommandRejectReason.DIGEST_MISMATCH,
        f"an approval bound to other arguments was decided {[type(e).__name__ for e in decision.events]}",
    )
    rejected, reason = _rejected_and_nothing_else(log, command)
    assert rejected.reason is CommandRejectReason.DIGEST_MISMATCH
    assert reason.startswith("digest_mismatch: args_digest ") and digest_of(REFUND_ARGS) in reason


@pytest.mark.parametrize(
    ("make", "reason", "says"),
    [
        (lambda: _command(signer=None), CommandRejectReason.UNSIGNED, "must be signed (Ed25519)"),
        (lambda: _command(signer=STRANGER), CommandRejectReason.BAD_SIGNATURE, "does not verify with approver key"),
        (lambda: _command(key_id="ops-9"), CommandRejectReason.UNKNOWN_KEY, "'ops-9' is not a configured approver"),
        (lambda: _command(submission_id="s2"), CommandRejectReason.OTHER_RUN, "is not an approval of run 's2'"),
        (lambda: _command(approval_id="s1#w7"), CommandRejectReason.UNKNOWN_TARGET, "requested no approval"),
    ],
    ids=["unsigned", "forged", "unknown-key", "other-run", "never-requested"],
)
def test_an_unsigned_forged_or_misaddressed_approval_is_rejected_with_its_reason_and_changes_nothing(
    log: Log, make: Callable[[], DecideApproval], reason: CommandRejectReason, says: str
) -> None:
    rejected, text = _rejected_and_nothing_else(log, make())
    assert rejected.reason is reason
    assert text.startswith(f"{reason.value}: ") and says in text


def test_an_approval_after_the_wait_was_decided_is_stale(log: Log) -> None:
    _commit(log, _decide(log, _command(approved=False)))
    decision = _decide(log, _command(command_id="d2"))
    (rejected,) = decision.events
    assert isinstance(rejected, CommandRejected) and rejected.reason is CommandRejectReason.STALE
