"""The input contract (settled/protocol/_contract.py; issue 25 item 1): its rules, boundaries and bounded excerpts.

The admission decisions reject what breaks it, naming the field, the rule and an excerpt; whatever the input held, the
rejection is bounded and files under ``~quarantine/<p>`` when the conversation id is what breaks the contract.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from settled.protocol import (
    MAX_DETAIL_CHARS,
    MAX_ID_CHARS,
    MAX_TOOLS_OFFERED,
    abort,
    admit,
    bounded_id,
    bounded_text,
    check_command,
    check_id,
    check_proposal,
    conversation_for_key,
    excerpt,
    filing_conversation,
)
from settled.schemas import (
    Codec,
    CommandRejected,
    ReceiptOutcome,
    SendSignal,
    SubmissionAdmitted,
    SubmissionRejected,
    SubmissionRejectReason,
)
from tests.unit.protocol._sim import T0, Log, abort_cmd, proposal

CODEC = Codec()
#: Characters an id may hold: anything but a control character (Cc) or a surrogate (Cs).
ALLOWED = st.characters(exclude_categories=("Cc", "Cs"))


@pytest.fixture
def log() -> Log:
    log = Log()
    log.claim()
    return log


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("", "is empty"),
        ("   ", "is only whitespace"),
        ("x" * (MAX_ID_CHARS + 1), f"is longer than {MAX_ID_CHARS} characters (257 characters)"),
        ("ab\x00c", "contains a NUL character at index 2"),
        ("ab\ud800", "contains a lone surrogate U+D800 at index 2"),
        ("\udcff", "contains a lone surrogate U+DCFF at index 0"),
        ("a\nb", "contains the control character U+000A at index 1"),
        ("a\x7f", "contains the control character U+007F at index 1"),
        ("a\x9f", "contains the control character U+009F at index 1"),
    ],
)
def test_an_id_breaking_a_rule_is_named_with_the_rule(value: str, rule: str) -> None:
    violation = check_id("conversation_id", value)
    assert violation is not None
    assert (violation.field, violation.rule) == ("conversation_id", rule)
    assert violation.detail.startswith(f"conversation_id {rule}: ")


@given(st.text(ALLOWED, min_size=1, max_size=MAX_ID_CHARS).filter(str.strip))
def test_every_other_unicode_character_is_allowed_up_to_256_characters(value: str) -> None:
    assert check_id("submission_id", value) is None
    assert bounded_id(value) == value


def test_the_boundary_lengths() -> None:
    assert check_id("idempotency_key", "k") is None
    assert check_id("idempotency_key", "é" * MAX_ID_CHARS) is None
    assert check_id("idempotency_key", "\U0001f600" * MAX_ID_CHARS) is None  # characters, not UTF-8 bytes or UTF-16
    assert check_id("idempotency_key", "\U0001f600" * (MAX_ID_CHARS + 1)) is not None


@given(st.text(max_size=2000) | st.binary(max_size=5000))
def test_an_excerpt_is_bounded_and_keeps_the_id_rules(value: str | bytes) -> None:
    quoted = excerpt(value)
    assert check_id("excerpt", quoted) is None, quoted
    assert len(quoted) <= MAX_ID_CHARS


def test_an_excerpt_names_the_full_size() -> None:
    assert excerpt("abc") == "'abc'"
    assert excerpt("x" * 400_000).endswith("… (400000 characters)")
    assert excerpt(b"\xff" * 1_200_000).endswith("… (1200000 bytes)")


@given(st.text(max_size=3 * MAX_DETAIL_CHARS))
def test_a_bounded_detail_has_no_nul_and_is_cut(value: str) -> None:
    detail = bounded_text(value)
    assert "\x00" not in detail
    assert len(detail) <= MAX_DETAIL_CHARS + 200
    detail.encode("utf-8")  # no lone surrogate left


def test_tool_names_are_ids_that_do_not_repeat() -> None:
    for tools, rule in [
        (("a", "a"), "name 1 repeats an earlier name"),
        (("",), "name 0 is empty"),
        (("ok", "t\x00"), "name 1 contains a NUL character at index 1"),
        (tuple(f"t{i}" for i in range(MAX_TOOLS_OFFERED + 1)), f"holds more than {MAX_TOOLS_OFFERED} names (257)"),
    ]:
        violation = check_proposal(proposal("s1", "k1", tools=tools))
        assert violation is not None
        assert (violation.field, violation.rule) == ("payload.tools_offered", rule)
    assert check_proposal(proposal("s1", "k1", tools=tuple(f"t{i}" for i in range(MAX_TOOLS_OFFERED)))) is None


def test_reserved_conversation_prefixes_are_refused() -> None:
    for cid in ("~partition/0", "~quarantine/3"):
        violation = check_proposal(proposal("s1", "k1", conversation_id=cid))
        assert violation is not None and violation.field == "conversation_id"
        assert "reserved prefix" in violation.rule


def test_a_signal_named_in_settleds_own_namespace_is_refused() -> None:
    # A submission's retry backoff is a wait named settled.retry#<n>: a client's signal of that name would end it early.
    def signal(name: str) -> SendSignal:
        return SendSignal(
            command_id="g1",
            principal="p",
            conversation_id="c1",
            submission_id="s1",
            name=name,
            payload_json="{}",
            sent_at=T0,
        )

    violation = check_command(signal("settled.retry#1"))
    assert violation is not None and violation.field == "name" and "reserved prefix 'settled.'" in violation.rule
    assert check_command(signal("approved")) is None
    assert check_command(signal("settledish")) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("conversation_id", "c\x00"),
        ("conversation_id", "c" * 400_000),
        ("submission_id", "s\x00"),
        ("submission_id", "s" * 3000),
        ("idempotency_key", "k\x01"),
        ("principal", "p\x00"),
    ],
)
def test_admission_rejects_a_breach_naming_field_rule_and_a_bounded_value(log: Log, field: str, value: str) -> None:
    fields = {"submission_id": "s1", "key": "k1", "conversation_id": "c1", "principal": "alice"}
    fields["key" if field == "idempotency_key" else field] = value
    sid, key = fields.pop("submission_id"), fields.pop("key")
    record = proposal(sid, key, **fields)
    filed = filing_conversation(record.conversation_id, 0)
    assert filed == ("~quarantine/0" if field == "conversation_id" else "c1")

    decision = admit(log.state.conversation(filed), record, log.ref(), T0)

    (rejected,) = decision.events
    assert isinstance(rejected, SubmissionRejected)
    assert (rejected.reason, rejected.field) == (SubmissionRejectReason.INVALID, field)
    assert decision.receipt is not None and decision.receipt.outcome is ReceiptOutcome.REJECTED
    assert decision.receipt.reason is not None and decision.receipt.reason.startswith(f"invalid: {field} ")
    assert decision.receipt.conversation_id == filed
    # bounded, and nothing a PostgreSQL text column refuses
    for text in (rejected.submission_id, rejected.idempotency_key, decision.receipt.request_id):
        assert check_id("copied", text) is None, text
    assert len(CODEC.encode(rejected)) < 4096
    assert len(CODEC.encode(decision.receipt)) < 4096
    log.commit(filed, decision)
    assert rejected.input_ref is not None and log.state.conversation(filed).is_decided(rejected.input_ref)
    assert log.state.conversation(filed).submissions == {}


def test_a_breach_under_the_fault_switch_would_be_admitted(log: Log) -> None:
    record = proposal("s1", "k1", conversation_id="c\x00")
    decision = admit(log.state.conversation("c\x00"), record, log.ref(), T0, check_contract=False)
    assert isinstance(decision.events[0], SubmissionAdmitted)


def test_an_abort_breaking_the_contract_is_rejected_bounded(log: Log) -> None:
    decision = abort(log.state.conversation("c1"), abort_cmd("a" * 10_000, "s1", reason="x\x00"), log.ref(), T0)
    (rejected,) = decision.events
    assert isinstance(rejected, CommandRejected)
    assert rejected.detail.startswith("command_id is longer than 256 characters (10000 characters): ")
    assert check_id("command_id", rejected.command_id) is None
    decision = abort(log.state.conversation("c1"), abort_cmd("a1", "s1", reason="x\x00"), log.ref(), T0)
    (rejected,) = decision.events
    assert isinstance(rejected, CommandRejected)
    assert rejected.detail.startswith("reason contains a NUL character at index 1: ")


@pytest.mark.parametrize(
    ("key", "conversation"),
    [
        (None, "~quarantine/2"),
        (b"", "~quarantine/2"),
        (b"conv-1", "conv-1"),
        (b"\xff\xfe", "~quarantine/2"),
        (b"c\x00", "~quarantine/2"),
        (b"k" * 1_200_000, "~quarantine/2"),
        (b"~partition/2", "~quarantine/2"),
    ],
)
def test_an_undecodable_records_key_names_its_conversation_only_when_it_keeps_the_contract(
    key: bytes | None, conversation: str
) -> None:
    assert conversation_for_key(key, 2) == conversation
