"""The codec: both wire formats, typed decode errors, upcasters, backward compatibility (issue 4 item 3)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, record_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import given, settings
from hypothesis import strategies as st

from settled.schemas import (
    LOG_EVENT_TYPES,
    TOPIC_RECORD_TYPES,
    AvroRecord,
    Codec,
    DecodeError,
    DecodeFailure,
    EncodeError,
    InputRef,
    LogBatch,
    QuarantineReason,
    Receipt,
    ReceiptOutcome,
    RequestKind,
    SchemaSet,
    SubmissionProposed,
    SubmissionReady,
    WireFormat,
    current_schemas,
    history_schemas,
    history_versions,
    verify_chain,
)
from settled.schemas.registry import ConfluentSchemaRegistry
from tests.unit.schemas._strategies import records

ALL_TYPES: list[type[AvroRecord]] = [*TOPIC_RECORD_TYPES, LogBatch, *LOG_EVENT_TYPES, InputRef]
SINGLE = Codec()
REGISTRY = ConfluentSchemaRegistry.from_url("mock://settled-codec-tests")
CONFLUENT = Codec(registry=REGISTRY)
AT = datetime(2026, 3, 4, 5, 6, 7, 890_000, tzinfo=UTC)


def _receipt(**changes: Any) -> Receipt:
    fields: dict[str, Any] = {
        "request_kind": RequestKind.SUBMISSION,
        "request_id": "sub-1",
        "outcome": ReceiptOutcome.ADMITTED,
        "submission_seq": 3,
        "conversation_id": "conv-1",
        "decided_at": AT,
    }
    return Receipt(**{**fields, **changes})


@pytest.mark.parametrize("record_type", ALL_TYPES, ids=lambda cls: cls.__name__)
@settings(deadline=None, max_examples=25)
@given(data=st.data())
def test_every_record_type_round_trips_through_both_wire_formats(record_type: type[AvroRecord], data: Any) -> None:
    record = data.draw(records(record_type))
    single = SINGLE.encode(record)
    confluent = CONFLUENT.encode(record)
    assert single[:2] == b"\xc3\x01" and single[2:10] == SINGLE.schema(record.AVRO_NAME).fingerprint_bytes
    assert confluent[:1] == b"\x00"
    assert single[10:] == confluent[5:]  # one Avro body, two framings
    assert SINGLE.decode(single) == record
    assert CONFLUENT.decode(single) == record  # a decoder reads both formats
    assert CONFLUENT.decode(confluent) == record
    for codec, value in ((SINGLE, single), (CONFLUENT, confluent)):
        decoded = codec.decode_dict(value)
        assert (decoded.avro_name, decoded.writer_version) == (record.AVRO_NAME, codec.version)
        assert record_type.from_avro(decoded.datum) == record
        assert codec.encode_dict(record.AVRO_NAME, decoded.datum) == value  # the dict path writes the same bytes


@settings(deadline=None, max_examples=25)
@given(batch=records(LogBatch))
def test_encode_batch_dict_seals_like_the_model(batch: Any) -> None:
    assert isinstance(batch, LogBatch)
    value, digest = SINGLE.encode_batch_dict({**batch.to_avro(), "batch_digest": "ignored"})
    assert digest == batch.batch_digest
    assert value == SINGLE.encode(batch)
    entry = SINGLE.decode_batch(value, offset=7)
    assert entry.body_digest == batch.batch_digest and entry.batch == batch


def test_a_confluent_framed_value_needs_a_registry() -> None:
    with pytest.raises(DecodeError) as info:
        SINGLE.decode(CONFLUENT.encode(_receipt()), topic="settled.receipts", partition=2, offset=9)
    assert info.value.reason is DecodeFailure.NO_REGISTRY
    assert (info.value.topic, info.value.partition, info.value.offset) == ("settled.receipts", 2, 9)


@pytest.mark.parametrize("record_type", [*TOPIC_RECORD_TYPES, LogBatch], ids=lambda cls: cls.__name__)
@settings(deadline=None, max_examples=10)
@given(data=st.data())
def test_confluent_framing_is_byte_for_byte_confluent_kafkas(record_type: type[AvroRecord], data: Any) -> None:
    client = SchemaRegistryClient.new_client({"url": "mock://settled-byte-for-byte"})
    ours = Codec(registry=ConfluentSchemaRegistry(client))
    record = data.draw(records(record_type))
    schema = Schema(ours.schema(record.AVRO_NAME).standalone_json, "AVRO")
    serializer = AvroSerializer(
        client, schema, conf={"subject.name.strategy": record_subject_name_strategy, "validate.strict": True}
    )
    theirs = serializer(record.to_avro(), SerializationContext("settled.inbox", MessageField.VALUE))
    assert ours.encode(record) == theirs


def test_single_object_encoding_is_readable_with_plain_fastavro() -> None:
    value = SINGLE.encode(_receipt())
    parsed = fastavro.parse_schema(json.loads(current_schemas().get(Receipt.AVRO_NAME).standalone_json))
    canonical = fastavro.schema.to_parsing_canonical_form(parsed)
    assert value[2:10].hex() == fastavro.schema.fingerprint(canonical, "CRC-64-AVRO")
    assert fastavro.schemaless_reader(io.BytesIO(value[10:]), parsed, None)["request_id"] == "sub-1"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, DecodeFailure.EMPTY),
        (b"", DecodeFailure.EMPTY),
        (b"\xc3", DecodeFailure.TRUNCATED),
        (b"\xc3\x01\x00\x00", DecodeFailure.TRUNCATED),
        (b"\x00\x00\x00", DecodeFailure.TRUNCATED),
        (b'{"json": true}', DecodeFailure.BAD_MAGIC),
        (b"\xc3\x01" + b"\x11" * 8 + b"\x00", DecodeFailure.UNKNOWN_FINGERPRINT),
    ],
)
def test_undecodable_values_raise_typed_errors(value: bytes | None, reason: DecodeFailure) -> None:
    with pytest.raises(DecodeError) as info:
        SINGLE.decode(value, topic="settled.inbox", partition=4, offset=17)
    assert info.value.reason is reason
    assert (info.value.topic, info.value.partition, info.value.offset) == ("settled.inbox", 4, 17)
    assert "settled.inbox[4]@17" in str(info.value)


@pytest.mark.parametrize("record_type", [*TOPIC_RECORD_TYPES, LogBatch], ids=lambda cls: cls.__name__)
@settings(deadline=None, max_examples=5)
@given(data=st.data())
def test_a_value_cut_at_any_byte_is_truncated(record_type: type[AvroRecord], data: Any) -> None:
    value = SINGLE.encode(data.draw(records(record_type)))
    for cut in range(1, len(value)):
        with pytest.raises(DecodeError) as info:
            SINGLE.decode(value[:cut], topic="t", partition=0, offset=cut)
        assert info.value.reason is DecodeFailure.TRUNCATED, (cut, info.value)


def test_a_truncated_body_an_invalid_body_and_trailing_bytes() -> None:
    value = SINGLE.encode(_receipt())
    with pytest.raises(DecodeError) as info:
        SINGLE.decode(value[:-3], topic="t", partition=0, offset=1)
    assert info.value.reason is DecodeFailure.TRUNCATED
    assert info.value.reason.quarantine_reason is QuarantineReason.TRUNCATED
    with pytest.raises(DecodeError) as info:
        SINGLE.decode(value + b"\x00", topic="t", partition=0, offset=1)
    assert info.value.reason is DecodeFailure.INVALID and "trail" in info.value.detail
    corrupt = bytearray(value)
    corrupt[11] = 0x7E  # request_kind enum index 63: out of range
    with pytest.raises(DecodeError) as info:
        SINGLE.decode(bytes(corrupt), topic="t", partition=0, offset=1)
    assert info.value.reason is DecodeFailure.INVALID
    assert info.value.reason.quarantine_reason is QuarantineReason.UNDECODABLE


def test_a_record_breaking_a_model_rule_is_invalid() -> None:
    datum = _receipt().to_avro()
    datum["decided_at"] = AT
    value = SINGLE.encode_dict(Receipt.AVRO_NAME, {**datum})
    assert SINGLE.decode(value) == _receipt()
    bad_json = SubmissionProposed.AVRO_NAME
    proposal = {
        "schema_version": 1,
        "submission_id": "s",
        "principal": "p",
        "conversation_id": "c",
        "idempotency_key": "k",
        "payload": {"input_json": '{ "not": "canonical" }', "tools_offered": []},
        "payload_digest": "0" * 64,
        "proposed_at": AT,
        "lane": None,
    }
    value = SINGLE.encode_dict(bad_json, proposal)
    assert SINGLE.decode_dict(value).datum["payload"]["input_json"] == proposal["payload"]["input_json"]  # type: ignore[index]
    with pytest.raises(DecodeError) as info:
        SINGLE.decode(value, topic="settled.inbox", partition=0, offset=3)
    assert info.value.reason is DecodeFailure.INVALID_FIELD
    assert (info.value.avro_name, info.value.field) == (SubmissionProposed.AVRO_NAME, "payload.input_json")
    assert info.value.datum is not None and info.value.datum["submission_id"] == "s"


def test_unexpected_types_are_refused() -> None:
    with pytest.raises(DecodeError) as info:
        SINGLE.decode(SINGLE.encode(_receipt()), expected=(SubmissionProposed,), topic="settled.inbox", offset=5)
    assert info.value.reason is DecodeFailure.UNEXPECTED_TYPE


def test_an_unknown_confluent_schema_id() -> None:
    value = b"\x00" + (999_999).to_bytes(4, "big") + b"\x00"
    with pytest.raises(DecodeError) as info:
        CONFLUENT.decode(value, topic="settled.inbox", partition=1, offset=2)
    assert info.value.reason is DecodeFailure.UNKNOWN_SCHEMA_ID


def test_a_foreign_schema_in_the_registry_is_unknown() -> None:
    foreign = REGISTRY.register("someone.Else", '{"type":"record","name":"Else","fields":[{"name":"x","type":"int"}]}')
    with pytest.raises(DecodeError) as info:
        CONFLUENT.decode(b"\x00" + foreign.to_bytes(4, "big") + b"\x02")
    assert info.value.reason is DecodeFailure.UNKNOWN_SCHEMA_ID


def test_encode_errors_name_the_record() -> None:
    with pytest.raises(EncodeError) as info:
        SINGLE.encode_dict(Receipt.AVRO_NAME, {"request_id": "x"})
    assert info.value.avro_name == Receipt.AVRO_NAME
    with pytest.raises(EncodeError):
        SINGLE.encode_dict("dev.settled.v1.Nope", {})
    with pytest.raises(EncodeError, match="only records"):
        SINGLE.encode_dict("dev.settled.v1.SettlementOutcome", {})


def test_the_wire_format_follows_the_registry() -> None:
    assert SINGLE.wire_format is WireFormat.SINGLE_OBJECT
    assert CONFLUENT.wire_format is WireFormat.CONFLUENT
    assert CONFLUENT.decode_dict(CONFLUENT.encode(_receipt())).wire_format is WireFormat.CONFLUENT


# --------------------------------------------------------------------------------- versions and upcasters


KEPT = [
    (version, record_type)
    for version in history_versions()
    for record_type in ALL_TYPES
    if record_type.AVRO_NAME in history_schemas(version).schemas
]


def test_history_is_kept_and_no_type_is_removed() -> None:
    assert history_versions(), "at least the current version is kept"
    for version in history_versions():
        assert set(history_schemas(version).schemas) <= set(current_schemas().schemas), version


@pytest.mark.parametrize(("version", "record_type"), KEPT, ids=lambda item: str(getattr(item, "__name__", item)))
@settings(deadline=None, max_examples=10)
@given(data=st.data())
def test_every_current_schema_reads_every_kept_version(version: int, record_type: type[AvroRecord], data: Any) -> None:
    """Backward compatibility (docs/design.md §7): data written with a kept version decodes under the current schema."""
    old = history_schemas(version).get(record_type.AVRO_NAME)
    new = current_schemas().get(record_type.AVRO_NAME)
    sample = data.draw(records(record_type))
    body = io.BytesIO()
    fastavro.schemaless_writer(body, old.parsed, sample.to_avro())
    body.seek(0)
    read = fastavro.schemaless_reader(
        body, old.parsed, new.parsed, return_record_name=True, return_record_name_override=True
    )
    if old.canonical_form == new.canonical_form:
        assert record_type.from_avro(read) == sample
    else:
        record_type.from_avro(read)
    single = b"\xc3\x01" + old.fingerprint_bytes + body.getvalue()
    assert SINGLE.decode_dict(single).writer_version in (version, SINGLE.version)


def _toy_set(tmp_path: Any, label: str, fields: list[dict[str, Any]]) -> SchemaSet:
    folder = tmp_path / label
    folder.mkdir()
    schema = {"type": "record", "name": "Toy", "namespace": "dev.settled.v1", "fields": fields}
    (folder / "Toy.avsc").write_text(json.dumps(schema))
    return SchemaSet.load(folder, label)


def test_old_versions_are_resolved_or_upcast_on_read(tmp_path: Any) -> None:
    v1 = _toy_set(tmp_path, "v1", [{"name": "name", "type": "string"}])
    v2 = _toy_set(tmp_path, "v2", [{"name": "name", "type": "string"}, {"name": "size", "type": "long", "default": 0}])
    v3 = _toy_set(
        tmp_path,
        "v3",
        [{"name": "full_name", "type": "string"}, {"name": "size", "type": "long", "default": 0}],
    )
    old = Codec(schemas=v1, history={}, version=1, record_types=())
    written = old.encode_dict("dev.settled.v1.Toy", {"name": "ada"})

    plain = Codec(schemas=v2, history={1: v1}, version=2, record_types=())
    decoded = plain.decode_dict(written)
    assert (decoded.datum, decoded.writer_version) == ({"name": "ada", "size": 0}, 1)  # Avro resolution

    renamed = Codec(schemas=v3, history={1: v1, 2: v2}, version=3, record_types=())
    renamed.register_upcaster(
        "dev.settled.v1.Toy", 2, lambda datum: {"full_name": datum["name"].title(), "size": datum["size"]}
    )
    assert renamed.decode_dict(written).datum == {"full_name": "Ada", "size": 0}  # resolution v1→v2, upcast v2→v3
    with pytest.raises(ValueError, match="already registered"):
        renamed.register_upcaster("dev.settled.v1.Toy", 2, dict)
    with pytest.raises(ValueError, match="kept version below"):
        renamed.register_upcaster("dev.settled.v1.Toy", 3, dict)

    no_upcaster = Codec(schemas=v3, history={1: v1, 2: v2}, version=3, record_types=())
    with pytest.raises(DecodeError) as info:
        no_upcaster.decode_dict(written, topic="t", partition=0, offset=4)
    assert info.value.reason is DecodeFailure.UPCAST_FAILED  # a rename without an upcaster cannot be resolved


def test_a_decoded_log_verifies() -> None:
    batches = []
    prev = None
    for index in range(3):
        prev = LogBatch.seal(
            conversation_id="c",
            batch_id=f"b{index}",
            first_event_seq=1 if prev is None else prev.last_event_seq + 1,
            owner_epoch=1,
            prev_batch_digest=None if prev is None else prev.batch_digest,
            recorded_at=AT,
            events=[SubmissionReady(submission_id=f"s{index}", submission_seq=index)],
        )
        batches.append(SINGLE.encode(prev))
    entries = [
        SINGLE.decode_batch(value, topic="settled.log", partition=0, offset=5 * n) for n, value in enumerate(batches)
    ]
    assert verify_chain(entries).last_offset == 10
