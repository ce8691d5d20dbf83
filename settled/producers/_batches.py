"""The records the appender produces: one conversation's canonical batch with its side records, and runs of them."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from settled.producers._txproducer import BATCH_ID_HEADER

__all__ = ["AppendBatch", "OutRecord", "Run"]


@dataclass(frozen=True)
class OutRecord:
    """One encoded record to produce inside the transaction.

    Attributes:
        topic: Destination topic (co-partitioned with the inbox; the record goes to the owned partition).
        key: Record key: the conversation id, UTF-8.
        value: Encoded value.
        headers: Kafka headers.
    """

    topic: str
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class AppendBatch:
    """A canonical batch of one conversation, encoded, with its side records and the inputs it decides.

    Attributes:
        batch_id: The batch's id (deterministic: a repeated batch id in the log is a bug, and readers raise on it).
        conversation_id: The conversation the batch belongs to.
        log_record: The encoded canonical batch envelope for ``settled.log``.
        side_records: Receipts, settlements and quarantine records produced in the same transaction.
        inputs: Inbox offsets whose decision this batch carries (docs/design.md §3: every consumed inbox record yields
            exactly one log record carrying its offset).
    """

    batch_id: str
    conversation_id: str
    log_record: OutRecord
    side_records: tuple[OutRecord, ...] = ()
    inputs: frozenset[int] = frozenset()

    @functools.cached_property
    def records(self) -> tuple[OutRecord, ...]:
        """The log record (with its batch-id header) followed by the side records; computed once."""
        log = self.log_record
        if not any(k == BATCH_ID_HEADER for k, _ in log.headers):
            log = OutRecord(log.topic, log.key, log.value, (*log.headers, (BATCH_ID_HEADER, self.batch_id.encode())))
        return (log, *self.side_records)

    @functools.cached_property
    def largest_record_bytes(self) -> int:
        """The size of the largest record (key + value + headers), in bytes; computed once."""
        return max(len(r.key) + len(r.value) + sum(len(k) + len(v) for k, v in r.headers) for r in self.records)


Run = tuple[AppendBatch, ...]
"""One conversation's batches within a checkpoint, in order: they join, leave and are replaced together, so a
conversation's chain (event sequences, previous-batch digests) is never reordered or broken by a retry."""
