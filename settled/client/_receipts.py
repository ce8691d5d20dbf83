"""The shared receipts reader: one background consumer of ``settled.receipts`` per client (docs/design.md §4).

An assign-only ``read_committed`` consumer over every partition of the receipts topic, started at the end offsets
captured when it starts — before the client produces anything it waits for — so no receipt of a later request can be
missed. Its thread decodes each receipt and hands it to the waiter registered for its request id; a receipt nobody
waits for (a late answer to a request that timed out, or another client's) is dropped.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from settled._settings import Settings
from settled.client._errors import BrokerUnavailableError
from settled.producers import consume_promptly, reader_config
from settled.schemas import Codec, DecodeError, Receipt

__all__ = ["ReceiptWaiter", "ReceiptsReader"]

_log = logging.getLogger(__name__)

#: Consumer errors that say nothing about a record (the broker is away or a partition has no leader for a moment).
_TRANSIENT = frozenset(
    {
        KafkaError._PARTITION_EOF,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)


class ReceiptWaiter:
    """One request's wait for its receipt, or for a failed delivery of its record.

    Attributes:
        request_id: The submission or command id.
    """

    def __init__(self, request_id: str) -> None:
        """Build a waiter.

        Args:
            request_id: The submission or command id.
        """
        self.request_id = request_id
        self._cond = threading.Condition()
        self._receipt: Receipt | None = None
        self._delivery_errors: list[KafkaError] = []

    def deliver_receipt(self, receipt: Receipt) -> None:
        """Hand over the receipt (the first one wins; a repeat is ignored).

        Args:
            receipt: The receipt read for ``request_id``.
        """
        with self._cond:
            if self._receipt is None:
                self._receipt = receipt
            self._cond.notify_all()

    def delivery_failed(self, error: KafkaError) -> None:
        """Record that producing the request's record failed (called from the producer's delivery report).

        Args:
            error: The delivery error.
        """
        with self._cond:
            self._delivery_errors.append(error)
            self._cond.notify_all()

    def wait(self, timeout_s: float) -> Receipt | KafkaError | None:
        """Wait for the receipt or a delivery failure.

        Args:
            timeout_s: The most to wait, in seconds.

        Returns:
            The receipt (it wins over a delivery error that came with it), else the oldest delivery error not yet
            returned, else ``None`` when ``timeout_s`` passed.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._receipt is None and not self._delivery_errors:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if self._receipt is not None:
                return self._receipt
            return self._delivery_errors.pop(0)


class ReceiptsReader:
    """The background reader of ``settled.receipts`` shared by every request of one client (docs/design.md §4).

    Thread-safe: `expect` and `forget` may be called from any thread.
    """

    def __init__(self, settings: Settings, codec: Codec, poll_timeout_s: float = 0.1) -> None:
        """Build the reader; `start` starts it.

        Args:
            settings: Namespace and bootstrap servers.
            codec: Decodes receipts.
            poll_timeout_s: How long one poll waits, in seconds (bounds how long `close` takes).
        """
        self._settings = settings
        self._codec = codec
        self._poll_timeout_s = poll_timeout_s
        self._topic = settings.topic("receipts")
        self._lock = threading.Lock()
        self._waiters: dict[str, ReceiptWaiter] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        self.start_offsets: dict[int, int] = {}
        self.dropped = 0

    @property
    def started(self) -> bool:
        """Whether the reader thread runs."""
        return self._thread is not None

    def start(self, timeout_s: float) -> None:
        """Capture every partition's end offset and start reading there, in a background thread.

        Call it before producing the first request whose receipt is awaited: the captured end offsets are below any
        receipt that answers a later request.

        Args:
            timeout_s: Bound on the metadata and offset queries, in seconds.

        Raises:
            BrokerUnavailableError: The topic does not exist or Kafka did not answer in time; nothing was produced.
        """
        if self._thread is not None:
            return
        consumer = Consumer(reader_config(self._settings, f"{self._settings.namespace}.client-receipts"))
        try:
            deadline = time.monotonic() + timeout_s
            metadata = consumer.list_topics(self._topic, timeout=max(timeout_s, 0.1))
            meta = metadata.topics.get(self._topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise BrokerUnavailableError(
                    f"topic {self._topic} does not exist or has no partitions ({meta.error if meta else 'missing'}): "
                    "run `settled topics create`; nothing was produced"
                )
            assignment = []
            for p in sorted(meta.partitions):
                remaining = max(deadline - time.monotonic(), 0.1)
                # For a read_committed consumer the "high" offset is the last stable offset: a transaction still open
                # now cannot hold the receipt of a record produced after this call.
                end = consumer.get_watermark_offsets(TopicPartition(self._topic, p), timeout=remaining, cached=False)[1]
                assignment.append(TopicPartition(self._topic, p, end))
            consumer.assign(assignment)
        except KafkaException as exc:
            consumer.close()
            raise BrokerUnavailableError(
                f"could not start the receipts reader on {self._topic}: {exc.args[0]}; nothing was produced"
            ) from exc
        except BaseException:
            consumer.close()
            raise
        self.start_offsets = {tp.partition: tp.offset for tp in assignment}
        self._consumer = consumer
        self._thread = threading.Thread(target=self._run, name="settled-receipts-reader", daemon=True)
        self._thread.start()

    def expect(self, request_id: str) -> ReceiptWaiter:
        """Register a waiter for a request's receipt (before producing the request).

        Args:
            request_id: The submission or command id.

        Returns:
            The waiter.

        Raises:
            ValueError: If a waiter for ``request_id`` is already registered.
        """
        waiter = ReceiptWaiter(request_id)
        with self._lock:
            if request_id in self._waiters:
                raise ValueError(f"request_id {request_id!r} is already awaited")
            self._waiters[request_id] = waiter
        return waiter

    def forget(self, waiter: ReceiptWaiter) -> None:
        """Unregister a waiter; a later receipt for its request is dropped.

        Args:
            waiter: A waiter from `expect`.
        """
        with self._lock:
            if self._waiters.get(waiter.request_id) is waiter:
                del self._waiters[waiter.request_id]

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread and close the consumer.

        Args:
            timeout_s: Bound on joining the thread, in seconds.
        """
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None  # start() sets it before the thread starts
        while not self._stop.is_set():
            for msg in consume_promptly(consumer, 500, self._poll_timeout_s):
                self._dispatch(msg)

    def _dispatch(self, msg: Message) -> None:
        err = msg.error()
        if err is not None:
            level = logging.WARNING if err.code() in _TRANSIENT else logging.ERROR
            _log.log(level, "receipts consumer error", extra={"error": str(err), "partition": msg.partition()})
            return
        partition, offset = msg.partition(), msg.offset()
        try:
            receipt = self._codec.decode(
                msg.value(), topic=self._topic, partition=partition or 0, offset=offset or 0, expected=(Receipt,)
            )
        except DecodeError as exc:
            # Not a receipt any request of this client can be waiting for: it is logged with its offset and skipped
            # (the owner writes only receipts here; a foreign record is an operator's matter, not a request's).
            _log.error("undecodable record on the receipts topic skipped", extra={"error": str(exc)})
            return
        assert isinstance(receipt, Receipt)  # expected=(Receipt,) refuses any other type
        with self._lock:
            waiter = self._waiters.get(receipt.request_id)
        if waiter is None:
            self.dropped += 1
            return
        waiter.deliver_receipt(receipt)
