"""Following a run's provisional stream (`Client.stream`, issue 19 item 2).

See docs/architecture.md "The provisional stream". A run publishes ``ctx.emit`` parts and model text deltas to
``<ns>.stream`` as they happen (settled/producers/_stream.py), on the partition of its conversation. `RunStream`
reads that partition from a cursor and yields the run's parts until the run's settlement (read from the same
partition of ``<ns>.settlements``):

* A part of an earlier attempt that comes after a part of a later one is dropped: that attempt was superseded.
  When the first part of a later attempt arrives after parts of an earlier one, a `Superseded` marker comes first:
  the earlier attempt's parts already yielded are provisional output that the later attempt replaces.
* Every item carries a cursor; `Client.stream(receipt, cursor=...)` resumes right after that item, with the same
  attempt filter, so a reconnect misses nothing and repeats nothing.
* The iteration ends once the settlement is read and the stream partition is read up to its end at that moment: the
  worker waits for an attempt's parts to reach the stream before it returns the reply (`RunOptions.stream_flush_s`),
  so every part of the settling attempt is before that end. `RunStream.settlement` is then the settlement.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from settled._settings import Settings
from settled.client._errors import BrokerUnavailableError, SettlementTimeoutError
from settled.client._settlements import TRANSIENT_CONSUMER_ERRORS as _TRANSIENT
from settled.client._settlements import settlement_partitions
from settled.producers import StreamPart, StreamPartError, consume_promptly, decode_part, reader_config
from settled.producers._partitioner import partition_for_key
from settled.schemas import Codec, SettlementRecord

__all__ = ["Part", "RunStream", "StreamItem", "Superseded", "follow_state", "parse_cursor"]

_log = logging.getLogger(__name__)

_CURSOR_PREFIX = "s1"


@dataclass(frozen=True)
class Part:
    """A provisional part of the run.

    Attributes:
        kind: ``"emit"`` (a ``ctx.emit`` value), ``"text"`` or ``"reasoning"`` (a model delta), or ``"interrupted"``
            (the model call's text since its last try began was cut; its retry's text follows).
        data: The emitted JSON value, the delta's text, or ``{"response_ordinal": n, "error": ...}``.
        attempt_id: The attempt that published it.
        attempt: That attempt's number.
        seq: Its position within the attempt.
        cursor: Resume right after this part (`Client.stream`'s ``cursor``).
    """

    kind: str
    data: Any
    attempt_id: str
    attempt: int
    seq: int
    cursor: str


@dataclass(frozen=True)
class Superseded:
    """The parts of attempt ``attempt`` yielded so far are superseded by attempt ``by_attempt``'s (drop them).

    Attributes:
        attempt: The superseded attempt's number.
        by_attempt: The superseding attempt's number.
        by_attempt_id: The superseding attempt's id.
        cursor: Resume right after this marker.
    """

    attempt: int
    by_attempt: int
    by_attempt_id: str
    cursor: str


StreamItem = Part | Superseded
"""What `RunStream` yields."""


@dataclass
class _Follow:
    """Where a follower is: the next stream offset, the latest attempt seen and its last part's sequence."""

    partition: int
    offset: int
    attempt: int = 0  # 0: no part seen yet
    last_seq: int = -1

    def cursor(self) -> str:
        return f"{_CURSOR_PREFIX}.{self.partition}.{self.offset}.{self.attempt}.{self.last_seq}"


def parse_cursor(cursor: str) -> tuple[int, int, int, int]:
    """Read a cursor: (partition, next offset, latest attempt seen, last sequence of that attempt).

    Args:
        cursor: A cursor from a `Part` or `Superseded`.

    Returns:
        Its four numbers.

    Raises:
        ValueError: Not a cursor this client wrote; names the value.
    """
    fields = cursor.split(".")
    try:
        if len(fields) != 5 or fields[0] != _CURSOR_PREFIX:
            raise ValueError
        partition, offset, attempt, last_seq = (int(f) for f in fields[1:])
    except ValueError:
        raise ValueError(
            f"cursor {cursor!r} is not a stream cursor ({_CURSOR_PREFIX}.<p>.<offset>.<n>.<seq>)"
        ) from None
    if partition < 0 or offset < 0 or attempt < 0 or last_seq < -1:
        raise ValueError(f"cursor {cursor!r} has a negative position")
    return partition, offset, attempt, last_seq


def follow_state(state: _Follow, part: StreamPart, next_offset: int) -> list[StreamItem]:
    """Advance a follower past one of its run's parts: what it yields for it (the pure rule of the module docstring).

    Args:
        state: The follower's position (updated).
        part: The run's part read at ``next_offset - 1``.
        next_offset: The stream offset after it.

    Returns:
        Nothing (a superseded attempt's part, a repeat), the part, or a `Superseded` marker and the part.
    """
    if part.attempt < state.attempt:
        state.offset = next_offset
        return []  # an attempt already superseded
    out: list[StreamItem] = []
    if part.attempt > state.attempt:
        earlier = state.attempt
        state.attempt, state.last_seq = part.attempt, -1
        if earlier:
            # The marker's cursor resumes at the part that superseded the attempt: that part is yielded next.
            state.offset = next_offset - 1
            out.append(Superseded(earlier, part.attempt, part.attempt_id, state.cursor()))
    state.offset = next_offset
    if part.seq <= state.last_seq:
        return out  # a repeat of a part already yielded
    state.last_seq = part.seq
    out.append(Part(part.kind, part.data, part.attempt_id, part.attempt, part.seq, state.cursor()))
    return out


class RunStream(Iterator[StreamItem]):
    """An iterator over one run's provisional parts until its settlement (module docstring). Close it when done.

    Args:
        settings: Namespace and Kafka settings.
        codec: Decodes settlements.
        conversation_id: The run's conversation.
        submission_id: The run.
        since: Where to start without a cursor, as a time (aware): the receipt's ``decided_at`` less a margin.
        cursor: Resume right after the item that carried it.
        timeout_s: Bound on the whole follow, in seconds (the run must settle within it).

    Attributes:
        settlement: The run's settlement, once the iteration ended.

    Raises:
        ValueError: ``cursor`` is not a stream cursor, or names another partition than the conversation's.
        BrokerUnavailableError: A topic does not exist, or Kafka did not answer the position lookups.
    """

    def __init__(
        self,
        settings: Settings,
        codec: Codec,
        conversation_id: str,
        submission_id: str,
        since: datetime,
        cursor: str | None,
        timeout_s: float,
    ) -> None:
        self._codec = codec
        self._conversation_id = conversation_id
        self._submission_id = submission_id
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s
        self._stream_topic = settings.topic("stream")
        self._settlements_topic = settings.topic("settlements")
        self.settlement: SettlementRecord | None = None
        self._end: int | None = None  # the stream's end offset when the settlement was read
        self._pending: list[StreamItem] = []
        consumer = Consumer(reader_config(settings, f"{settings.namespace}.client-stream"))
        try:
            partitions = settlement_partitions(consumer, self._settlements_topic, timeout_s)
            partition = partition_for_key(conversation_id.encode(), len(partitions))
            if cursor is not None:
                p, offset, attempt, last_seq = parse_cursor(cursor)
                if p != partition:
                    raise ValueError(
                        f"cursor {cursor!r} names partition {p}; conversation {conversation_id!r} is on {partition}"
                    )
                self._state = _Follow(partition, offset, attempt, last_seq)
            else:
                self._state = _Follow(partition, self._offset_at(consumer, self._stream_topic, partition, since))
            self._partition = partition
            start = self._offset_at(consumer, self._settlements_topic, partition, since)
            consumer.assign(
                [
                    TopicPartition(self._stream_topic, partition, self._state.offset),
                    TopicPartition(self._settlements_topic, partition, start),
                ]
            )
        except KafkaException as exc:
            consumer.close()
            raise BrokerUnavailableError(f"could not find the start of the run's stream: {exc.args[0]}") from exc
        except BaseException:
            consumer.close()
            raise
        self._consumer: Consumer | None = consumer

    def _offset_at(self, consumer: Consumer, topic: str, partition: int, since: datetime) -> int:
        """The offset of the partition's first record at or after ``since``; its end when there is none."""
        timeout_s = max(self._deadline - time.monotonic(), 0.1)
        end = int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s, cached=False)[1])
        ts_ms = int(since.timestamp() * 1000)
        (found,) = consumer.offsets_for_times([TopicPartition(topic, partition, ts_ms)], timeout=timeout_s)
        if found.error is not None:
            raise KafkaException(found.error)
        return int(found.offset) if found.offset >= 0 else end

    def __iter__(self) -> RunStream:
        return self

    def __next__(self) -> StreamItem:
        """Return the run's next item, waiting for it.

        Raises:
            StopIteration: The run settled and its parts are read (`settlement` is set), or the stream is closed.
            SettlementTimeoutError: The run did not settle within ``timeout_s``; resume with the last cursor.
            KafkaException: A consumer error.
        """
        while not self._pending:
            consumer = self._consumer
            if consumer is None:
                raise StopIteration
            if self._end is not None and self._state.offset >= self._end:
                self.close()
                raise StopIteration
            if time.monotonic() >= self._deadline:
                self.close()
                raise SettlementTimeoutError(
                    self._submission_id,
                    self._conversation_id,
                    self._settlements_topic,
                    self._partition,
                    self._timeout_s,
                )
            for msg in consume_promptly(consumer, 500, 0.2):
                err = msg.error()
                if err is not None:
                    if err.code() in _TRANSIENT:
                        continue
                    raise KafkaException(err)
                offset = msg.offset() or 0
                if msg.topic() == self._settlements_topic:
                    self._on_settlement(consumer, msg.value() or b"", offset)
                    continue
                self._on_part(msg.value() or b"", offset)
        return self._pending.pop(0)

    def _on_settlement(self, consumer: Consumer, value: bytes, offset: int) -> None:
        record = self._codec.decode(
            value, topic=self._settlements_topic, partition=self._partition, offset=offset, expected=(SettlementRecord,)
        )
        assert isinstance(record, SettlementRecord)  # expected= refuses any other type
        if record.submission_id != self._submission_id or self.settlement is not None:
            return
        self.settlement = record
        tp = TopicPartition(self._stream_topic, self._partition)
        timeout_s = max(self._deadline - time.monotonic(), 0.1)
        self._end = int(consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)[1])

    def _on_part(self, value: bytes, offset: int) -> None:
        try:
            part = decode_part(value)
        except StreamPartError as exc:
            # Provisional and not the run's to vouch for: a record nobody can attribute is skipped, loudly.
            _log.warning(
                "unreadable stream record skipped",
                extra={"topic": self._stream_topic, "partition": self._partition, "offset": offset, "error": str(exc)},
            )
            self._state.offset = offset + 1
            return
        if part.run != self._submission_id or part.conversation_id != self._conversation_id:
            self._state.offset = offset + 1
            return
        self._pending.extend(follow_state(self._state, part, offset + 1))

    def __enter__(self) -> RunStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the consumer; the iteration ends."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
