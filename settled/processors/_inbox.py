"""Reading one inbox record into an `InboxInput`: decoded, or why not (docs/design.md §4; issue 25 item 7).

Pure apart from the codec (no consumer): the worker calls `decode_input` for every record it polls, and the property
tests (tests/unit/processors/test_admission_properties.py) feed it random and mutated bytes.
"""

from __future__ import annotations

from typing import Any

from settled.processors._partition import InboxInput
from settled.schemas import INBOX_TYPES, Codec, DecodeError, InboxRecord, QuarantineReason

__all__ = ["decode_input"]


def decode_input(
    codec: Codec,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    *,
    max_input_bytes: int,
    headers: tuple[tuple[str, bytes], ...] = (),
) -> InboxInput:
    """Decode one inbox record's value, or say why it must be quarantined.

    Args:
        codec: The record codec.
        topic: The inbox topic.
        partition: The record's partition.
        offset: The record's offset.
        key: The record's key, if any.
        value: The record's value, if any.
        max_input_bytes: settled's hard size limit for one value, in bytes; a larger one is not decoded.
        headers: The record's headers, kept on a decoded input (the HTTP API's signature, issue 20).

    Returns:
        The input: its decoded inbox record, or ``record=None`` with the error and its quarantine reason (no value,
        over ``max_input_bytes``, undecodable, or a record type the inbox does not take).
    """
    if value is None:
        why = "record has no value"
        return InboxInput(topic, partition, offset, key, None, None, why, QuarantineReason.UNDECODABLE)
    if len(value) > max_input_bytes:
        why = f"value of {len(value)} bytes exceeds settled's limit of {max_input_bytes}"
        return InboxInput(topic, partition, offset, key, value, None, why, QuarantineReason.OVERSIZED)
    try:
        record: Any = codec.decode(value, topic=topic, partition=partition, offset=offset, expected=INBOX_TYPES)
    except DecodeError as exc:
        return InboxInput(topic, partition, offset, key, value, None, str(exc), exc.reason.quarantine_reason)
    if not isinstance(record, InboxRecord):
        why = f"{type(record).__name__} is not an inbox record"
        return InboxInput(topic, partition, offset, key, value, None, why, QuarantineReason.UNDECODABLE)
    return InboxInput(topic, partition, offset, key, value, record, headers=headers)
