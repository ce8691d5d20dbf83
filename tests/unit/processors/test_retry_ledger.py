"""``settled retry`` at the worker's ledger (issue 22 item 4): the signature, then the pure decision.

Raw inbox records through `decode_input` and `LedgerDecider.decide` as the worker loop runs them, signed with real
Ed25519 keys. A `RetrySubmission` is verified against the resolver keys (``App.resolver_keys``), like a
`ResolveUnknown`: unsigned, an unknown key id or a forged signature is rejected and nothing is admitted; the
resolver's signature reaches `settled.protocol.retry_submission`.
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
    Codec,
    CommandKind,
    CommandRejected,
    ReceiptOutcome,
    RetrySubmission,
    SettlementOutcome,
    SubmissionAdmitted,
)
from tests.unit.protocol._sim import INBOX, T0, Log, at, proposal

CODEC = Codec()
RESOLVER = Ed25519PrivateKey.generate()
LEDGER = LedgerDecider(
    partition=0, partition_count=1, resolver_keys={"ops-1": load_public_key(public_key_b64(RESOLVER))}
)


def _retry(key: Ed25519PrivateKey | None = RESOLVER, key_id: str = "ops-1") -> RetrySubmission:
    fields = {
        "command_id": "r1",
        "principal": "ops",
        "conversation_id": "c1",
        "submission_id": "s1",
        "new_submission_id": "s1-retry",
        "key_id": key_id,
        "requested_at": T0,
    }
    unsigned = RetrySubmission(**fields, signature=b"")
    return RetrySubmission(**fields, signature=b"" if key is None else key.sign(unsigned.signing_bytes()))


def _decide(log: Log, record: RetrySubmission) -> Decision:
    value = CODEC.encode(record)
    inp = decode_input(CODEC, INBOX, 0, log.ref().offset, b"c1", value, max_input_bytes=1_000_000)
    assert inp.record == record  # the codec carries every field
    (decision,) = LEDGER.decide(log.state, inp, at(5))
    return decision


@pytest.fixture
def log() -> Log:
    """c1: s1 ran once and settled failed retry_budget_exhausted (a dead letter)."""
    log = Log()
    log.claim()
    conv = log.state.conversation("c1")
    log.commit("c1", protocol.admit(conv, proposal("s1", "k1"), log.ref(), T0))
    log.commit("c1", protocol.start_attempt(log.state.conversation("c1"), "s1", "a1", 1))
    log.commit(
        "c1",
        protocol.terminalize(
            log.state.conversation("c1"),
            "s1",
            SettlementOutcome.FAILED,
            at(1),
            error_type=protocol.RETRY_BUDGET_EXHAUSTED,
            error_reason=protocol.dead_letter_reason(1, 1, "WorkerDied: attempt 1"),
        ),
    )
    return log


@pytest.mark.parametrize(
    ("key", "key_id", "reason", "detail"),
    [
        (None, "ops-1", "unsigned", "RetrySubmission must be signed (Ed25519) by a configured resolver key"),
        (RESOLVER, "someone", "unknown_key", "key id 'someone' is not a configured resolver key"),
        (Ed25519PrivateKey.generate(), "ops-1", "bad_signature", "does not verify with resolver key 'ops-1'"),
    ],
)
def test_an_unsigned_unknown_or_forged_retry_is_rejected_and_admits_nothing(
    log: Log, key: Ed25519PrivateKey | None, key_id: str, reason: str, detail: str
) -> None:
    decision = _decide(log, _retry(key, key_id))
    (event,) = decision.events
    assert isinstance(event, CommandRejected), decision.events
    assert (event.command_kind, event.reason.value, event.submission_id) == (CommandKind.RETRY, reason, "s1")
    assert detail in event.detail
    (receipt,) = decision.receipts
    assert receipt.outcome is ReceiptOutcome.REJECTED and (receipt.reason or "").startswith(reason)


def test_the_resolvers_signature_admits_the_dead_letter_again(log: Log) -> None:
    decision = _decide(log, _retry())
    admitted = decision.events[0]
    assert isinstance(admitted, SubmissionAdmitted), decision.events
    assert (admitted.submission_id, admitted.retry_of, admitted.submission_seq) == ("s1-retry", "s1", 2)
    (receipt,) = decision.receipts
    assert (receipt.outcome, receipt.original_submission_id) == (ReceiptOutcome.APPLIED, "s1-retry")
