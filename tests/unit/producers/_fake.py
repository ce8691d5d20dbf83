"""A fake transactional producer and log for the appender's unit tests: confluent-kafka's protocol, no broker.

`FakeKafka` holds what a broker would: committed records per topic (aborted ones are discarded; their offsets are
not reused, as in Kafka), the committed input offset, and a rule rejecting chosen records at delivery. The way it
fails records follows the broker and librdkafka: a rejected record fails with its error, and so do the other records
of its topic produced in the same transaction (a broker rejects whole record batches); records of other topics in
that transaction fail with ``_PURGE_QUEUE`` (the transaction must abort). `FakeProducer` speaks
`settled.producers.TransactionalProducer`; `FakePartitionLog` speaks `settled.producers.PartitionLog`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from settled.producers import BATCH_ID_HEADER, EndOffsets
from settled.producers._txproducer import DeliveryCallback


@dataclass(frozen=True)
class FakeRecord:
    topic: str
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    offset: int

    def batch_id(self) -> str | None:
        return next((v.decode() for k, v in self.headers if k == BATCH_ID_HEADER), None)


class FakeMessage:
    def __init__(self, record: FakeRecord) -> None:
        self._record = record

    def topic(self) -> str:
        return self._record.topic

    def offset(self) -> int:
        return self._record.offset


@dataclass
class FakeKafka:
    """The broker side: committed records, the committed input offset, and which records it rejects.

    Attributes:
        reject: Given a produced record, the ``KafkaError`` code the broker rejects it with, or ``None``.
        committed: Committed records per topic, in offset order.
        input_offset: The input offset committed with the last transaction that carried one.
        producers: How many producers called ``init_transactions``.
        transactions: Outcomes in order: ``"commit"`` or ``"abort"``.
    """

    reject: Callable[[FakeRecord], int | None] = lambda _record: None
    committed: dict[str, list[FakeRecord]] = field(default_factory=dict)
    input_offset: int | None = None
    producers: int = 0
    transactions: list[str] = field(default_factory=list)
    _next_offset: dict[str, int] = field(default_factory=dict)

    def allocate(self, topic: str) -> int:
        offset = self._next_offset.get(topic, 0)
        self._next_offset[topic] = offset + 1
        return offset

    def end(self, topic: str) -> int:
        return self._next_offset.get(topic, 0)

    def batch_ids(self, topic: str) -> list[str]:
        return [r.batch_id() or "" for r in self.committed.get(topic, [])]


class FakeProducer:
    """`settled.producers.TransactionalProducer` over a `FakeKafka`."""

    def __init__(self, kafka: FakeKafka) -> None:
        self._kafka = kafka
        self._open = False
        self._queued: list[tuple[FakeRecord, DeliveryCallback]] = []
        self._delivered: list[FakeRecord] = []
        self._offsets: int | None = None
        self._failed = False

    def init_transactions(self, timeout: float) -> None:
        self._kafka.producers += 1

    def begin_transaction(self) -> None:
        if self._open:
            raise KafkaException(KafkaError(KafkaError._STATE, "a transaction is already open"))
        self._open, self._delivered, self._offsets, self._failed = True, [], None, False

    def produce(
        self,
        topic: str,
        *,
        value: bytes,
        key: bytes,
        partition: int,
        headers: list[tuple[str, bytes]],
        on_delivery: DeliveryCallback,
    ) -> None:
        if not self._open:
            raise KafkaException(KafkaError(KafkaError._STATE, "produce outside a transaction"))
        record = FakeRecord(topic, key, value, tuple(headers), self._kafka.allocate(topic))
        self._queued.append((record, on_delivery))

    def poll(self, timeout: float) -> int:
        self.flush(timeout)
        return 0

    def flush(self, timeout: float) -> int:
        queued, self._queued = self._queued, []
        rejected = {r.topic: code for r, _ in queued if (code := self._kafka.reject(r)) is not None}
        for record, on_delivery in queued:
            if record.topic in rejected:
                on_delivery(KafkaError(rejected[record.topic]), FakeMessage(record))
            elif rejected:
                on_delivery(KafkaError(KafkaError._PURGE_QUEUE), FakeMessage(record))
            else:
                self._delivered.append(record)
                on_delivery(None, FakeMessage(record))
        self._failed = self._failed or bool(rejected)
        return 0

    def send_offsets_to_transaction(
        self, positions: Sequence[TopicPartition], group_metadata: Any, timeout: float
    ) -> None:
        (position,) = positions
        self._offsets = position.offset

    def commit_transaction(self, timeout: float) -> None:
        if self._failed:
            raise KafkaException(
                KafkaError(KafkaError._STATE, "commit after a failed delivery", txn_requires_abort=True)
            )
        for record in self._delivered:
            self._kafka.committed.setdefault(record.topic, []).append(record)
        if self._offsets is not None:
            self._kafka.input_offset = self._offsets
        self._kafka.transactions.append("commit")
        self._open = False

    def abort_transaction(self, timeout: float) -> None:
        self._kafka.transactions.append("abort")
        self._open, self._delivered, self._queued = False, [], []


class FakePartitionLog:
    """`settled.producers.PartitionLog` over a `FakeKafka`'s log topic (no transaction is ever left open)."""

    def __init__(self, kafka: FakeKafka, topic: str) -> None:
        self._kafka, self._topic = kafka, topic

    def end_offsets(self, timeout_s: float) -> EndOffsets:
        end = self._kafka.end(self._topic)
        return EndOffsets(last_stable=end, high_watermark=end)

    def batch_ids_since(self, start_offset: int, timeout_s: float) -> set[str]:
        records = self._kafka.committed.get(self._topic, [])
        return {bid for r in records if r.offset >= start_offset and (bid := r.batch_id()) is not None}
