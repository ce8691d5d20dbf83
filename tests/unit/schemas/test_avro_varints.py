"""The compiled Avro reader's in-place varints read every long and timestamp as fastavro does (issue 7)."""

from __future__ import annotations

import io
from typing import Any, cast

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from settled.schemas._avroread import READ_ERRORS, compile_reader

SCHEMA = parse_schema(
    {
        "type": "record",
        "name": "V",
        "fields": [
            {"name": "n", "type": "long"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ],
    }
)
READ = compile_reader(cast(dict[str, Any], SCHEMA))
EDGES = [0, 1, -1, 63, -64, 64, -65, 8191, -8192, 8192, -8193, 2**20, -(2**35), 1_764_467_676_123, 2**62,
         2**63 - 1, -(2**63)]  # fmt: skip
TIMESTAMPS = [0, 1, -1, 999, -1001, 1_764_467_676_123, -62_135_596_800_000, 253_402_300_799_999]


def _body(n: int, at_ms: int) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, SCHEMA, {"n": n, "at": at_ms})
    return out.getvalue()


def _fastavro(body: bytes) -> Any:
    return schemaless_reader(io.BytesIO(body), SCHEMA, None)


@pytest.mark.parametrize("n", EDGES)
@pytest.mark.parametrize("at_ms", TIMESTAMPS)
def test_longs_and_timestamps_of_every_width_read_as_fastavro_reads_them(n: int, at_ms: int) -> None:
    body = _body(n, at_ms)
    assert READ(body, 0) == _fastavro(body)


def test_a_varint_past_ten_bytes_or_64_bits_is_refused() -> None:
    tail = _body(0, 0)[1:]  # the timestamp
    for varint in (b"\xff" * 10 + b"\x01", b"\xff" * 9 + b"\x7f"):  # an eleventh byte; a tenth byte past bit 64
        with pytest.raises(READ_ERRORS):
            READ(varint + tail, 0)
        with pytest.raises(READ_ERRORS):
            READ(b"\x00" + varint, 0)  # as the timestamp
    for cut in (b"\x80", b"\xff\xff"):
        with pytest.raises(READ_ERRORS):
            READ(b"\x00" + cut, 0)
