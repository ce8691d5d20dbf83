"""The input contract at the worker's admission (issue 25 item 1): raw inbox records through `decode_input` and
`LedgerDecider.decide`, as the worker loop runs them.

Cases from issue 25's "Why": an id holding a NUL (conversation, submission, tool name) was admitted and then killed
the projector (``PostgreSQL text fields cannot contain NUL (0x00) bytes``); ids of 3 KB and 400 KB were admitted (a
btree index row too large; a record too large for the log); an undecodable record with a 1.2 MB key was quarantined
into a decision that copied the key untruncated (as its conversation id, batch id and record keys: ``record of
4800230 bytes exceeds the limit``, a crash loop). Each must now be rejected (or quarantined) in a bounded decision.
The fault switch ``id_contract_unchecked`` (tests/fault_switches.toml) makes the first test fail.
"""

from __future__ import annotations

import pytest

from settled.processors import Decision, LedgerDecider
from settled.processors._inbox import decode_input
from settled.protocol import check_id
from settled.schemas import (
    Codec,
    InputQuarantined,
    QuarantineReason,
    ReceiptOutcome,
    SubmissionRejected,
    SubmissionRejectReason,
)
from tests._promise import promise
from tests.unit.protocol._sim import INBOX, T0, Log, proposal

CODEC = Codec()
#: What one decision about one bad input may take on the log and its side topics (keys included), in bytes.
BOUND_BYTES = 16 * 1024


@pytest.fixture
def log() -> Log:
    log = Log()
    log.claim()
    return log


def _decide(log: Log, key: bytes | None, value: bytes) -> Decision:
    inp = decode_input(CODEC, INBOX, 0, log.ref().offset, key, value, max_input_bytes=1_000_000)
    (decision,) = LedgerDecider(partition=0, partition_count=1).decide(log.state, inp, T0)
    return decision


def _written_bytes(log: Log, decision: Decision) -> int:
    """The bytes the decision's records take when appended: the batch, the side records and each one's key."""
    batch = log.seal(decision.conversation_id, decision.events)
    key = len(decision.conversation_id.encode())
    side = [*decision.receipts, *decision.settlements, *decision.quarantined]
    return len(CODEC.encode(batch)) + key + sum(len(CODEC.encode(r)) + key for r in side)


@pytest.mark.parametrize(
    ("conversation", "submission_id", "tools", "field"),
    [
        ("c\x00nul", "s1", (), "conversation_id"),
        ("c1", "s\x00nul", (), "submission_id"),
        ("c1", "s1", ("lookup", "to\x00ol"), "payload.tools_offered"),
        ("c" * 3000, "s1", (), "conversation_id"),
        ("c" * 400_000, "s1", (), "conversation_id"),
        ("c1", "s" * 3000, (), "submission_id"),
        ("c1", "s1", ("a", "a"), "payload.tools_offered"),
    ],
)
def test_an_id_breaking_the_contract_is_rejected_at_admission_in_a_bounded_decision(
    log: Log, conversation: str, submission_id: str, tools: tuple[str, ...], field: str
) -> None:
    record = proposal(submission_id, "k1", conversation_id=conversation, tools=tools)
    decision = _decide(log, conversation.encode(), CODEC.encode(record))

    rejected = decision.events[0]
    promise(
        "DUR-001.input-contract",
        isinstance(rejected, SubmissionRejected) and rejected.reason is SubmissionRejectReason.INVALID,
        f"a proposal whose {field} breaks the input contract was decided {type(rejected).__name__}, not rejected",
    )
    assert isinstance(rejected, SubmissionRejected)
    assert rejected.field == field
    (receipt,) = decision.receipts
    assert receipt.outcome is ReceiptOutcome.REJECTED
    assert receipt.reason is not None and receipt.reason.startswith(f"invalid: {field} ")
    assert decision.inputs == frozenset({rejected.input_ref.offset}) if rejected.input_ref else False
    assert decision.conversation_id == (conversation if field != "conversation_id" else "~quarantine/0")
    for text in (decision.conversation_id, rejected.submission_id, receipt.request_id, decision.submission_id or ""):
        assert check_id("written", text) is None, text
    assert _written_bytes(log, decision) < BOUND_BYTES
    log.append(decision.conversation_id, decision.events)  # the fold takes it; nothing is admitted
    assert all(not c.submissions for c in log.state.conversations.values())


def test_an_undecodable_record_with_a_1_2_mb_key_is_quarantined_in_a_bounded_decision(log: Log) -> None:
    key = b"k" * 1_200_000
    decision = _decide(log, key, b"\x7f" + b"not avro" * 100)

    (event,) = decision.events
    assert isinstance(event, InputQuarantined)
    assert event.reason is QuarantineReason.UNDECODABLE
    assert decision.conversation_id == "~quarantine/0"
    (entry,) = decision.quarantined
    assert entry.key == key[:4096] and entry.raw_size_bytes == 801
    assert _written_bytes(log, decision) < BOUND_BYTES


def test_a_decodable_record_under_a_1_2_mb_key_is_rejected_as_misrouted_in_a_bounded_decision(log: Log) -> None:
    decision = _decide(log, b"k" * 1_200_000, CODEC.encode(proposal("s1", "k1", conversation_id="c1")))

    (event,) = decision.events
    assert isinstance(event, SubmissionRejected) and event.reason is SubmissionRejectReason.MISROUTED
    assert "(1200000 bytes)" in event.detail
    assert _written_bytes(log, decision) < BOUND_BYTES


def test_a_record_that_is_not_valid_utf_8_is_quarantined_with_a_reason(log: Log) -> None:
    value = CODEC.encode(proposal("s1", "k1", conversation_id="c\u0100"))
    broken = value.replace("c\u0100".encode(), b"c\xc4\x20")  # the same length, no longer UTF-8
    assert broken != value
    decision = _decide(log, b"c1", broken)
    (event,) = decision.events
    assert isinstance(event, InputQuarantined)
    assert event.reason in (QuarantineReason.UNDECODABLE, QuarantineReason.OTHER)
    assert event.detail
