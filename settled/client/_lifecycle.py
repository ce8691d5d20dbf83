"""Subscribing to ``settled.lifecycle``: the ``durable.*`` events of runs (issue 17 item 5; docs/architecture.md).

`LifecycleStream` reads every partition ``read_committed`` on an assign-only consumer (no consumer group, nothing
committed), like `settled.client._settlements.SettlementStream`, and yields the events whose type matches a pattern
(`settled.protocol.lifecycle_matches`: ``fnmatch``, e.g. ``durable.*``). The owner produces each event in the
transaction that makes its cause canonical, so a read_committed reader sees each event once per occurrence and a
run's events in log order (one partition per conversation); an event's ``event_id`` (causing batch id + index) lets
a consumer that re-reads dedupe.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime

from confluent_kafka import Consumer, KafkaException, Message

from settled._settings import Settings
from settled.client._settlements import TRANSIENT_CONSUMER_ERRORS, assign_start
from settled.producers import consume_promptly, reader_config
from settled.protocol import lifecycle_matches
from settled.schemas import Codec, LifecycleEvent

__all__ = ["LifecycleStream"]

#: Longest single wait on the consumer, in seconds (an idle stream checks its idle timeout this often).
_POLL_S = 0.2


class LifecycleStream(Iterator[LifecycleEvent]):
    """An iterator over the committed lifecycle events of every partition matching a pattern; each run's in order.

    The start positions are fixed when it is built (so "from the end" means from the moment of the call). Close it
    (or use it as a context manager) to release its consumer; it closes itself when ``idle_timeout_s`` ends it.
    """

    def __init__(
        self,
        settings: Settings,
        codec: Codec,
        pattern: str,
        *,
        from_beginning: bool = False,
        since: datetime | None = None,
        idle_timeout_s: float | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        """Assign every partition of the lifecycle topic at its start position.

        Args:
            settings: Namespace and bootstrap servers.
            codec: Decodes the records.
            pattern: Which event types to yield (``fnmatch``, case-sensitive), e.g. ``"durable.*"``.
            from_beginning: Start at each partition's first record.
            since: Start at each partition's first record at or after this time (aware); ignored with
                ``from_beginning``. Neither: start at the current end.
            idle_timeout_s: Stop after this long without a record, in seconds; ``None``: never stop.
            timeout_s: Bound on the metadata and position lookups, in seconds.

        Raises:
            ValueError: ``pattern`` is empty.
            BrokerUnavailableError: The topic does not exist, or Kafka did not answer the lookups.
        """
        if not pattern:
            raise ValueError(f"pattern must name event types, e.g. 'durable.*', got {pattern!r}")
        self._topic = settings.topic("lifecycle")
        self._codec = codec
        self._pattern = pattern
        self._idle_timeout_s = idle_timeout_s
        self._buffer: list[Message] = []
        consumer = Consumer(reader_config(settings, f"{settings.namespace}.client-lifecycle"))
        assign_start(consumer, self._topic, from_beginning=from_beginning, since=since, timeout_s=timeout_s)
        self._consumer: Consumer | None = consumer
        self._last_record = time.monotonic()

    def __iter__(self) -> LifecycleStream:
        return self

    def __next__(self) -> LifecycleEvent:
        """Return the next matching lifecycle event, waiting for one.

        Raises:
            StopIteration: ``idle_timeout_s`` passed without a record, or the stream is closed.
            DecodeError: A record is not a lifecycle event.
            KafkaException: A consumer error about a record.
        """
        while self._consumer is not None:
            event = self.poll(_POLL_S)
            if event is not None:
                return event
            idle = self._idle_timeout_s
            if idle is not None and time.monotonic() - self._last_record >= idle:
                self.close()
        raise StopIteration

    @property
    def closed(self) -> bool:
        """Whether the stream is closed (by `close`, or by ``idle_timeout_s`` in iteration)."""
        return self._consumer is None

    def poll(self, timeout_s: float) -> LifecycleEvent | None:
        """Return the next matching lifecycle event, or ``None`` when none came within ``timeout_s`` (or closed).

        Args:
            timeout_s: How long to wait for a matching event, in seconds.

        Returns:
            The event, or ``None``.

        Raises:
            DecodeError: A record is not a lifecycle event.
            KafkaException: A consumer error about a record.
        """
        deadline = time.monotonic() + timeout_s
        while (consumer := self._consumer) is not None:
            if not self._buffer:
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    return None
                self._buffer = consume_promptly(consumer, 500, min(_POLL_S, left_s))
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
                expected=(LifecycleEvent,),
            )
            assert isinstance(record, LifecycleEvent)  # expected= refuses any other type
            if lifecycle_matches(self._pattern, record.type):
                return record
        return None

    def __enter__(self) -> LifecycleStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the consumer; the iteration ends."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
