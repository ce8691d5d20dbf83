"""The transactional producer behind a small interface, its confluent-kafka adapter and a fault-injecting adapter.

`settled.producers._appender.TransactionalAppender` speaks to Kafka only through `TransactionalProducer`: the calls
of confluent-kafka's ``Producer`` that a transaction needs, with its error model (``KafkaException`` carrying a
``KafkaError``). Three implementations:

- `ConfluentProducer`: the real one (a ``confluent_kafka.Producer``), which also turns the ``SystemError`` that
  confluent-kafka raises when a delivery callback runs after a fatal error back into that fatal ``KafkaException``.
- `FaultInjectingProducer`: wraps another and, at the named failpoints (`settled._failpoints`), raises the errors
  that the broker raises only under conditions a test cannot set up on demand (a stale group coordinator, an
  abortable or fatal commit error, an expired producer-id mapping, a commit whose answer is lost). Disarmed, every
  call goes straight through.
- A fake in the unit tests (``tests/unit/producers/``), so the appender's group policy runs without a broker.

The appender reads the log partition it owns (claim step 3 and the outcome-unknown step 7) through `PartitionLog`,
whose Kafka adapter is `KafkaPartitionLog`, so the same fake covers those steps too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from settled._failpoints import FailpointError, failpoint
from settled._settings import Settings
from settled.producers._kafka import EndOffsets, end_offsets, read_partition

__all__ = [
    "BATCH_ID_HEADER",
    "ConfluentProducer",
    "DeliveryCallback",
    "FaultInjectingProducer",
    "KafkaPartitionLog",
    "PartitionLog",
    "TransactionalProducer",
    "default_producer_factory",
]

#: Kafka header carrying a log record's batch id, so the appender can recognise its batches without decoding them.
BATCH_ID_HEADER = "settled.batch_id"

DeliveryCallback = Callable[[KafkaError | None, Any], None]
"""confluent-kafka's ``on_delivery``: ``(error or None, message)``; the message has ``topic()`` and ``offset()``."""


class TransactionalProducer(Protocol):
    """The transactional calls of confluent-kafka's ``Producer`` the appender uses, with their error model.

    Every call raises ``KafkaException`` (its ``args[0]`` a ``KafkaError``) on failure, as confluent-kafka does;
    ``produce`` raises ``BufferError`` when the local queue is full. Timeouts are in seconds.
    """

    def init_transactions(self, timeout: float) -> None:
        """Acquire the producer id for the ``transactional.id``, fencing every older producer with the same id."""

    def begin_transaction(self) -> None:
        """Begin a transaction."""

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
        """Queue one record; ``on_delivery`` is called from ``poll`` or ``flush`` with its delivery report."""

    def poll(self, timeout: float) -> int:
        """Serve delivery reports for up to ``timeout`` seconds; return how many were served."""

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for every queued record; return how many are still not delivered."""

    def send_offsets_to_transaction(
        self, positions: Sequence[TopicPartition], group_metadata: Any, timeout: float
    ) -> None:
        """Add consumer offsets, with the group's metadata (KIP-447), to the open transaction."""

    def commit_transaction(self, timeout: float) -> None:
        """Commit the open transaction."""

    def abort_transaction(self, timeout: float) -> None:
        """Abort the open transaction."""


def _fatal_cause(exc: SystemError) -> KafkaException:
    """Return the fatal ``KafkaException`` a ``SystemError`` is chained to, or re-raise the ``SystemError``.

    confluent-kafka still runs delivery callbacks after a fatal error (e.g. ``_FENCED``) set its exception, so the
    callback fails with a ``SystemError`` chained to that fatal error (tests/integration/test_fencing.py).
    """
    cause = exc.__cause__
    if isinstance(cause, KafkaException) and cause.args[0].fatal():
        return cause
    raise exc


class ConfluentProducer:
    """`TransactionalProducer` over a ``confluent_kafka.Producer``.

    Args:
        config: The librdkafka configuration (`settled.producers._kafka.producer_config`).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self._producer = Producer(config)

    def init_transactions(self, timeout: float) -> None:
        """See `TransactionalProducer.init_transactions`."""
        try:
            self._producer.init_transactions(timeout)
        except SystemError as exc:
            raise _fatal_cause(exc) from exc

    def begin_transaction(self) -> None:
        """See `TransactionalProducer.begin_transaction`."""
        try:
            self._producer.begin_transaction()
        except SystemError as exc:
            raise _fatal_cause(exc) from exc

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
        """See `TransactionalProducer.produce`."""
        try:
            wire_headers: list[tuple[str, str | bytes | None]] = list(headers)
            self._producer.produce(
                topic, value=value, key=key, partition=partition, headers=wire_headers, on_delivery=on_delivery
            )
        except SystemError as exc:
            raise _fatal_cause(exc) from exc

    def poll(self, timeout: float) -> int:
        """See `TransactionalProducer.poll`."""
        try:
            return int(self._producer.poll(timeout))
        except SystemError as exc:
            raise _fatal_cause(exc) from exc

    def flush(self, timeout: float) -> int:
        """See `TransactionalProducer.flush`."""
        try:
            return int(self._producer.flush(timeout))
        except SystemError as exc:
            raise _fatal_cause(exc) from exc

    def send_offsets_to_transaction(
        self, positions: Sequence[TopicPartition], group_metadata: Any, timeout: float
    ) -> None:
        """See `TransactionalProducer.send_offsets_to_transaction`."""
        try:
            self._producer.send_offsets_to_transaction(list(positions), group_metadata, timeout)
        except SystemError as exc:
            raise _fatal_cause(exc) from exc

    def commit_transaction(self, timeout: float) -> None:
        """See `TransactionalProducer.commit_transaction`."""
        try:
            self._producer.commit_transaction(timeout)
        except SystemError as exc:
            raise _fatal_cause(exc) from exc

    def abort_transaction(self, timeout: float) -> None:
        """See `TransactionalProducer.abort_transaction`."""
        try:
            self._producer.abort_transaction(timeout)
        except SystemError as exc:
            raise _fatal_cause(exc) from exc


def _injected(name: str, error: Callable[[str], KafkaError]) -> None:
    """Raise ``KafkaException(error(reason))`` when the failpoint ``name`` fires with ``raise``."""
    try:
        failpoint(name)
    except FailpointError as exc:
        raise KafkaException(error(str(exc))) from exc


class FaultInjectingProducer:
    """A `TransactionalProducer` that raises broker errors at failpoints, then delegates to ``inner``.

    The failpoints (each fires with ``raise``; disarmed they cost one dictionary lookup):

    - ``appender.offsets_refused_by_coordinator``: ``send_offsets_to_transaction`` is refused with the abortable
      ``NOT_COORDINATOR`` a group coordinator still loading its state answers right after a broker restart.
    - ``appender.abortable_commit_error``: the commit fails with an abortable error that blames no record.
    - ``appender.fatal_commit_error``: the commit fails with a fatal producer error.
    - ``appender.invalid_producer_id_mapping``: the commit finds the coordinator no longer maps the
      ``transactional.id`` to a producer id (it expired while the owner was stopped), reported as librdkafka does:
      abortable.
    - ``appender.commit_outcome_lost``: the commit succeeds but its answer is lost: ``_TIMED_OUT`` is raised after it.

    Args:
        inner: The producer to delegate to.
    """

    def __init__(self, inner: TransactionalProducer) -> None:
        self._inner = inner

    def init_transactions(self, timeout: float) -> None:
        """See `TransactionalProducer.init_transactions`."""
        self._inner.init_transactions(timeout)

    def begin_transaction(self) -> None:
        """See `TransactionalProducer.begin_transaction`."""
        self._inner.begin_transaction()

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
        """See `TransactionalProducer.produce`."""
        self._inner.produce(topic, value=value, key=key, partition=partition, headers=headers, on_delivery=on_delivery)

    def poll(self, timeout: float) -> int:
        """See `TransactionalProducer.poll`."""
        return self._inner.poll(timeout)

    def flush(self, timeout: float) -> int:
        """See `TransactionalProducer.flush`."""
        return self._inner.flush(timeout)

    def send_offsets_to_transaction(
        self, positions: Sequence[TopicPartition], group_metadata: Any, timeout: float
    ) -> None:
        """See `TransactionalProducer.send_offsets_to_transaction`; ``appender.offsets_refused_by_coordinator``."""
        _injected(
            "appender.offsets_refused_by_coordinator",
            lambda why: KafkaError(KafkaError.NOT_COORDINATOR, f"injected: {why}", txn_requires_abort=True),
        )
        self._inner.send_offsets_to_transaction(positions, group_metadata, timeout)

    def commit_transaction(self, timeout: float) -> None:
        """See `TransactionalProducer.commit_transaction`; the commit failpoints of the class docstring."""
        _injected(
            "appender.abortable_commit_error",
            lambda why: KafkaError(KafkaError._APPLICATION, f"injected abortable error: {why}"),
        )
        _injected(
            "appender.fatal_commit_error",
            lambda why: KafkaError(KafkaError._FATAL, f"injected fatal error: {why}", fatal=True),
        )
        _injected(
            "appender.invalid_producer_id_mapping",
            lambda why: KafkaError(KafkaError.INVALID_PRODUCER_ID_MAPPING, f"injected: {why}", txn_requires_abort=True),
        )
        self._inner.commit_transaction(timeout)
        _injected(
            "appender.commit_outcome_lost",
            lambda why: KafkaError(KafkaError._TIMED_OUT, f"injected: the commit's answer was lost: {why}"),
        )

    def abort_transaction(self, timeout: float) -> None:
        """See `TransactionalProducer.abort_transaction`."""
        self._inner.abort_transaction(timeout)


def default_producer_factory(config: dict[str, Any]) -> TransactionalProducer:
    """Return the production producer: a `ConfluentProducer` inside a `FaultInjectingProducer`.

    Args:
        config: The librdkafka configuration.

    Returns:
        The producer; its failpoints cost nothing while disarmed.
    """
    return FaultInjectingProducer(ConfluentProducer(config))


class PartitionLog(Protocol):
    """The reads the appender makes of the log partition it owns."""

    def end_offsets(self, timeout_s: float) -> EndOffsets:
        """Return the partition's LSO and high watermark, each query bounded by ``timeout_s`` seconds."""

    def batch_ids_since(self, start_offset: int, timeout_s: float) -> set[str]:
        """Return the batch ids (`BATCH_ID_HEADER`) of the committed records from ``start_offset`` to the LSO."""


class KafkaPartitionLog:
    """`PartitionLog` read from the broker with assign-only ``read_committed`` consumers.

    Args:
        settings: Bootstrap servers and namespace.
        topic: The log topic.
        partition: The owned partition.
    """

    def __init__(self, settings: Settings, topic: str, partition: int) -> None:
        self._settings, self._topic, self._partition = settings, topic, partition

    def end_offsets(self, timeout_s: float) -> EndOffsets:
        """See `PartitionLog.end_offsets`.

        Raises:
            KafkaException: The broker did not answer.
        """
        return end_offsets(self._settings, self._topic, self._partition, timeout_s)

    def batch_ids_since(self, start_offset: int, timeout_s: float) -> set[str]:
        """See `PartitionLog.batch_ids_since`.

        Raises:
            KafkaException: A consumer error, or the read did not reach the LSO within ``timeout_s``.
        """
        ids: set[str] = set()
        for msg in read_partition(self._settings, self._topic, self._partition, start_offset, timeout_s):
            headers = msg.headers() or []
            pairs = headers.items() if isinstance(headers, dict) else headers
            for key, value in pairs:
                if key == BATCH_ID_HEADER and isinstance(value, bytes):
                    ids.add(value.decode())
        return ids
