"""Property tests of every decoder and of admission (issue 25 item 7; hypothesis, the CI profile in tests/conftest.py).

Inputs: random bytes, structurally mutated valid inbox records (bytes flipped, cut, inserted, dropped; every field of
every inbox record type replaced by a hostile value of its Avro type), and ids at the contract's boundary lengths,
interleaved with healthy proposals. They go through the worker's own path — `decode_input` then
`LedgerDecider.decide` on the pending state — and each run checks that every input ends admitted once (or answered
as a duplicate), rejected or quarantined with a reason, in one bounded decision the fold accepts; that nothing
breaking the input contract is admitted; and that every healthy proposal is admitted exactly once. The decoders
(`Codec.decode` of every record type, as the worker and the client's receipts and settlements readers use it;
`Codec.decode_batch` and the projector's `FastBatchDecoder` for the log) return a record or raise `DecodeError`,
nothing else. Settling the healthy submissions is checked against the real stack by
tests/integration/test_hostile_input.py.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from settled.processors import Decision, LedgerDecider
from settled.processors._inbox import decode_input
from settled.protocol import MAX_ID_CHARS, check_input
from settled.schemas import (
    LOG_EVENT_TYPES,
    TOPIC_RECORD_TYPES,
    AbortRecorded,
    AbortRequested,
    AvroRecord,
    Codec,
    CommandRejected,
    DecodeError,
    FastBatchDecoder,
    InputQuarantined,
    LogBatch,
    ResolveUnknown,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionProposed,
    SubmissionRejected,
    UnknownResolved,
)
from tests.unit.protocol._sim import INBOX, T0, Log, abort_cmd, proposal
from tests.unit.schemas._strategies import batches, records

CODEC = Codec()
FAST = FastBatchDecoder(CODEC)
MAX_INPUT_BYTES = 64 * 1024
#: What one decision about one bad input may take on the log and its side topics (keys included), in bytes.
BOUND_BYTES = 16 * 1024
#: The events that decide an inbox input, and what they mean for it.
DECIDING = {
    SubmissionAdmitted: "admitted",
    SubmissionDuplicate: "duplicate",
    SubmissionRejected: "rejected",
    InputQuarantined: "quarantined",
    AbortRecorded: "applied",
    CommandRejected: "rejected",
    UnknownResolved: "applied",
}
INBOX_RECORD_TYPES: tuple[type[AvroRecord], ...] = (SubmissionProposed, AbortRequested, ResolveUnknown)

#: Strings an Avro ``string`` can carry (no lone surrogates: they are not UTF-8), hostile ones likely.
HOSTILE_TEXT = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["", " ", "\x00", "a\x00b", "\n", "\x7f", "\x9f", "~partition/0", "~quarantine/0", "é", "\u200b"]),
    st.builds(
        lambda n, c: c * n,
        st.sampled_from([1, MAX_ID_CHARS - 1, MAX_ID_CHARS, MAX_ID_CHARS + 1, 2800]),
        st.sampled_from(["x", "é", "\U0001f600", "\x00", " "]),
    ),
)


def _hostile_value(value: Any) -> st.SearchStrategy[Any]:
    """A strategy of hostile values of the same Avro type as ``value`` (string, long, bytes, array, union, ...)."""
    if isinstance(value, str):
        return HOSTILE_TEXT
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.sampled_from([0, -1, 1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)])
    if isinstance(value, bytes):
        return st.binary(max_size=80)
    if isinstance(value, list | tuple):
        return st.lists(HOSTILE_TEXT, max_size=5)
    if value is None:
        return st.none() | HOSTILE_TEXT
    if isinstance(value, dict):
        return st.fixed_dictionaries({k: _hostile_value(v) for k, v in value.items()})
    return st.just(value)


def _admissible() -> st.SearchStrategy[AvroRecord]:
    """Proposals that keep the contract and their digest, on a few conversations and keys (duplicates, conflicts)."""
    return st.builds(
        lambda sid, key, cid, value: proposal(sid, key, conversation_id=cid, value=value),
        st.sampled_from(["s1", "s2", "s3"]),
        st.sampled_from(["k1", "k2"]),
        st.sampled_from(["c1", "c2"]),
        st.sampled_from(["a", "b"]),
    )


@st.composite
def _field_mutated(draw: st.DrawFn) -> tuple[bytes | None, bytes]:
    """A valid inbox record with one field (nested ones too) replaced by a hostile value of its type, re-encoded."""
    model = draw(st.sampled_from(INBOX_RECORD_TYPES))
    record = draw(records(model) | _admissible())
    model = type(record)
    datum = record.to_avro()
    name = draw(st.sampled_from(sorted(k for k in datum if k != "schema_version")))
    if isinstance(datum[name], dict):
        inner = draw(st.sampled_from(sorted(datum[name])))
        datum[name] = {**datum[name], inner: draw(_hostile_value(datum[name][inner]))}
    else:
        datum[name] = draw(_hostile_value(datum[name]))
    try:
        value = CODEC.encode_dict(model.AVRO_NAME, datum)
    except (ValueError, TypeError, OverflowError):
        value = CODEC.encode(record)  # the mutation does not fit the schema: the record goes as it was
    key = draw(st.none() | st.just(str(datum.get("conversation_id", "")).encode("utf-8", "surrogatepass")))
    return key, value


@st.composite
def _byte_mutated(draw: st.DrawFn) -> tuple[bytes | None, bytes]:
    """A valid inbox record's bytes with flips, cuts, insertions or deletions."""
    model = draw(st.sampled_from(INBOX_RECORD_TYPES))
    value = bytearray(CODEC.encode(draw(records(model))))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        at = draw(st.integers(0, max(0, len(value) - 1)))
        if op == "flip" and value:
            value[at] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del value[at:]
        elif op == "insert":
            value[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif value:
            del value[at : at + draw(st.integers(1, 8))]
    return draw(st.none() | st.binary(max_size=40)), bytes(value)


RANDOM_INPUT = st.tuples(st.none() | st.binary(max_size=300), st.binary(max_size=400))
#: Unmutated admissible proposals among the bad inputs: admissions, duplicates and key conflicts.
SOUND_INPUT = _admissible().map(lambda r: (r.conversation_id.encode(), CODEC.encode(r)))
BAD_INPUTS = st.lists(st.one_of(RANDOM_INPUT, _byte_mutated(), _field_mutated(), SOUND_INPUT), min_size=1, max_size=6)


def _decide(log: Log, key: bytes | None, value: bytes | None) -> tuple[int, Decision, Any]:
    offset = log.ref().offset
    inp = decode_input(CODEC, INBOX, 0, offset, key, value, max_input_bytes=MAX_INPUT_BYTES)
    decisions = LedgerDecider(partition=0, partition_count=1).decide(log.state, inp, T0)
    assert len(decisions) == 1, decisions
    return offset, decisions[0], inp.record


def _written_bytes(log: Log, decision: Decision) -> int:
    batch = log.seal(decision.conversation_id, decision.events)
    key = len(decision.conversation_id.encode())
    side = [*decision.receipts, *decision.settlements, *decision.quarantined]
    return len(CODEC.encode(batch)) + key + sum(len(CODEC.encode(r)) + key for r in side)


def _outcome(log: Log, offset: int, decision: Decision, record: Any) -> str:
    """Check one decision's invariants, fold it, and return what it made of its input."""
    assert decision.inputs == frozenset({offset})
    deciding = [e for e in decision.events if getattr(e, "input_ref", None) is not None]
    assert len(deciding) == 1, decision.events
    event = deciding[0]
    assert event.input_ref.offset == offset
    outcome = DECIDING[type(event)]
    if outcome in ("rejected", "quarantined"):
        assert event.reason and event.detail, event
        assert _written_bytes(log, decision) < BOUND_BYTES
    if outcome == "admitted":
        assert record is not None and check_input(record) is None, record  # nothing breaking the contract is admitted
        assert [r.outcome.value for r in decision.receipts] == ["admitted"]
    log.append(decision.conversation_id, decision.events)  # the fold accepts it (chain, edges, decided inputs)
    return outcome


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(bad=BAD_INPUTS, healthy=st.integers(1, 4), data=st.data())
def test_every_input_ends_admitted_once_rejected_or_quarantined_and_healthy_ones_are_admitted(
    bad: list[tuple[bytes | None, bytes]], healthy: int, data: st.DataObject
) -> None:
    log = Log()
    log.claim()
    inputs: list[tuple[str, bytes | None, bytes]] = [("mixed", k, v) for k, v in bad]
    for i in range(healthy):
        cid = f"healthy-{i}"
        good = proposal(f"h{i}", f"hk{i}", conversation_id=cid)
        inputs.insert(data.draw(st.integers(0, len(inputs))), ("healthy", cid.encode(), CODEC.encode(good)))
    admitted: dict[tuple[str, str], int] = {}  # (conversation, submission id): ids are unique per conversation
    for kind, key, value in inputs:
        offset, decision, record = _decide(log, key, value)
        outcome = _outcome(log, offset, decision, record)
        event(f"{kind} input {outcome}")
        if kind == "healthy":
            assert outcome == "admitted", decision
        if outcome == "admitted":
            sid = (decision.conversation_id, decision.events[0].submission_id)
            admitted[sid] = admitted.get(sid, 0) + 1
    assert all(n == 1 for n in admitted.values()), admitted
    assert all(admitted.get((f"healthy-{i}", f"h{i}")) == 1 for i in range(healthy)), admitted


@given(
    field=st.sampled_from(["conversation_id", "submission_id", "idempotency_key", "principal", "tool"]),
    length=st.sampled_from([1, MAX_ID_CHARS - 1, MAX_ID_CHARS, MAX_ID_CHARS + 1, 2800, 400_000]),
    char=st.sampled_from(["x", "é", "\U0001f600"]),
)
def test_boundary_length_ids_are_admitted_up_to_256_characters_and_rejected_beyond(
    field: str, length: int, char: str
) -> None:
    log = Log()
    log.claim()
    value = char * length
    args: dict[str, Any] = {"conversation_id": "c1"}
    if field == "tool":
        args["tools"] = ("lookup", value)
    elif field in ("conversation_id", "principal"):
        args[field] = value
    sid = value if field == "submission_id" else "s1"
    key = value if field == "idempotency_key" else "k1"
    record = proposal(sid, key, **args)
    offset, decision, _ = _decide(log, record.conversation_id.encode(), CODEC.encode(record))
    outcome = _outcome(log, offset, decision, record)
    encoded = len(CODEC.encode(record))
    if encoded > MAX_INPUT_BYTES:
        assert outcome == "quarantined"
    elif length <= MAX_ID_CHARS:
        assert outcome == "admitted", decision
    else:
        assert outcome == "rejected", decision
        reason = decision.receipts[0].reason or ""
        named = "payload.tools_offered name 1" if field == "tool" else field
        assert reason.startswith(f"invalid: {named} is longer than {MAX_ID_CHARS} characters"), reason


@given(commands=st.lists(st.tuples(HOSTILE_TEXT, HOSTILE_TEXT, st.none() | HOSTILE_TEXT), min_size=1, max_size=4))
def test_hostile_aborts_are_applied_or_rejected_with_a_reason(commands: list[tuple[str, str, str | None]]) -> None:
    log = Log()
    log.claim()
    for command_id, submission_id, reason in commands:
        record = abort_cmd(command_id, submission_id, reason=reason)
        offset, decision, _ = _decide(log, b"c1", CODEC.encode(record))
        assert _outcome(log, offset, decision, record) in ("rejected", "applied")


def _mutate(value: bytes, data: st.DataObject) -> bytes:
    out = bytearray(value)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, max(0, len(out) - 1)))
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if op == "flip" and out:
            out[at] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del out[at:]
        else:
            out[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    return bytes(out)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=batches(), data=st.data())
def test_the_log_decoders_return_a_batch_or_raise_decode_error(batch: LogBatch, data: st.DataObject) -> None:
    value = data.draw(st.just(CODEC.encode(batch)) | st.binary(max_size=300) | st.builds(bytes))
    value = _mutate(value, data) if value and data.draw(st.booleans()) else value
    for decode in (
        lambda v: CODEC.decode_batch(v, topic="log", partition=0, offset=0).batch,
        lambda v: FAST.decode(v, topic="log", partition=0, offset=0),
    ):
        outcome: LogBatch | DecodeError
        try:
            outcome = decode(value)
        except DecodeError as exc:
            outcome = exc
        assert isinstance(outcome, LogBatch) or (outcome.reason is not None and str(outcome)), outcome


#: Every record type settled writes or reads (topic records, events, the batch envelope).
ALL_RECORD_TYPES: list[type[AvroRecord]] = [*TOPIC_RECORD_TYPES, *LOG_EVENT_TYPES]


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(model=st.sampled_from(ALL_RECORD_TYPES), data=st.data())
def test_the_record_decoder_returns_a_record_or_raises_decode_error(
    model: type[AvroRecord], data: st.DataObject
) -> None:
    """`Codec.decode` (the worker's, the receipts reader's and the settlements reader's decoder) on mutated bytes."""
    value = _mutate(CODEC.encode(data.draw(records(model))), data)
    for expected in (None, (model,)):
        outcome: AvroRecord | DecodeError
        try:
            outcome = CODEC.decode(value, topic="t", partition=0, offset=0, expected=expected)
        except DecodeError as exc:
            outcome = exc
        assert isinstance(outcome, AvroRecord) or (outcome.reason is not None and str(outcome)), outcome
