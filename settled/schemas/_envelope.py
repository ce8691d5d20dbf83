"""The canonical batch envelope of ``settled.log`` and its hash chain (issue 4 item 2; docs/design.md §3).

One Kafka record on ``settled.log`` is one `LogBatch`: a run of one conversation's events with their event
sequence numbers, the appender's logical owner epoch, and a digest chained to the conversation's previous batch.

Canonical encoding of the digest: ``batch_digest`` is the lowercase hex SHA-256 of the envelope's Avro binary
encoding *as written* (the writer's schema) with ``batch_digest`` set to the empty string. ``batch_digest`` is the
envelope's first field, and the Avro encoding of a 64-character string is ``0x80 0x01`` followed by its 64 bytes,
so for a body ``b`` as read from Kafka the digest is SHA-256 of the byte 0x00 followed by ``b[66:]``
(`body_batch_digest`): it is checked from the bytes alone, whatever schema version the reader uses.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, NamedTuple, Self

from pydantic import Field, model_validator

from settled._errors import ErrorCategory, SettledError
from settled.schemas._binary import write_body
from settled.schemas._events import (
    LOG_EVENT_TYPES,
    SCHEMA_VERSION,
    AvroRecord,
    Digest,
    LogEvent,
    NonNegInt32,
    NonNegInt64,
    UtcMillis,
)
from settled.schemas._schemaset import current_schemas

__all__ = [
    "ChainBreakError",
    "ChainEntry",
    "ChainHead",
    "LogBatch",
    "RepeatedBatchError",
    "RepeatedBatchGuard",
    "body_batch_digest",
    "verify_chain",
]

_DIGEST_PREFIX = b"\x80\x01"  # zig-zag varint of the length 64
_DIGEST_FIELD_BYTES = len(_DIGEST_PREFIX) + 64
_EMPTY_STRING = b"\x00"

_EVENT_BY_NAME: dict[str, type[AvroRecord]] = {cls.AVRO_NAME: cls for cls in LOG_EVENT_TYPES}

PositiveInt64 = Annotated[int, Field(ge=1, le=2**63 - 1)]


def body_batch_digest(body: bytes | bytearray | memoryview) -> str:
    """Return the batch digest of an envelope's Avro body as written (see the module doc).

    Args:
        body: The envelope's Avro binary body (without single-object or Confluent framing).

    Returns:
        Lowercase hex SHA-256 of the body with its ``batch_digest`` field emptied.

    Raises:
        ValueError: If the body does not start with a 64-character string (it cannot be a sealed envelope).
    """
    view = memoryview(body)
    if len(view) < _DIGEST_FIELD_BYTES or bytes(view[:2]) != _DIGEST_PREFIX:
        raise ValueError("an envelope body must start with its 64-character batch_digest")
    digest = hashlib.sha256(_EMPTY_STRING)
    digest.update(view[_DIGEST_FIELD_BYTES:])
    return digest.hexdigest()


def _unsealed_body(datum: dict[str, Any]) -> bytes:
    return write_body(current_schemas().get(LogBatch.AVRO_NAME).parsed, {**datum, "batch_digest": ""})


class LogBatch(AvroRecord):
    """A canonical batch: one Kafka record on ``settled.log`` (issue 4 item 2).

    Build one with `LogBatch.seal`, which computes ``batch_digest``; the constructor does not check the digest
    (an upcast old batch may no longer re-encode to its written bytes), `verify_chain` does.

    Attributes:
        batch_digest: Hex SHA-256 of the canonical encoding (module doc).
        schema_version: Schema version the writer used.
        conversation_id: The conversation (the record key).
        submission_id: The submission the batch is about, when one is.
        batch_id: Unique id of the batch.
        first_event_seq: Event sequence of the first event (a conversation's first event is 1).
        last_event_seq: Event sequence of the last event.
        owner_epoch: Logical owner epoch of the appender (docs/design.md §3).
        prev_batch_digest: ``batch_digest`` of the conversation's previous batch; None for its first.
        recorded_at: When the owner decided the batch.
        events: The events, in event-sequence order (at least one).
    """

    batch_digest: Digest
    schema_version: NonNegInt32 = SCHEMA_VERSION
    conversation_id: str
    submission_id: str | None = None
    batch_id: str
    first_event_seq: PositiveInt64
    last_event_seq: PositiveInt64
    owner_epoch: NonNegInt64
    prev_batch_digest: Digest | None = None
    recorded_at: UtcMillis
    events: tuple[LogEvent, ...]

    @model_validator(mode="after")
    def _sequence_matches_events(self) -> Self:
        if not self.events:
            raise ValueError("a batch holds at least one event")
        expected = self.first_event_seq + len(self.events) - 1
        if self.last_event_seq != expected:
            raise ValueError(
                f"last_event_seq={self.last_event_seq} but first_event_seq={self.first_event_seq} and "
                f"{len(self.events)} events give {expected}"
            )
        return self

    @classmethod
    def seal(
        cls,
        *,
        conversation_id: str,
        batch_id: str,
        first_event_seq: int,
        owner_epoch: int,
        prev_batch_digest: str | None,
        recorded_at: datetime,
        events: Iterable[LogEvent],
        submission_id: str | None = None,
    ) -> LogBatch:
        """Build a batch and compute its digest; ``last_event_seq`` follows from the events.

        Args:
            conversation_id: The conversation.
            batch_id: Unique id of the batch.
            first_event_seq: Sequence of the first event (previous batch's last + 1; 1 for the first batch).
            owner_epoch: The appender's logical owner epoch.
            prev_batch_digest: The previous batch's digest, None for the conversation's first batch.
            recorded_at: When the owner decided the batch (aware).
            events: The events (at least one).
            submission_id: The submission the batch is about, when one is.

        Returns:
            The sealed batch.

        Raises:
            pydantic.ValidationError: If a field is invalid.
        """
        event_tuple = tuple(events)
        unsealed = cls(
            batch_digest="0" * 64,
            conversation_id=conversation_id,
            submission_id=submission_id,
            batch_id=batch_id,
            first_event_seq=first_event_seq,
            last_event_seq=first_event_seq + max(len(event_tuple), 1) - 1,
            owner_epoch=owner_epoch,
            prev_batch_digest=prev_batch_digest,
            recorded_at=recorded_at,
            events=event_tuple,
        )
        return unsealed.model_copy(update={"batch_digest": unsealed.compute_digest()})

    def compute_digest(self) -> str:
        """Return the digest of this batch encoded under the current schema (module doc).

        Returns:
            Lowercase hex SHA-256.
        """
        return hashlib.sha256(_unsealed_body(self.to_avro())).hexdigest()

    def to_avro(self) -> dict[str, Any]:
        """Return the dict fastavro writes; events in tuple notation ``(full name, dict)``.

        Returns:
            A dict in Avro field order.
        """
        datum = super().to_avro()
        datum["events"] = [(type(event).AVRO_NAME, event.to_avro()) for event in self.events]
        return datum

    @classmethod
    def from_avro(cls, datum: dict[str, Any]) -> Self:
        """Build the model from the dict fastavro reads (events as ``(full name, dict)``).

        Args:
            datum: A decoded envelope.

        Returns:
            The batch.

        Raises:
            pydantic.ValidationError: If a field is invalid.
            ValueError: If an event names a type that is not a log event.
        """
        events = []
        for item in datum["events"]:
            name, event = item
            event_type = _EVENT_BY_NAME.get(name)
            if event_type is None:
                raise ValueError(f"events: {name!r} is not a settled log event")
            events.append(event_type.from_avro(event))
        return cls.model_validate({**datum, "events": tuple(events)})


# ------------------------------------------------------------------------------------------------ the chain


class ChainBreakError(SettledError):
    """A conversation's chain of batches is broken (issue 4 item 2; docs/design.md §3).

    Raised by `verify_chain` and the readers' `RepeatedBatchGuard` (with the offset), and by the fold
    (`settled.protocol.apply`) for a batch that does not continue its conversation's chain (without one).

    Attributes:
        offset: Kafka offset of the first batch at which the break shows; None when the raiser does not know it
            (the fold).
        kind: ``"digest_mismatch"`` (the batch is altered), ``"prev_digest_mismatch"`` (a batch before it is
            missing or altered), ``"seq_gap"``, ``"epoch_regression"``, ``"conversation_mismatch"``,
            ``"repeated_batch"`` or ``"empty_batch"``.
        detail: Human-readable detail.
        conversation_id: The conversation, when the raiser names it.
        field: The envelope field that does not fit (``first_event_seq``, ``prev_batch_digest``, ``events``), when
            the raiser names it.
    """

    category = ErrorCategory.BROKEN_INVARIANT

    def __init__(
        self,
        offset: int | None,
        kind: str,
        detail: str,
        *,
        conversation_id: str | None = None,
        field: str | None = None,
    ) -> None:
        where = "" if offset is None else f" at offset {offset}"
        super().__init__(f"chain break{where} ({kind}): {detail}")
        self.offset = offset
        self.kind = kind
        self.detail = detail
        self.conversation_id = conversation_id
        self.field = field


class RepeatedBatchError(ChainBreakError):
    """A reader met a batch id it had already read; the appender guarantees none (docs/design.md §3).

    Attributes:
        batch_id: The repeated id.
        first_offset: Offset where it was first read.
    """

    def __init__(self, offset: int, batch_id: str, first_offset: int) -> None:
        super().__init__(offset, "repeated_batch", f"batch id {batch_id!r} already read at offset {first_offset}")
        self.batch_id = batch_id
        self.first_offset = first_offset


class RepeatedBatchGuard:
    """Remembers the batch ids a reader has seen and raises on a repeat (docs/design.md §3).

    One guard per reader of a log partition (batch ids are unique across the log).
    """

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def check(self, batch_id: str, offset: int) -> None:
        """Record a batch id, raising if it was seen before.

        Args:
            batch_id: The batch's id.
            offset: Its Kafka offset.

        Raises:
            RepeatedBatchError: If the id was already seen at another offset.
        """
        first = self._seen.setdefault(batch_id, offset)
        if first != offset:
            raise RepeatedBatchError(offset, batch_id, first)


class ChainEntry(NamedTuple):
    """One batch handed to `verify_chain`.

    Attributes:
        offset: The batch's Kafka offset.
        batch: The decoded batch.
        body_digest: `body_batch_digest` of the bytes as read, when the caller has them (the codec's
            ``decode_batch`` returns it); else the digest is recomputed from the batch under the current schema.
    """

    offset: int
    batch: LogBatch
    body_digest: str | None = None


@dataclass(frozen=True)
class ChainHead:
    """Where a verified chain ends.

    Attributes:
        conversation_id: The conversation.
        batch_count: Batches verified.
        last_offset: Offset of the last batch.
        last_event_seq: Its last event sequence.
        last_batch_digest: Its digest (the next batch's ``prev_batch_digest``).
        owner_epoch: Its owner epoch.
    """

    conversation_id: str
    batch_count: int
    last_offset: int
    last_event_seq: int
    last_batch_digest: str
    owner_epoch: int


def verify_chain(batches: Iterable[ChainEntry | tuple[int, LogBatch]], *, after: ChainHead | None = None) -> ChainHead:
    """Walk one conversation's batches in log order and check its hash chain (issue 4 item 2).

    Checks, per batch: its id is new (else `RepeatedBatchError`); it belongs to the conversation; its digest
    matches its content; its ``prev_batch_digest`` is the previous batch's digest (None for the first); its
    ``first_event_seq`` follows the previous ``last_event_seq`` (1 for the first); its owner epoch does not go
    back (docs/design.md §3).

    Args:
        batches: ``(offset, batch)`` pairs or `ChainEntry` items of one conversation, in offset order.
        after: Continue a chain verified earlier from this head instead of from the conversation's start.

    Returns:
        The head of the verified chain.

    Raises:
        ChainBreakError: At the first break, naming its offset and kind.
        ValueError: If there is no batch to verify and no ``after``.
    """
    guard = RepeatedBatchGuard()
    head = after
    for item in batches:
        entry = item if isinstance(item, ChainEntry) else ChainEntry(*item)
        offset, batch = entry.offset, entry.batch
        guard.check(batch.batch_id, offset)
        if head is not None and batch.conversation_id != head.conversation_id:
            raise ChainBreakError(
                offset,
                "conversation_mismatch",
                f"batch of conversation {batch.conversation_id!r} in the chain of {head.conversation_id!r}",
            )
        digest = entry.body_digest if entry.body_digest is not None else batch.compute_digest()
        if digest != batch.batch_digest:
            raise ChainBreakError(
                offset, "digest_mismatch", f"batch {batch.batch_id!r} has digest {batch.batch_digest}, content {digest}"
            )
        expected_prev = None if head is None else head.last_batch_digest
        if batch.prev_batch_digest != expected_prev:
            raise ChainBreakError(
                offset,
                "prev_digest_mismatch",
                f"batch {batch.batch_id!r} follows {batch.prev_batch_digest}, the previous batch is {expected_prev}",
            )
        expected_seq = 1 if head is None else head.last_event_seq + 1
        if batch.first_event_seq != expected_seq:
            raise ChainBreakError(
                offset,
                "seq_gap",
                f"batch {batch.batch_id!r} starts at event {batch.first_event_seq}, expected {expected_seq}",
            )
        if head is not None and batch.owner_epoch < head.owner_epoch:
            raise ChainBreakError(
                offset, "epoch_regression", f"owner epoch {batch.owner_epoch} after {head.owner_epoch}"
            )
        head = ChainHead(
            conversation_id=batch.conversation_id,
            batch_count=(0 if head is None else head.batch_count) + 1,
            last_offset=offset,
            last_event_seq=batch.last_event_seq,
            last_batch_digest=batch.batch_digest,
            owner_epoch=batch.owner_epoch,
        )
    if head is None:
        raise ValueError("verify_chain needs at least one batch (or an `after` head)")
    return head
