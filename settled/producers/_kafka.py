"""Kafka client configuration and small read helpers shared by settled's producers and processors.

Every Kafka client settled builds is configured by one of four builders here — `producer_config`, `consumer_config`
(a group member), `reader_config` (an assign-only reader) and `admin_config` — and each starts from the settings'
`settled._connection.KafkaConnection`, so the broker addresses and the SASL/TLS settings reach every client.
Every settled producer uses the Java client's murmur2 partitioner (``murmur2_random`` in librdkafka, docs/design.md §2);
transactional producers get the low ``retry.backoff.ms`` and ``linger.ms`` that docs/design.md §3 measured, every
producer keeps a connection to each broker (`PRODUCER_SPARSE_CONNECTIONS`), and every consumer reads
``read_committed`` with auto commit off.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from settled._settings import Settings

__all__ = [
    "FIRST_QUERY_S",
    "PRODUCER_SPARSE_CONNECTIONS",
    "EndOffsets",
    "admin_config",
    "consume_promptly",
    "consumer_config",
    "end_offsets",
    "producer_config",
    "read_partition",
    "reader_config",
    "transactional_id",
]


#: librdkafka's ``enable.sparse.connections`` for settled's producers: off, so a producer connects to every broker the
#: first metadata response names at once (docs/architecture.md "Restart in place", 2026-12-05). With sparse
#: connections (librdkafka's default) librdkafka drops its bootstrap connection on that response, before it has a
#: connection to a broker it learned; a producer asking for its producer id (``init_transactions``, an idempotent
#: producer's first send) just then finds no broker up and asks again only on a fixed 500 ms timer, which no
#: configuration property shortens: about half the claims of a restarted worker waited those 500 ms. With every
#: broker connected, the learned broker's connection comes up within milliseconds and its first metadata response
#: re-runs the request. The cost: each producer holds a connection to each broker of the cluster.
PRODUCER_SPARSE_CONNECTIONS: Final = False


def transactional_id(settings: Settings, partition: int) -> str:
    """Return the stable, namespaced ``transactional.id`` of the owner of ``partition`` (docs/design.md §3).

    ``<namespace>.<app id>.<log topic>.<partition>``: stable across restarts so that a new owner's
    ``init_transactions()`` fences the previous one; namespaced so that two deployments never fence each other.

    Args:
        settings: Namespace and app id.
        partition: The owned partition number.

    Returns:
        The ``transactional.id``.
    """
    tid = f"{settings.namespace}.{settings.app_id}.{settings.topic('log')}.{partition}"
    from settled._faults import fault_enabled

    if fault_enabled("random_transactional_id"):  # fault switch: breaks fencing (DUR-006) on purpose
        tid = f"{tid}.{uuid.uuid4().hex}"
    return tid


def producer_config(settings: Settings, *, transactional_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """Return a confluent-kafka producer configuration.

    Args:
        settings: The Kafka connection and the producer tuning (``linger_ms``, ``retry_backoff_ms``,
            ``transaction_timeout_ms``).
        transactional_id: When given, a transactional producer (``enable.idempotence`` implied).
        **extra: Further librdkafka properties, applied last.

    Returns:
        The configuration dict.
    """
    conf = settings.kafka.client_config(
        **{
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": settings.linger_ms,
            "retry.backoff.ms": settings.retry_backoff_ms,
            "retry.backoff.max.ms": settings.retry_backoff_max_ms,
            "enable.sparse.connections": PRODUCER_SPARSE_CONNECTIONS,
        }
    )
    if transactional_id is not None:
        conf["transactional.id"] = transactional_id
        conf["transaction.timeout.ms"] = settings.transaction_timeout_ms
    conf.update(extra)
    return conf


def consumer_config(settings: Settings, group_id: str, **extra: Any) -> dict[str, Any]:
    """Return a read_committed, manually committed consumer configuration (docs/design.md §3, §6).

    Args:
        settings: The Kafka connection and the group timeouts.
        group_id: The consumer group (namespaced by the caller).
        **extra: Further librdkafka properties, applied last.

    Returns:
        The configuration dict.
    """
    conf = settings.kafka.client_config(
        **{
            "group.id": group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": settings.session_timeout_ms,
            "heartbeat.interval.ms": settings.heartbeat_interval_ms,
            "partition.assignment.strategy": "cooperative-sticky",
        }
    )
    conf.update(extra)
    return conf


def reader_config(
    settings: Settings, group_id: str, *, isolation_level: str = "read_committed", **extra: Any
) -> dict[str, Any]:
    """Return an assign-only reader's configuration: it never joins its group, commits or stores offsets.

    Args:
        settings: The Kafka connection.
        group_id: The ``group.id`` librdkafka requires of a consumer (namespaced by the caller); never joined.
        isolation_level: ``read_committed`` (settled's readers) or ``read_uncommitted`` (the high watermark).
        **extra: Further librdkafka properties (``enable.partition.eof``, ``auto.offset.reset``, ...), applied last.

    Returns:
        The configuration dict.
    """
    return settings.kafka.client_config(
        **{
            "group.id": group_id,
            "isolation.level": isolation_level,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
            **extra,
        }
    )


def admin_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    """Return an admin client's configuration.

    Args:
        settings: The Kafka connection.
        **extra: Further librdkafka properties, applied last.

    Returns:
        The configuration dict.
    """
    return settings.kafka.client_config(**extra)


_NO_LEADER_YET = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
    }
)


#: How long the first end-offset query of a new reader may take before it is asked once more, in seconds. A new
#: librdkafka client's first metadata request can go out on its bootstrap connection just before that connection is
#: dropped (the first metadata response names the cluster's brokers), and the answer is lost; librdkafka then asks
#: again only after 100, 200, 300 ms (0.5-0.7 s in all, seen in about one new reader in a hundred: a claim's open-
#: transaction check or restore waiting for it). A new query goes out at once (docs/architecture.md "Restart in
#: place"). A first query slower than this for another reason (load) costs one more query, nothing else.
FIRST_QUERY_S: Final = 0.15

#: What librdkafka answers when a query ran out of time: ``_ALL_BROKERS_DOWN`` when no broker connection was up at
#: that moment (as in the window between the dropped bootstrap connection and the learned broker's), else
#: ``_TIMED_OUT``.
_FIRST_QUERY_RAN_OUT = frozenset({KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN})


def _end_offset(consumer: Consumer, tp: TopicPartition, timeout_s: float, deadline: float) -> int:
    """The partition's end offset for ``consumer``'s isolation level, from the broker (not the cache).

    ``consumer`` is a new client: its first query gets `FIRST_QUERY_S`; if it runs out (``_TIMED_OUT``, or
    ``_ALL_BROKERS_DOWN`` when no connection was up then), it is asked once more, with ``timeout_s``.
    A new topic has no leader for a moment, and a fresh client may not know the partition yet
    (``_UNKNOWN_PARTITION`` under load): both are waited out until ``deadline`` (``time.monotonic()`` seconds).

    Raises:
        KafkaException: Any other error, or still no leader at ``deadline``.
    """
    query_s = min(FIRST_QUERY_S, timeout_s)
    while True:
        try:
            return int(consumer.get_watermark_offsets(tp, timeout=query_s, cached=False)[1])
        except KafkaException as exc:
            code = exc.args[0].code()
            if code in _FIRST_QUERY_RAN_OUT and query_s < timeout_s:
                query_s = timeout_s  # the first query's answer may be lost: ask again at once, once
                continue
            if code not in _NO_LEADER_YET or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@dataclass(frozen=True)
class EndOffsets:
    """A partition's end offsets.

    Attributes:
        last_stable: The read_committed end offset (LSO): no open transaction starts below it.
        high_watermark: The read_uncommitted end offset.
    """

    last_stable: int
    high_watermark: int

    @property
    def has_open_transaction(self) -> bool:
        """Whether some transaction is still open on the partition (LSO < high watermark)."""
        return self.last_stable < self.high_watermark


def end_offsets(settings: Settings, topic: str, partition: int, timeout_s: float) -> EndOffsets:
    """Query a partition's LSO and high watermark (claim step 3, docs/design.md §3).

    librdkafka's ``get_watermark_offsets`` answers with the LSO for a read_committed consumer and the high watermark
    for a read_uncommitted one (checked against the broker in tests).

    Args:
        settings: Bootstrap servers.
        topic: Topic name.
        partition: Partition number.
        timeout_s: Bound on each query, in seconds.

    Returns:
        Both end offsets.
    """
    out = []
    deadline = time.monotonic() + timeout_s
    for isolation in ("read_committed", "read_uncommitted"):
        c = Consumer(reader_config(settings, "settled-offsets-query", isolation_level=isolation))
        try:
            out.append(_end_offset(c, TopicPartition(topic, partition), timeout_s, deadline))
        finally:
            c.close()
    return EndOffsets(last_stable=out[0], high_watermark=out[1])


#: How long `read_partition` polls before it checks whether its position reached the end, in seconds.
_READ_POLL_S = 0.01


def read_partition(
    settings: Settings, topic: str, partition: int, start_offset: int, timeout_s: float
) -> Iterator[Message]:
    """Yield every committed record of a partition from ``start_offset`` up to its current LSO.

    Reads on an assign-only read_committed consumer (never the group consumer, docs/design.md §3 step 4) until its
    position reaches the end offset captured at the start; the last offset is usually a transaction marker, so it never
    waits for "end - 1".

    Args:
        settings: Bootstrap servers.
        topic: Topic name.
        partition: Partition number.
        start_offset: First offset to read.
        timeout_s: Bound on the whole read, in seconds.

    Yields:
        The records, in offset order.

    Raises:
        KafkaException: A consumer error, or the read did not reach the end offset within ``timeout_s``.
    """
    c = Consumer(reader_config(settings, f"{settings.namespace}.settled-reader"))
    try:
        tp = TopicPartition(topic, partition)
        deadline = time.monotonic() + timeout_s
        end = _end_offset(c, tp, timeout_s, deadline)
        if start_offset >= end:
            return
        c.assign([TopicPartition(topic, partition, start_offset)])
        while True:
            # A short poll: the last offset before the end is usually a transaction marker, never returned, so the
            # read ends when a poll comes back empty and the position has reached the end. A 200 ms poll made every
            # claim's restore wait 200 ms after its last record (measured: 210 ms to restore 6 records,
            # bench/restart.py); 10 ms costs a few position checks while a fetch is on its way.
            msg = c.poll(_READ_POLL_S)
            if msg is not None:
                err = msg.error()
                if err is not None:
                    raise KafkaException(err)
                yield msg
                offset = msg.offset()
                if offset is not None and offset + 1 >= end:
                    return
                continue
            position = c.position([tp])[0].offset
            if position >= end:
                return
            if time.monotonic() > deadline:
                raise KafkaException(
                    KafkaError(KafkaError._TIMED_OUT, f"reading {topic}[{partition}] to {end} took over {timeout_s} s")
                )
    finally:
        c.close()


def consume_promptly(consumer: Consumer, max_records: int, timeout_s: float) -> list[Message]:
    """Return the records ready now, waiting at most ``timeout_s`` for the first one.

    ``Consumer.consume(n, t)`` returns only once ``n`` records arrived or ``t`` passed, so with fewer records ready
    every call waits the whole timeout (measured: 50 ms for one ready record at ``t=0.05``; ``bench/worker.py``).
    Here the wait ends with the first record, and the rest of what is ready comes without waiting.

    Args:
        consumer: The consumer.
        max_records: Most records returned (>= 1).
        timeout_s: Longest wait for the first record, in seconds.

    Returns:
        Up to ``max_records`` records (error events included, as ``consume`` returns them).
    """
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    if max_records <= 1:
        return [first]
    return [first, *consumer.consume(max_records - 1, 0)]
