"""The projector's compiled Avro reader reads what fastavro reads, and refuses what fastavro cannot read (issue 7)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from fastavro import schemaless_reader
from hypothesis import given, settings

from settled.schemas import (
    LOG_EVENT_TYPES,
    Codec,
    DecodeError,
    FastBatchDecoder,
    LogBatch,
)
from settled.schemas._avroread import READ_ERRORS, UnsupportedSchemaError, compile_reader
from tests.integration.projection_script import script_log
from tests.unit.projections.test_rows import _other_event_types
from tests.unit.schemas._strategies import batches

CODEC = Codec()
PARSED = CODEC.schema(LogBatch.AVRO_NAME).parsed
HEADER = CODEC.current_header(LogBatch.AVRO_NAME)
READ = compile_reader(PARSED)


def _fastavro(value: bytes) -> Any:
    return schemaless_reader(
        io.BytesIO(value[len(HEADER) :]), PARSED, None, return_record_name=True, return_record_name_override=True
    )


def _every_event_type() -> list[LogBatch]:
    found = [*script_log(), _other_event_types()]
    assert {type(e) for b in found for e in b.events} == set(LOG_EVENT_TYPES)
    return found


def test_the_header_is_the_current_single_object_header() -> None:
    value = CODEC.encode(script_log()[0])
    assert HEADER and value.startswith(HEADER) and len(HEADER) == 10


@pytest.mark.parametrize("batch", _every_event_type(), ids=lambda b: b.batch_id)
def test_it_reads_every_log_event_type_as_fastavro_does(batch: LogBatch) -> None:
    value = CODEC.encode(batch)
    assert READ(value, len(HEADER)) == _fastavro(value)


@settings(deadline=None, max_examples=60)
@given(batch=batches())
def test_it_reads_generated_batches_as_fastavro_does(batch: LogBatch) -> None:
    value = CODEC.encode(batch)
    assert READ(value, len(HEADER)) == _fastavro(value)


def test_a_body_cut_anywhere_or_followed_by_a_byte_is_refused() -> None:
    value = CODEC.encode(_other_event_types())
    for end in range(len(HEADER), len(value)):
        with pytest.raises(READ_ERRORS):
            READ(value[:end], len(HEADER))
    with pytest.raises(ValueError, match="trail"):
        READ(value + b"\x00", len(HEADER))


def test_the_fast_decoder_names_a_broken_record_as_the_codec_does() -> None:
    fast = FastBatchDecoder(CODEC)
    value = CODEC.encode(script_log()[3])
    for broken in (value[:-3], value + b"\x01", value[:12]):
        with pytest.raises(DecodeError) as slow:
            CODEC.decode_batch(broken, topic="t", partition=0, offset=9)
        with pytest.raises(DecodeError) as quick:
            fast.decode(broken, topic="t", partition=0, offset=9)
        assert quick.value.reason is slow.value.reason


def test_a_schema_it_does_not_cover_is_refused() -> None:
    schema: dict[str, Any] = {"type": "record", "name": "X", "fields": [{"name": "f", "type": "double"}]}
    with pytest.raises(UnsupportedSchemaError, match="double"):
        compile_reader(schema)


def _same_models(built: LogBatch, validated: LogBatch) -> None:
    assert built == validated
    assert [type(e) for e in built.events] == [type(e) for e in validated.events]
    for mine, theirs in zip((built, *built.events), (validated, *validated.events), strict=True):
        for name in type(theirs).model_fields:
            assert type(getattr(mine, name)) is type(getattr(theirs, name)), (type(theirs).__name__, name)
        assert mine.model_fields_set == set(type(theirs).model_fields)


def test_the_fast_decoder_reads_current_batches_without_dicts() -> None:
    fast = FastBatchDecoder(CODEC)
    assert fast._read_batch is not None  # every field of the log's schema is covered: the fused reader is used
    for offset, batch in enumerate(_every_event_type()):
        value = CODEC.encode(batch)
        _same_models(
            fast.decode(value, topic="t", partition=0, offset=offset), CODEC.decode_batch(value, offset=0).batch
        )


@settings(deadline=None, max_examples=60)
@given(batch=batches())
def test_the_fast_decoder_builds_the_validated_models_of_generated_batches(batch: LogBatch) -> None:
    value = CODEC.encode(batch)
    built = FastBatchDecoder(CODEC).decode(value, topic="t", partition=0, offset=0)
    _same_models(built, CODEC.decode_batch(value, offset=0).batch)
