"""Conversation access at the worker's ledger for records the HTTP API signed (issue 20 item 3).

Raw inbox records, with and without the API's headers, through `decode_input` and `LedgerDecider.decide` as the
worker loop runs them, signed with real Ed25519 keys. A conversation is opened by the principal of its first admitted
submission; a signed record of another principal is decided as if nothing it names existed (``unknown_target`` for a
command, an ``unauthorized`` rejection for a submission), and its rejection is its only record. Unsigned records are
trusted as before. The fault switch ``api_access_unchecked`` (tests/fault_switches.toml) makes
`test_a_signed_command_of_another_principal_is_decided_as_for_a_missing_target` fail.
"""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from settled import protocol
from settled.client import public_key_b64
from settled.processors import Decision, LedgerDecider
from settled.processors._inbox import decode_input
from settled.processors._ledger import load_public_key
from settled.schemas import (
    AbortRecorded,
    AbortRequested,
    AccessGranted,
    AccessLevel,
    AccessRevoked,
    Codec,
    CommandRejected,
    GrantAccess,
    InboxRecord,
    ReceiptOutcome,
    RevokeAccess,
    SubmissionAdmitted,
    SubmissionRejected,
    SubmissionRejectReason,
)
from tests._promise import promise
from tests.unit.protocol._sim import INBOX, Log, abort_cmd, at, proposal

CODEC = Codec()
API_KEY = Ed25519PrivateKey.generate()
STRANGER = Ed25519PrivateKey.generate()
LEDGER = LedgerDecider(partition=0, partition_count=1, api_keys={"api-1": load_public_key(public_key_b64(API_KEY))})


def _headers(value: bytes, access: str = "owner", *, key: Ed25519PrivateKey = API_KEY) -> tuple[tuple[str, bytes], ...]:
    signature = key.sign(protocol.api_signing_bytes(value, access))
    return tuple(zip(protocol.API_HEADERS, (b"api-1", signature, access.encode()), strict=True))


def _decide(
    log: Log, record: InboxRecord, *, signed: str | None = "owner", key: Ed25519PrivateKey = API_KEY
) -> Decision:
    value = CODEC.encode(record)
    headers = () if signed is None else _headers(value, signed, key=key)
    inp = decode_input(CODEC, INBOX, 0, log.ref().offset, b"c1", value, max_input_bytes=1_000_000, headers=headers)
    (decision,) = LEDGER.decide(log.state, inp, at(5))
    return decision


def _commit(log: Log, decision: Decision) -> None:
    log.append(decision.conversation_id, decision.events)


def _as(record: AbortRequested, principal: str) -> AbortRequested:
    return record.model_copy(update={"principal": principal})


@pytest.fixture
def log() -> Log:
    """Conversation c1, opened through the API by alice (submission s1)."""
    log = Log()
    log.claim()
    opened = _decide(log, proposal("s1", "k1", principal="alice"))
    assert isinstance(opened.events[0], SubmissionAdmitted), opened.events
    _commit(log, opened)
    assert protocol.conversation_opener(log.state.conversation("c1")) == "alice"
    return log


def test_a_signed_command_of_another_principal_is_decided_as_for_a_missing_target(log: Log) -> None:
    hidden = _decide(log, _as(abort_cmd("x1", "s1"), "bob"))
    missing = _decide(log, _as(abort_cmd("x2", "no-such-submission"), "bob"))
    promise(
        "API-001.access-checked",
        [type(e) for e in hidden.events] == [CommandRejected],
        f"bob's signed abort of alice's submission was decided as {[type(e).__name__ for e in hidden.events]}",
    )
    (rejected,) = hidden.events
    (rejected_missing,) = missing.events
    assert isinstance(rejected, CommandRejected) and isinstance(rejected_missing, CommandRejected)
    assert rejected.reason == rejected_missing.reason
    assert rejected.reason.value == "unknown_target"
    (receipt,) = hidden.receipts
    (receipt_missing,) = missing.receipts
    assert receipt.outcome is ReceiptOutcome.REJECTED
    # Exactly like a missing target: the same reason, and the same detail but for the id named.
    assert (receipt.reason or "").replace("s1", "?") == (receipt_missing.reason or "").replace(
        "no-such-submission", "?"
    )


def test_the_opener_and_an_admin_token_may_act_and_unsigned_records_are_trusted(log: Log) -> None:
    # Each decided against the same state (none committed): alice's own, an admin's, and a trusted writer's abort.
    own = _decide(log, abort_cmd("a1", "s1"))  # alice, signed
    assert isinstance(own.events[0], AbortRecorded), own.events
    admin = _decide(log, _as(abort_cmd("a2", "s1"), "root"), signed="all")
    assert isinstance(admin.events[0], AbortRecorded), admin.events
    trusted = _decide(log, _as(abort_cmd("a3", "s1"), "bob"), signed=None)  # a trusted inbox writer, as today
    assert isinstance(trusted.events[0], AbortRecorded), trusted.events


def test_a_signed_submission_of_another_principal_is_rejected_and_a_new_conversation_is_opened_by_its_first(
    log: Log,
) -> None:
    other = _decide(log, proposal("s2", "k2", principal="bob"))
    assert [type(e) for e in other.events] == [SubmissionRejected], other.events
    (rejected,) = other.events
    assert isinstance(rejected, SubmissionRejected) and rejected.reason is SubmissionRejectReason.UNAUTHORIZED
    mine = _decide(log, proposal("s3", "k3", principal="alice"))
    assert isinstance(mine.events[0], SubmissionAdmitted), mine.events


def test_a_record_with_a_forged_api_signature_is_rejected(log: Log) -> None:
    forged = _decide(log, _as(abort_cmd("f1", "s1"), "alice"), key=STRANGER)
    assert [type(e) for e in forged.events] == [CommandRejected]
    (rejected,) = forged.events
    assert isinstance(rejected, CommandRejected) and rejected.reason.value == "bad_signature"
    # The signature covers the access: an owner signature replayed as "all" does not verify.
    value = CODEC.encode(_as(abort_cmd("f2", "s1"), "bob"))
    headers = tuple(
        (name, b"all" if name == protocol.API_HEADERS[2] else data) for name, data in _headers(value, "owner")
    )
    inp = decode_input(CODEC, INBOX, 0, log.ref().offset, b"c1", value, max_input_bytes=1_000_000, headers=headers)
    (decision,) = LEDGER.decide(log.state, inp, at(6))
    assert [type(e) for e in decision.events] == [CommandRejected]


def _grant(command_id: str, grantee: str, access: str = "act", *, by: str = "alice") -> GrantAccess:
    return GrantAccess(
        command_id=command_id,
        principal=by,
        conversation_id="c1",
        grantee=grantee,
        access=AccessLevel(access),
        requested_at=at(1),
    )


def _revoke(command_id: str, grantee: str, *, by: str = "alice") -> RevokeAccess:
    return RevokeAccess(command_id=command_id, principal=by, conversation_id="c1", grantee=grantee, requested_at=at(1))


def _only(decision: Decision) -> CommandRejected:
    assert [type(e) for e in decision.events] == [CommandRejected], decision.events
    (rejected,) = decision.events
    assert isinstance(rejected, CommandRejected)
    return rejected


def test_a_grant_lets_the_grantee_act_and_a_revocation_hides_the_conversation_again(log: Log) -> None:
    refused = _decide(log, _as(abort_cmd("b1", "s1"), "bob"))
    assert _only(refused).reason.value == "unknown_target"
    granted = _decide(log, _grant("g1", "bob"))
    assert [type(e) for e in granted.events] == [AccessGranted], granted.events
    assert granted.receipts[0].outcome is ReceiptOutcome.APPLIED
    _commit(log, granted)
    assert log.state.conversation("c1").access == {"bob": AccessLevel.ACT}
    again = _decide(log, _grant("g1", "bob"))  # the same command id: a duplicate, the state unchanged
    assert again.receipts[0].outcome is ReceiptOutcome.DUPLICATE
    acted = _decide(log, _as(abort_cmd("b2", "s1"), "bob"))
    assert isinstance(acted.events[0], AbortRecorded), acted.events
    submitted = _decide(log, proposal("s2", "kb", principal="bob"))
    assert isinstance(submitted.events[0], SubmissionAdmitted), submitted.events
    revoked = _decide(log, _revoke("r1", "bob"))
    assert [type(e) for e in revoked.events] == [AccessRevoked], revoked.events
    _commit(log, revoked)
    assert log.state.conversation("c1").access == {}
    after = _decide(log, _as(abort_cmd("b3", "s1"), "bob"))
    assert _only(after).reason.value == "unknown_target"  # exactly as before the grant: its rejection only
    late = _decide(log, proposal("s3", "kb2", principal="bob"))
    assert [type(e) for e in late.events] == [SubmissionRejected]


def test_a_read_grant_sees_but_may_not_act_and_only_the_opener_or_an_admin_grants(log: Log) -> None:
    _commit(log, _decide(log, _grant("g1", "carol", "read")))
    refused = _only(_decide(log, _as(abort_cmd("c1x", "s1"), "carol")))
    assert refused.reason.value == "unauthorized" and "read" in refused.detail
    submitted = _decide(log, proposal("s2", "kc", principal="carol"))
    assert [type(e) for e in submitted.events] == [SubmissionRejected]
    # A grantee (even one that may act) may not grant; a stranger's grant is as for a missing conversation.
    _commit(log, _decide(log, _grant("g2", "bob", "act")))
    by_grantee = _only(_decide(log, _grant("g3", "dave", by="bob")))
    assert by_grantee.reason.value == "unauthorized"
    by_stranger = _only(_decide(log, _grant("g4", "dave", by="eve")))
    assert by_stranger.reason.value == "unknown_target"
    by_admin = _decide(log, _grant("g5", "dave", by="root"), signed="all")
    assert [type(e) for e in by_admin.events] == [AccessGranted]
    trusted = _decide(log, _grant("g6", "dave", by="anyone"), signed=None)  # a trusted inbox writer, as documented
    assert [type(e) for e in trusted.events] == [AccessGranted]


def test_access_commands_that_name_nothing_are_rejected_with_their_reason(log: Log) -> None:
    assert _only(_decide(log, _revoke("r1", "bob"))).reason.value == "unknown_target"  # bob holds no grant
    assert _only(_decide(log, _grant("g1", "alice"))).reason.value == "invalid"  # the opener's access is its own
    unopened = GrantAccess(
        command_id="g2", principal="alice", conversation_id="c1", grantee="bob", access=AccessLevel.READ,
        requested_at=at(1),
    )  # fmt: skip
    fresh = Log()
    fresh.claim()
    assert _only(_decide(fresh, unopened)).reason.value == "unknown_target"  # nobody opened c1 there
    bad = _only(_decide(log, _grant("g3", "")))
    assert bad.reason.value == "invalid" and "grantee" in bad.detail
