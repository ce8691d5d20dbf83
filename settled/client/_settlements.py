"""Reading ``settled.settlements``: one submission's settlement, the stream for downstream readers (docs/design.md §4).

Both read ``read_committed`` on assign-only consumers (no consumer group, nothing committed). A start position given
as a time is found with ``offsets_for_times``; when no record is that recent, the read starts at the end offset
captured *before* the lookup, so a settlement committed in between is not skipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from settled._settings import Settings
from settled.client._errors import BrokerUnavailableError, SettlementTimeoutError
from settled.producers import consume_promptly, partition_for_key, reader_config
from settled.schemas import Codec, SettlementRecord

__all__ = ["TRANSIENT_CONSUMER_ERRORS", "SettlementStream", "read_settlement", "settlement_partitions"]

#: Consumer errors that say nothing about a record: the read goes on (also the shared reader's, `_waits`).
TRANSIENT_CONSUMER_ERRORS = frozenset(
    {
        KafkaError._PARTITION_EOF,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
    }
)


def _consumer(settings: Settings) -> Consumer:
    return Consumer(reader_config(settings, f"{settings.namespace}.client-settlements"))


def settlement_partitions(consumer: Consumer, topic: str, timeout_s: float) -> list[int]:
    """Return the partitions of the settlements topic.

    Args:
        consumer: Any consumer on the cluster.
        topic: The settlements topic.
        timeout_s: Bound on the metadata query, in seconds.

    Returns:
        The partition numbers, sorted.

    Raises:
        BrokerUnavailableError: The topic does not exist, or Kafka did not answer.
    """
    try:
        meta = consumer.list_topics(topic, timeout=max(timeout_s, 0.1)).topics.get(topic)
    except KafkaException as exc:
        raise BrokerUnavailableError(f"could not read the metadata of {topic}: {exc.args[0]}") from exc
    if meta is None or meta.error is not None or not meta.partitions:
        raise BrokerUnavailableError(f"topic {topic} does not exist or has no partitions: run `settled topics create`")
    return sorted(meta.partitions)


def _end_offset(consumer: Consumer, topic: str, partition: int, timeout_s: float) -> int:
    """The read_committed end offset (last stable offset) of a partition."""
    return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s, cached=False)[1])


def _start_at_time(
    consumer: Consumer, topic: str, partitions: list[int], since: datetime, timeout_s: float
) -> list[TopicPartition]:
    """Offsets of the first records at or after ``since``; the captured end offset where there is none."""
    # Captured before the lookup: anything committed after the lookup is at or above them.
    ends = {p: _end_offset(consumer, topic, p, timeout_s) for p in partitions}
    ts_ms = int(since.timestamp() * 1000)
    found = consumer.offsets_for_times([TopicPartition(topic, p, ts_ms) for p in partitions], timeout=timeout_s)
    out = []
    for tp in found:
        if tp.error is not None:
            raise KafkaException(tp.error)
        out.append(TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else ends[tp.partition]))
    return out


def assign_start(
    consumer: Consumer, topic: str, *, from_beginning: bool, since: datetime | None, timeout_s: float
) -> None:
    """Assign every partition of ``topic`` at a follower's start position, or close the consumer and raise.

    Args:
        consumer: A new consumer (closed here when the assignment fails).
        topic: The topic followed (settlements, lifecycle).
        from_beginning: Start at each partition's first record.
        since: Start at each partition's first record at or after this time (aware); ignored with
            ``from_beginning``. Neither: start at the current end (the read_committed end offset).
        timeout_s: Bound on the metadata and position lookups, in seconds.

    Raises:
        BrokerUnavailableError: The topic does not exist, or Kafka did not answer the lookups.
    """
    try:
        partitions = settlement_partitions(consumer, topic, timeout_s)
        if from_beginning:
            start = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions]
        elif since is not None:
            start = _start_at_time(consumer, topic, partitions, since, timeout_s)
        else:
            start = [TopicPartition(topic, p, _end_offset(consumer, topic, p, timeout_s)) for p in partitions]
        consumer.assign(start)
    except KafkaException as exc:
        consumer.close()
        raise BrokerUnavailableError(f"could not find the start positions on {topic}: {exc.args[0]}") from exc
    except BaseException:
        consumer.close()
        raise


def read_settlement(
    settings: Settings,
    codec: Codec,
    conversation_id: str,
    submission_id: str,
    since: datetime,
    timeout_s: float,
) -> SettlementRecord:
    """Read the conversation's partition of ``settled.settlements`` from ``since`` until the submission's settlement.

    Args:
        settings: Namespace and bootstrap servers.
        codec: Decodes the records.
        conversation_id: The conversation (its partition is ``murmur2(conversation id)``, docs/design.md §2).
        submission_id: The admitted submission whose settlement is wanted.
        since: Where to start, as a time (aware); the receipt's ``decided_at`` minus a clock-skew margin.
        timeout_s: Bound on the whole read, in seconds.

    Returns:
        The settlement.

    Raises:
        SettlementTimeoutError: None was read within ``timeout_s``.
        BrokerUnavailableError: The topic does not exist, or Kafka did not answer the position lookups.
        DecodeError: A record in the partition is not a settlement record (the owner writes only those).
    """
    topic = settings.topic("settlements")
    deadline = time.monotonic() + timeout_s
    consumer = _consumer(settings)
    try:
        partitions = settlement_partitions(consumer, topic, timeout_s)
        partition = partition_for_key(conversation_id.encode(), len(partitions))
        try:
            start = _start_at_time(consumer, topic, [partition], since, max(deadline - time.monotonic(), 0.1))
        except KafkaException as exc:
            raise BrokerUnavailableError(f"could not find the start of {topic}[{partition}]: {exc.args[0]}") from exc
        consumer.assign(start)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SettlementTimeoutError(submission_id, conversation_id, topic, partition, timeout_s)
            for msg in consume_promptly(consumer, 500, min(remaining, 0.2)):
                err = msg.error()
                if err is not None:
                    if err.code() in TRANSIENT_CONSUMER_ERRORS:
                        continue
                    raise KafkaException(err)
                record = codec.decode(
                    msg.value(),
                    topic=topic,
                    partition=partition,
                    offset=msg.offset() or 0,
                    expected=(SettlementRecord,),
                )
                assert isinstance(record, SettlementRecord)  # expected= refuses any other type
                if record.submission_id == submission_id:
                    return record
    finally:
        consumer.close()


class SettlementStream(Iterator[SettlementRecord]):
    """An iterator over the committed settlements of every partition; each partition in log order (docs/design.md §2).

    The start positions are fixed when it is built (so "from the end" means from the moment of the call). Close it
    (or use it as a context manager) to release its consumer; it closes itself when ``idle_timeout_s`` ends it.
    """

    def __init__(
        self,
        settings: Settings,
        codec: Codec,
        *,
        from_beginning: bool = False,
        since: datetime | None = None,
        idle_timeout_s: float | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        """Assign every partition of the settlements topic at its start position.

        Args:
            settings: Namespace and bootstrap servers.
            codec: Decodes the records.
            from_beginning: Start at each partition's first record.
            since: Start at each partition's first record at or after this time (aware); ignored with
                ``from_beginning``. Neither: start at the current end.
            idle_timeout_s: Stop after this long without a record, in seconds; ``None``: never stop.
            timeout_s: Bound on the metadata and position lookups, in seconds.

        Raises:
            BrokerUnavailableError: The topic does not exist, or Kafka did not answer the lookups.
        """
        self._topic = settings.topic("settlements")
        self._codec = codec
        self._idle_timeout_s = idle_timeout_s
        self._buffer: list[Message] = []
        consumer = _consumer(settings)
        assign_start(consumer, self._topic, from_beginning=from_beginning, since=since, timeout_s=timeout_s)
        self._consumer: Consumer | None = consumer
        self._last_record = time.monotonic()

    def __iter__(self) -> SettlementStream:
        return self

    def __next__(self) -> SettlementRecord:
        """Return the next settlement, waiting for one.

        Raises:
            StopIteration: ``idle_timeout_s`` passed without a record, or the stream is closed.
            DecodeError: A record is not a settlement record.
            KafkaException: A consumer error about a record.
        """
        while True:
            consumer = self._consumer
            if consumer is None:
                raise StopIteration
            if not self._buffer:
                self._buffer = consume_promptly(consumer, 500, 0.2)
                if not self._buffer:
                    idle = self._idle_timeout_s
                    if idle is not None and time.monotonic() - self._last_record >= idle:
                        self.close()
                    continue
            msg = self._buffer.pop(0)
            err = msg.error()
            if err is not None:
                if err.code() in TRANSIENT_CONSUMER_ERRORS:
                    continue
                raise KafkaException(err)
            self._last_record = time.monotonic()
            record = self._codec.decode(
                msg.value(),
                topic=self._topic,
                partition=msg.partition() or 0,
                offset=msg.offset() or 0,
                expected=(SettlementRecord,),
            )
            assert isinstance(record, SettlementRecord)  # expected= refuses any other type
            return record

    def __enter__(self) -> SettlementStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the consumer; the iteration ends."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
