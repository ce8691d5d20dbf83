"""Helpers for tests that run real ``settled worker`` child processes and follow settled's topics as they grow.

Used by the fencing, abort and handover tests (issue 5). A child worker is a `settled.testing.WorkerProcess` running
the echo app with, optionally, a failpoint control folder.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from settled import _failpoints
from settled._settings import Settings
from settled.producers import admin_config, producer_config, reader_config
from settled.schemas import InboxRecord, LogBatch
from settled.testing import WorkerProcess
from tests.harness.factories import abort_command  # noqa: F401 - its old home, for modules not yet importing the harness
from tests.harness.workers import start_worker
from tests.integration.helpers import CODEC, produce_inbox

#: A ``settled worker`` child (`settled.testing.WorkerProcess`); the name the fencing/abort/handover tests use.
ChildWorker = WorkerProcess


def spawn_worker(
    s: Settings,
    log_dir: Path,
    name: str,
    *,
    control: _failpoints.FailpointControl | None = None,
    failpoints: str = "",
    log_level: str = "INFO",
) -> WorkerProcess:
    """Start a ``settled worker`` child on ``s``'s namespace with the echo app (`settled.testing.WorkerProcess`).

    Args:
        s: The test's settings (namespace and bootstrap servers are passed on).
        log_dir: Folder for the child's log file ``<name>.log``.
        name: The worker id (``--worker-id``), recorded in its ``OwnershipClaimed``.
        control: A failpoint control folder to connect the child to (hit log, barriers, run-time arming).
        failpoints: Spawn-time failpoint entries (``SETTLED_FAILPOINTS``).
        log_level: The child's log level.

    Returns:
        The running child.
    """
    return start_worker(
        s,
        log_dir / f"{name}.log",
        name=name,
        log_level=log_level,
        control=control,
        failpoints=failpoints,
        append_log=False,
    )


@dataclass
class Tail:
    """Follows one settled topic from offset 0 with a read_committed consumer, keeping every record it has read.

    ``records`` holds ``(partition, offset, decoded)``: a `LogBatch` for the log, the record model otherwise.
    """

    settings: Settings
    short: str
    records: list[tuple[int, int, Any]] = field(default_factory=list)
    _consumer: Consumer | None = None

    def __post_init__(self) -> None:
        topic = self.settings.topic(self.short)
        md = AdminClient(admin_config(self.settings)).list_topics(topic, timeout=30)
        self._consumer = Consumer(reader_config(self.settings, f"tail-{uuid.uuid4().hex[:8]}"))
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in md.topics[topic].partitions])

    def poll(self, timeout_s: float = 0.05) -> int:
        """Read what is available now (waiting at most ``timeout_s`` for the first record); return how many."""
        assert self._consumer is not None
        got = 0
        for msg in self._consumer.consume(1000, timeout_s):
            err = msg.error()
            assert err is None, f"{self.short}: {err}"
            offset, partition = msg.offset() or 0, msg.partition() or 0
            value = msg.value()
            assert isinstance(value, bytes)
            decoded: Any
            if self.short == "log":
                decoded = CODEC.decode_batch(value, offset=offset).batch
            else:
                decoded = CODEC.decode(value)
            self.records.append((partition, offset, decoded))
            got += 1
        return got

    def catch_up(self, timeout_s: float = 30.0) -> None:
        """Read up to the end offsets (the LSO, read_committed) every partition has now.

        Raises:
            AssertionError: Not reached within ``timeout_s``.
        """
        assert self._consumer is not None
        assignment = self._consumer.assignment()
        ends = [self._consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in assignment]
        deadline = time.monotonic() + timeout_s
        while True:
            positions = [tp.offset for tp in self._consumer.position(assignment)]
            if all(end == 0 or pos >= end for pos, end in zip(positions, ends, strict=True)):
                return
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self.short}: positions {positions} short of {ends} after {timeout_s} s")
            self.poll(0.1)

    def values(self) -> list[Any]:
        """The decoded records read so far, in read order."""
        return [r for _, _, r in self.records]

    def wait(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll until ``predicate()`` holds.

        Raises:
            AssertionError: It did not within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
            self.poll(0.05)

    def close(self) -> None:
        """Close the consumer."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def batches(tail: Tail) -> list[tuple[int, int, LogBatch]]:
    """The log batches a log `Tail` has read: ``(partition, offset, batch)``."""
    return [(p, o, b) for p, o, b in tail.records if isinstance(b, LogBatch)]


class Inbox:
    """A long-lived idempotent producer to the inbox (settled's murmur2 partitioner), for tests that send often."""

    def __init__(self, s: Settings) -> None:
        self.settings = s
        self._producer = Producer(producer_config(s))

    def send(self, *records: InboxRecord) -> None:
        """Produce ``records`` keyed by their conversation id and wait until the broker has them."""
        for r in records:
            self._producer.produce(self.settings.topic("inbox"), key=r.conversation_id.encode(), value=CODEC.encode(r))
        assert self._producer.flush(30) == 0


def send(s: Settings, *records: InboxRecord) -> None:
    """Produce inbox records keyed by their conversation id with a one-off producer."""
    produce_inbox(s, [(r.conversation_id.encode(), CODEC.encode(r)) for r in records])
