"""The shared inbox producer: one idempotent producer per client, replaced after a fatal error (docs/design.md §2, §4).

``settled.inbox`` is not authoritative (the owner decides what it admits), so the producer is idempotent — no
duplicates or reordering from its own retries, murmur2 placement by conversation id — but not transactional. A
background thread serves its delivery reports. A fatal error (librdkafka stops an idempotent producer when it cannot
keep its guarantees, e.g. after some broker outages, scenario 20) replaces the producer with a new one; the records the
old one still held fail with delivery errors and their requests produce them again on the new one, which is safe: a
repeated proposal is answered as a duplicate of the original (docs/design.md §4).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from settled._settings import Settings
from settled.client._errors import BrokerUnavailableError
from settled.producers import producer_config

__all__ = ["INBOX_LINGER_MS", "DeliveryCallback", "InboxProducer"]

_log = logging.getLogger(__name__)

DeliveryCallback = Callable[[KafkaError | None, Message], None]
"""Called from the producer's thread with the delivery result of one record."""

#: The inbox producer's ``linger.ms``: 0, sent at once. Every record it produces has a caller blocked on its receipt
#: (``submit()``, a command), so a linger only delays the turn: measured 1.1 ms of a K=0 turn at ``linger.ms`` 1, the
#: settings' default for settled's other producers (docs/architecture.md "K=0 turn latency"). Records produced while a
#: request is in flight still share the next request (librdkafka batches what waits in its queue), so many submits
#: at once still batch. An override (``producer_overrides``) wins.
INBOX_LINGER_MS = 0


def _log_error(error: KafkaError) -> None:
    # librdkafka's non-fatal client errors (e.g. all brokers down): it retries by itself; fatal ones are raised by
    # poll() and handled in `InboxProducer._serve`.
    _log.warning("inbox producer: %s", error.str(), extra={"error": str(error)})


def _is_fatal(error: KafkaError) -> bool:
    return bool(error.fatal()) or error.code() == KafkaError._FATAL


def _kafka_error_of(exc: KafkaException | SystemError) -> KafkaError | None:
    """The `KafkaError` a poll raised, or ``None`` when ``exc`` is not librdkafka's.

    confluent-kafka still runs delivery callbacks after a fatal error has set its exception, so ``poll`` then raises a
    `SystemError` chained to the fatal `KafkaException` (the same pattern the appender handles; closing.md).
    """
    if isinstance(exc, KafkaException):
        error = exc.args[0]
        return error if isinstance(error, KafkaError) else None
    cause = exc.__cause__
    if isinstance(cause, KafkaException) and isinstance(cause.args[0], KafkaError):
        return cause.args[0]
    return None


class InboxProducer:
    """The client's idempotent producer of inbox records; thread-safe.

    Attributes:
        replacements: How many times a fatal error replaced the producer.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        delivery_timeout_s: float,
        overrides: Mapping[str, Any] | None = None,
        poll_timeout_s: float = 0.05,
    ) -> None:
        """Build it; the librdkafka producer is created on the first `send`.

        Args:
            settings: Bootstrap servers and producer tuning (`settled.producers.producer_config`), but for
                ``linger.ms``, which is `INBOX_LINGER_MS`.
            delivery_timeout_s: librdkafka's ``message.timeout.ms``, in seconds: how long a record may wait for the
                broker before its delivery fails (it may land later than ``submit()``'s deadline; that is safe).
            overrides: Further librdkafka properties, applied last.
            poll_timeout_s: How long one poll of the delivery-report thread waits, in seconds.
        """
        self._conf = producer_config(
            settings,
            **{
                "linger.ms": INBOX_LINGER_MS,
                "message.timeout.ms": int(delivery_timeout_s * 1000),
                "error_cb": _log_error,
                **dict(overrides or {}),
            },
        )
        if self._conf.get("transactional.id"):
            raise ValueError("overrides: the inbox producer is idempotent, not transactional (transactional.id set)")
        if self._conf.get("enable.idempotence") is not True:
            raise ValueError("overrides: enable.idempotence must stay true for the inbox producer (docs/design.md §2)")
        self._poll_timeout_s = poll_timeout_s
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.replacements = 0

    def send(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        on_delivery: DeliveryCallback,
        deadline: float,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> None:
        """Queue one record (placed by murmur2 on ``key``); its delivery result goes to ``on_delivery``.

        Args:
            topic: The inbox topic.
            key: The conversation id, UTF-8.
            value: The encoded record.
            on_delivery: Delivery report callback (runs on the producer's thread).
            deadline: ``time.monotonic()`` value after which a full local queue is given up.
            headers: Record headers (the HTTP API's signature, issue 20), or None.

        Raises:
            BrokerUnavailableError: The local queue stayed full, or the producer kept failing fatally, until
                ``deadline``; the record was not queued.
            KafkaException: A non-fatal error that refuses the record at once (e.g. it is larger than
                ``message.max.bytes``); the record was not queued.
        """
        while True:
            producer = self._current()
            try:
                producer.produce(topic, key=key, value=value, on_delivery=on_delivery, headers=headers)
                return
            except BufferError as exc:
                if time.monotonic() >= deadline:
                    raise BrokerUnavailableError(
                        "the inbox producer's local queue stayed full until the deadline; nothing was sent"
                    ) from exc
                time.sleep(0.01)
            except KafkaException as exc:
                if not _is_fatal(exc.args[0]):
                    raise
                if time.monotonic() >= deadline:
                    raise BrokerUnavailableError(
                        f"the inbox producer failed fatally until the deadline ({exc.args[0]}); nothing was sent"
                    ) from exc
                self._replace(producer, exc.args[0])

    def close(self, timeout_s: float = 10.0) -> int:
        """Deliver what is queued within ``timeout_s``, then stop.

        Args:
            timeout_s: Bound on the final flush, in seconds.

        Returns:
            How many records were still undelivered (their outcome stays unknown to this process).
        """
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is None:
            return 0
        try:
            left = producer.flush(timeout_s)
        except KafkaException as exc:  # a fatal error surfacing at the last flush: report what is left
            _log.error("inbox producer failed while closing", extra={"error": str(exc.args[0])})
            left = len(producer)
        return int(left)

    def _current(self) -> Producer:
        with self._lock:
            if self._producer is None:
                self._producer = Producer(self._conf)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._serve, name="settled-inbox-producer", daemon=True)
                    self._thread.start()
            return self._producer

    def _replace(self, failed: Producer, error: KafkaError) -> None:
        """Swap ``failed`` for a new producer (once, whoever sees the error first) and drain the old one."""
        with self._lock:
            if self._producer is not failed:
                return  # another thread replaced it already
            self._producer = Producer(self._conf)
            self.replacements += 1
        _log.error(
            "fatal inbox producer error: producer replaced (scenario 20)",
            extra={"error": str(error), "replacements": self.replacements},
        )
        # The old producer's queued and in-flight records fail with delivery errors; their requests produce them
        # again on the new producer. Serve those reports now, then let the old producer go.
        try:
            failed.purge()
        except KafkaException as exc:
            _log.warning("purging the failed inbox producer", extra={"error": str(exc.args[0])})
        for _ in range(20):
            try:
                failed.poll(0.05)
            except (KafkaException, SystemError) as exc:
                if _kafka_error_of(exc) is None:
                    raise
                _log.debug("failed inbox producer still reporting", extra={"error": str(_kafka_error_of(exc))})
            if len(failed) == 0:
                break

    def _serve(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                producer = self._producer
            if producer is None:
                time.sleep(self._poll_timeout_s)
                continue
            try:
                producer.poll(self._poll_timeout_s)
            except (KafkaException, SystemError) as exc:
                error = _kafka_error_of(exc)
                if error is None:
                    raise
                if _is_fatal(error):
                    self._replace(producer, error)
                else:
                    _log.warning("inbox producer error", extra={"error": str(error)})
