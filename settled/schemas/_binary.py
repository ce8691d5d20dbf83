"""Avro binary bodies (no framing) through fastavro (docs/design.md §7).

Union branches that are records are written and read in fastavro's tuple notation ``(full name, dict)`` when the
union has more than one record branch (the log-event union of `LogBatch`); a ``["null", Record]`` union reads as the
plain dict. Dicts are written strictly: a missing or unknown field is an error, not a silent default.
"""

from __future__ import annotations

import io
from typing import Any

from fastavro import schemaless_reader, schemaless_writer

__all__ = ["read_body", "write_body"]


def write_body(parsed_schema: Any, datum: dict[str, Any]) -> bytes:
    """Encode one datum as an Avro binary body.

    Args:
        parsed_schema: A fastavro-parsed schema (`settled.schemas.NamedSchema.parsed`).
        datum: The record as a dict (`settled.schemas.AvroRecord.to_avro`).

    Returns:
        The Avro binary encoding.

    Raises:
        ValueError: fastavro's error for a datum that does not match the schema (missing or unknown field, wrong
            type, out-of-range number).
        TypeError: Likewise, for some wrong types.
    """
    buffer = io.BytesIO()
    schemaless_writer(buffer, parsed_schema, datum, strict=True)
    return buffer.getvalue()


def read_body(body: bytes | memoryview, writer_schema: Any, reader_schema: Any | None = None) -> tuple[Any, int]:
    """Decode one Avro binary body.

    Args:
        body: The bytes, starting at the datum.
        writer_schema: The fastavro-parsed schema the datum was written with.
        reader_schema: The fastavro-parsed schema to resolve to (Avro schema resolution), or None for the writer's.

    Returns:
        The datum and the number of bytes it took (a caller checks that nothing trails it).

    Raises:
        EOFError: The body is truncated.
        ValueError: The body is invalid for the schema (fastavro's errors; also ``UnicodeDecodeError``).
        IndexError: An enum or union index out of range.
    """
    stream = io.BytesIO(body)
    datum = schemaless_reader(
        stream, writer_schema, reader_schema, return_record_name=True, return_record_name_override=True
    )
    return datum, stream.tell()
