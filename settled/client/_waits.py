"""The shared settlements reader: one background consumer of ``settled.settlements`` serves every `Client.wait`.

Before it, each ``wait`` opened a consumer of its own, looked its start offset up and read the conversation's
partition from there (`settled.client._settlements.read_settlement`): several broker round trips and a consumer per
call. Now one assign-only ``read_committed`` consumer per client reads every partition from the first wait's start
on (and from an earlier start when a later wait asks for one), and hands each settlement to the waits registered for
it (issue 24 item 5).

How a wait cannot miss its settlement:

- Coverage: per partition, ``since_ms`` such that every record with a timestamp at or after it has been read by the
  thread, or will be (the partition was assigned, or sought back, at ``offsets_for_times(since_ms)``; the end offset
  is captured before that lookup, as `settled.client._settlements` does, so a record committed in between is not
  skipped).
- Recent settlements are kept in a cache bounded in bytes; evicting a record raises its partition's ``evicted_ms`` to
  the record's timestamp.
- A wait registers itself and checks the cache under one lock with the thread's hand-over. If its settlement is not
  cached and its ``since`` is covered and newer than ``evicted_ms``, the settlement has not been read yet: the thread
  hands it over when it reads it. Otherwise the wait asks the thread to (re)position the partition at its ``since``
  (records read again are handed over again; a wait takes the first).

Waits match on (conversation id, submission id): submission ids are unique per conversation only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from settled._settings import Settings
from settled.client._errors import BrokerUnavailableError, SettlementTimeoutError
from settled.client._settlements import TRANSIENT_CONSUMER_ERRORS as _TRANSIENT
from settled.producers import consume_promptly, partition_for_key, reader_config
from settled.schemas import Codec, DecodeError, SettlementRecord

__all__ = ["DEFAULT_CACHE_BYTES", "SettlementWaiter", "SettlementsReader"]

_log = logging.getLogger(__name__)

#: Bytes of recent settlement records kept for waits that register after their settlement was read.
DEFAULT_CACHE_BYTES = 32 * 1024 * 1024


_Key = tuple[str, str]  # (conversation id, submission id)


@dataclass
class _Coverage:
    since_ms: int  # every record of the partition at or after this timestamp has been, or will be, read
    evicted_ms: int = -1  # the newest timestamp evicted from the cache


@dataclass
class _Cached:
    record: SettlementRecord
    partition: int
    timestamp_ms: int
    size_bytes: int


class SettlementWaiter:
    """One wait's hand-over slot: the settlement, or the error that ended its partition's read.

    Attributes:
        key: (conversation id, submission id).
        partition: The settlements partition it is read from.
    """

    def __init__(
        self, key: _Key, partition: int, on_result: Callable[[SettlementRecord | Exception], None] | None
    ) -> None:
        self.key = key
        self.partition = partition
        self._cond = threading.Condition()
        self._result: SettlementRecord | Exception | None = None
        self._on_result = on_result

    def deliver(self, result: SettlementRecord | Exception) -> None:
        """Hand over the result; the first one wins (a record read again after a seek changes nothing).

        Args:
            result: The settlement, or the error that ended the read of its partition.
        """
        with self._cond:
            if self._result is not None:
                return
            self._result = result
            self._cond.notify_all()
        if self._on_result is not None:
            self._on_result(result)  # on the reader's thread: it must not block (an event loop's call_soon_threadsafe)

    def wait(self, timeout_s: float) -> SettlementRecord | Exception | None:
        """Block until the result, or ``timeout_s`` seconds; None when the time passed."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._result is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return self._result


class SettlementsReader:
    """The background reader of ``settled.settlements`` shared by every `Client.wait` of one client (module doc).

    Thread-safe: `wait` may be called from any number of threads.
    """

    def __init__(
        self,
        settings: Settings,
        codec: Codec,
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        poll_timeout_s: float = 0.05,
    ) -> None:
        """Build the reader; the first `wait` starts it.

        Args:
            settings: Namespace and bootstrap servers.
            codec: Decodes settlement records.
            cache_bytes: Bytes of recent settlement records kept (encoded size).
            poll_timeout_s: How long one poll waits, in seconds (bounds how late a new wait's seek starts, and how
                long `close` takes).

        Raises:
            ValueError: ``cache_bytes`` or ``poll_timeout_s`` is not positive.
        """
        if cache_bytes <= 0:
            raise ValueError(f"cache_bytes must be positive, got {cache_bytes}")
        if poll_timeout_s <= 0:
            raise ValueError(f"poll_timeout_s must be positive, got {poll_timeout_s}")
        self._settings = settings
        self._codec = codec
        self._cache_bytes = cache_bytes
        self._poll_timeout_s = poll_timeout_s
        self._topic = settings.topic("settlements")
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._waiters: dict[_Key, list[SettlementWaiter]] = {}
        self._cache: OrderedDict[_Key, _Cached] = OrderedDict()
        self._cached_bytes = 0
        self._coverage: dict[int, _Coverage] = {}
        self._seeks: dict[int, int] = {}  # partition → the earliest since_ms asked for, not yet applied
        self._stop = threading.Event()
        self._wake = threading.Event()  # a wait asked for a positioning while the thread had no partition to read
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        self._partition_count = 0
        self.seeks_applied = 0
        """Partitions (re)positioned so far (tests and the benchmark read it)."""

    def wait(self, conversation_id: str, submission_id: str, since: datetime, timeout_s: float) -> SettlementRecord:
        """Return a submission's settlement, read from ``since`` on at the latest.

        Args:
            conversation_id: The conversation (its partition is ``murmur2(conversation id)``, docs/design.md §2).
            submission_id: The admitted submission.
            since: A time (aware) before the settlement's record timestamp: the receipt's ``decided_at`` less a
                clock-skew margin.
            timeout_s: Bound on the wait, in seconds.

        Returns:
            The settlement.

        Raises:
            SettlementTimeoutError: None was read within ``timeout_s``.
            BrokerUnavailableError: The topic does not exist, or Kafka did not answer a position lookup.
            DecodeError: A record of the partition is not a settlement record (the owner writes only those).
        """
        deadline = time.monotonic() + timeout_s
        found = self.expect(conversation_id, submission_id, since, timeout_s)
        if isinstance(found, SettlementRecord):
            return found
        try:
            result = found.wait(max(deadline - time.monotonic(), 0.0))
        finally:
            self.forget(found)
        if result is None:
            raise SettlementTimeoutError(submission_id, conversation_id, self._topic, found.partition, timeout_s)
        if isinstance(result, Exception):
            raise result
        return result

    def expect(
        self,
        conversation_id: str,
        submission_id: str,
        since: datetime,
        timeout_s: float,
        on_result: Callable[[SettlementRecord | Exception], None] | None = None,
    ) -> SettlementRecord | SettlementWaiter:
        """Return the settlement if it was read already, else register a waiter for it (`forget` it when done).

        Args:
            conversation_id: The conversation.
            submission_id: The admitted submission.
            since: A time (aware) before the settlement's record timestamp (see `wait`).
            timeout_s: Bound on starting the reader (metadata), in seconds.
            on_result: Called once with the settlement or the error, on the reader's thread (must not block).

        Returns:
            The cached settlement, or the registered waiter.

        Raises:
            BrokerUnavailableError: The topic does not exist, or Kafka did not answer.
        """
        self._start(timeout_s)
        partition = partition_for_key(conversation_id.encode(), self._partition_count)
        key = (conversation_id, submission_id)
        since_ms = int(since.timestamp() * 1000)
        waiter = SettlementWaiter(key, partition, on_result)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                return cached.record
            self._waiters.setdefault(key, []).append(waiter)
            coverage = self._coverage.get(partition)
            if coverage is None or since_ms < coverage.since_ms or since_ms <= coverage.evicted_ms:
                asked = self._seeks.get(partition)
                self._seeks[partition] = since_ms if asked is None else min(asked, since_ms)
                self._wake.set()
        return waiter

    def forget(self, waiter: SettlementWaiter) -> None:
        """Unregister a waiter (done, timed out or cancelled).

        Args:
            waiter: A waiter from `expect`.
        """
        with self._lock:
            waiting = self._waiters.get(waiter.key, [])
            if waiter in waiting:
                waiting.remove(waiter)
            if not waiting:
                self._waiters.pop(waiter.key, None)

    @property
    def waiting(self) -> int:
        """Waits registered now (not yet handed their settlement and forgotten)."""
        with self._lock:
            return sum(len(ws) for ws in self._waiters.values())

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread and close the consumer.

        Args:
            timeout_s: Bound on joining the thread, in seconds.
        """
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    # -- the thread ----------------------------------------------------------------------------------------------

    def _start(self, timeout_s: float) -> None:
        with self._start_lock:
            if self._thread is not None:
                return
            if self._stop.is_set():
                raise BrokerUnavailableError("the settlements reader is closed")
            consumer = Consumer(reader_config(self._settings, f"{self._settings.namespace}.client-settlements"))
            try:
                meta = consumer.list_topics(self._topic, timeout=max(timeout_s, 0.1)).topics.get(self._topic)
            except KafkaException as exc:
                consumer.close()
                raise BrokerUnavailableError(f"could not read the metadata of {self._topic}: {exc.args[0]}") from exc
            if meta is None or meta.error is not None or not meta.partitions:
                consumer.close()
                raise BrokerUnavailableError(
                    f"topic {self._topic} does not exist or has no partitions: run `settled topics create`"
                )
            self._partition_count = len(meta.partitions)
            self._consumer = consumer
            self._thread = threading.Thread(target=self._run, name="settled-settlements-reader", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None  # _start sets it before the thread starts
        while not self._stop.is_set():
            with self._lock:
                seeks, self._seeks = self._seeks, {}
            for partition, since_ms in seeks.items():
                self._position(consumer, partition, since_ms)
            if not self._coverage:
                self._wake.wait(self._poll_timeout_s)
                self._wake.clear()
                continue
            for msg in consume_promptly(consumer, 500, self._poll_timeout_s):
                self._dispatch(msg)

    def _position(self, consumer: Consumer, partition: int, since_ms: int) -> None:
        """Position ``partition`` at the first record at or after ``since_ms``.

        The first positioning assigns every partition at once (at that time): adding a partition to a fetching
        consumer later (``incremental_assign``) was measured to stall that partition's first fetch by about 1.5 s,
        while a ``seek`` of an assigned partition takes effect at the next fetch.
        """
        coverage = self._coverage.get(partition)
        if coverage is not None and since_ms >= coverage.since_ms and since_ms > coverage.evicted_ms:
            return  # an earlier seek of this round covered it
        partitions = [partition] if self._coverage else list(range(self._partition_count))
        try:
            # Captured before the lookup: a record committed after the lookup is at or above it.
            ends = {
                p: consumer.get_watermark_offsets(TopicPartition(self._topic, p), timeout=10.0, cached=False)[1]
                for p in partitions
            }
            found = consumer.offsets_for_times([TopicPartition(self._topic, p, since_ms) for p in partitions], 10.0)
            for tp in found:
                if tp.error is not None:
                    raise KafkaException(tp.error)
        except KafkaException as exc:
            error = BrokerUnavailableError(f"could not find the start of {self._topic}[{partition}]: {exc.args[0]}")
            self._fail_partition(partition, error)  # as a wait's own lookup failing would have ended it
            return
        start = [
            TopicPartition(self._topic, tp.partition, tp.offset if tp.offset >= 0 else ends[tp.partition])
            for tp in found
        ]
        if coverage is None:
            consumer.assign(start)
        else:
            consumer.seek(start[0])
        with self._lock:
            if coverage is None:
                self._coverage = {tp.partition: _Coverage(since_ms) for tp in start}
            else:
                coverage.since_ms = min(coverage.since_ms, since_ms)
                coverage.evicted_ms = min(coverage.evicted_ms, since_ms - 1)
        self.seeks_applied += 1

    def _dispatch(self, msg: Message) -> None:
        err = msg.error()
        partition = msg.partition() or 0
        if err is not None:
            if err.code() in _TRANSIENT:
                _log.warning("settlements consumer error", extra={"error": str(err), "partition": partition})
                return
            _log.error("settlements consumer error", extra={"error": str(err), "partition": partition})
            self._fail_partition(partition, BrokerUnavailableError(f"reading {self._topic}[{partition}]: {err}"))
            return
        value = msg.value() or b""
        try:
            record = self._codec.decode(
                value, topic=self._topic, partition=partition, offset=msg.offset() or 0, expected=(SettlementRecord,)
            )
        except DecodeError as exc:
            _log.error("undecodable record on the settlements topic", extra={"error": str(exc)})
            self._fail_partition(partition, exc)
            return
        assert isinstance(record, SettlementRecord)  # expected= refuses any other type
        key = (record.conversation_id, record.submission_id)
        _, timestamp_ms = msg.timestamp()
        with self._lock:
            old = self._cache.pop(key, None)
            if old is not None:
                self._cached_bytes -= old.size_bytes
            self._cache[key] = _Cached(record, partition, timestamp_ms, len(value))
            self._cached_bytes += len(value)
            while self._cached_bytes > self._cache_bytes and len(self._cache) > 1:
                _, evicted = self._cache.popitem(last=False)
                self._cached_bytes -= evicted.size_bytes
                coverage = self._coverage.get(evicted.partition)
                if coverage is not None:
                    coverage.evicted_ms = max(coverage.evicted_ms, evicted.timestamp_ms)
            waiting = list(self._waiters.get(key, ()))
        for waiter in waiting:
            waiter.deliver(record)

    def _fail_partition(self, partition: int, error: Exception) -> None:
        with self._lock:
            waiting = [w for ws in self._waiters.values() for w in ws if w.partition == partition]
        for waiter in waiting:
            waiter.deliver(error)
