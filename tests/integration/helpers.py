"""Helpers for integration tests: proposals, raw inbox produce, read_committed reads of whole topics, projections."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg import sql
from psycopg.rows import dict_row

from settled._settings import Settings
from settled.producers import admin_config, partition_for_key, producer_config, read_partition, reader_config
from settled.projections import (
    CheckReport,
    ProjectionNames,
    Projector,
    ProjectorConfig,
    check,
    read_offsets,
    schema_exists,
)
from settled.schemas import Codec
from tests._promise import promise
from tests.harness.factories import proposal  # noqa: F401 - its old home, for modules not yet importing the harness

CODEC = Codec()


def produce_inbox(
    settings: Settings, items: list[tuple[bytes, bytes]], partition: int | None = None, **conf: Any
) -> None:
    """Produce raw (key, value) records to the inbox with settled's murmur2 partitioner (or an explicit partition)."""
    p = Producer(producer_config(settings, **conf))
    for key, value in items:
        if partition is None:
            p.produce(settings.topic("inbox"), key=key, value=value)
        else:
            p.produce(settings.topic("inbox"), key=key, value=value, partition=partition)
    assert p.flush(30) == 0


@dataclass(frozen=True)
class Rec:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def read_topic(settings: Settings, short: str, timeout_s: float = 30.0) -> list[Rec]:
    topic = settings.topic(short)
    md = AdminClient(admin_config(settings)).list_topics(topic, timeout=timeout_s)
    out: list[Rec] = []
    for p in sorted(md.topics[topic].partitions):
        for m in read_partition(settings, topic, p, 0, timeout_s):
            out.append(Rec(p, m.offset() or 0, m.key(), m.value(), list(m.headers() or [])))  # type: ignore[arg-type]
    return out


def conversations_on(partition: int, partitions: int, prefix: str, n: int = 1) -> list[str]:
    """The first ``n`` conversation ids ``<prefix>-<i>`` that settled's partitioner (`partition_for_key`) places on
    ``partition`` of ``partitions``.

    Raises:
        AssertionError: Fewer than ``n`` among the first 10,000 × ``n`` candidates.
    """
    found: list[str] = []
    for i in range(10_000 * n):
        cid = f"{prefix}-{i}"
        if partition_for_key(cid.encode(), partitions) == partition:
            found.append(cid)
            if len(found) == n:
                return found
    raise AssertionError(f"only {len(found)} of {n} conversation ids {prefix}-<i> found on partition {partition}")


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@contextmanager
def running(worker: Any) -> Iterator[threading.Thread]:
    """Run a Worker's loop in a thread for the duration of the block; stop and join it afterwards."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread below
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    try:
        yield t
    finally:
        worker.stop()
        t.join(60)
    if errors:
        raise errors[0]


# -- projections (issue 7): a live projector in a thread, waiting for it, `check`, reading its rows -----------------


@dataclass
class LiveProjector:
    """A `settled.projections.Projector` running in a thread of the test process (see `projecting`).

    Attributes:
        projector: The projector.
        thread: The thread running `Projector.run`.
        errors: What `Projector.run` raised, if it ended with an error.
    """

    projector: Projector
    thread: threading.Thread
    errors: list[BaseException]

    def alive(self) -> bool:
        """Whether the projector still runs (it has not ended with an error)."""
        return self.thread.is_alive() and not self.errors


@contextmanager
def projecting(settings: Settings, names: ProjectionNames, *, max_records: int = 1000) -> Iterator[LiveProjector]:
    """Run a live projector of ``settings``' log into ``names.live`` for the duration of the block.

    Args:
        settings: Namespace, Kafka and Postgres.
        names: The projection's schema names.
        max_records: Records per poll (a chunk per partition is at most this many).

    Yields:
        The running projector; its error, if it ended with one, is raised when the block exits.
    """
    projector = Projector(settings, ProjectorConfig(names=names, max_records=max_records))
    errors: list[BaseException] = []

    def target() -> None:
        try:
            projector.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread below
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True, name="live-projector")
    thread.start()
    live = LiveProjector(projector, thread, errors)
    try:
        yield live
    finally:
        projector.stop()
        thread.join(60)
    if errors:
        raise errors[0]


@contextmanager
def fresh_projection(dsn: str) -> Iterator[ProjectionNames]:
    """A projection name of its own; its live, building, retired and scratch schemas are dropped afterwards.

    Args:
        dsn: The PostgreSQL holding the projection.

    Yields:
        The names (base ``p_<random>``).
    """
    names = ProjectionNames(f"p_{uuid.uuid4().hex[:12]}")
    try:
        yield names
    finally:
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                for schema in (names.live, names.building, names.retired, names.scratch):
                    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        except psycopg.OperationalError:
            pass  # a private server already destroyed: nothing to drop


def committed_log_ends(settings: Settings, timeout_s: float = 30.0) -> dict[int, int]:
    """Per log partition, the offset after its last committed record: what a caught-up projector has stored.

    The read_committed end offset (LSO) is not it: transaction markers and aborted records sit between the last
    committed record and the LSO. Each partition's tail is read backwards in growing windows until a record is found.

    Args:
        settings: Namespace and bootstrap servers.
        timeout_s: Bound on the whole read, in seconds.

    Returns:
        Partition → last committed record's offset + 1 (0 for a partition without one).

    Raises:
        AssertionError: The log could not be read within ``timeout_s``.
    """
    topic = settings.topic("log")
    deadline = time.monotonic() + timeout_s
    consumer = Consumer(reader_config(settings, f"{settings.namespace}.test-log-ends"))
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        out: dict[int, int] = {}
        for p in sorted(meta.partitions):
            tp = TopicPartition(topic, p)
            lso = int(consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)[1])
            low, window, last = lso, 16, -1
            while last < 0 and low > 0:
                low = max(0, low - window)
                window *= 4
                consumer.assign([TopicPartition(topic, p, low)])
                position = low
                while position < lso:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"reading {topic}[{p}] up to {lso} took more than {timeout_s} s")
                    msg = consumer.poll(0.2)
                    if msg is None:
                        position = int(consumer.position([tp])[0].offset)
                        continue
                    assert msg.error() is None, f"{topic}[{p}]: {msg.error()}"
                    offset = int(msg.offset() or 0)
                    if offset >= lso:
                        break
                    last = max(last, offset)
                    position = offset + 1
                consumer.unassign()
            out[p] = last + 1
        return out
    finally:
        consumer.close()


def projected_offsets(settings: Settings, names: ProjectionNames) -> dict[int, int]:
    """The live projection's stored next offset per log partition (empty before its first chunk)."""
    with psycopg.connect(settings.postgres_dsn, autocommit=True, connect_timeout=10) as conn:
        if not schema_exists(conn, names.live):
            return {}
        return read_offsets(conn, names.live, settings.topic("log"))


def wait_projected(
    settings: Settings, names: ProjectionNames, timeout_s: float, live: LiveProjector | None = None
) -> dict[int, int]:
    """Wait until the live projection holds every committed log record there is now.

    Args:
        settings: Namespace, Kafka and Postgres.
        names: The projection's schema names.
        timeout_s: How long to wait, in seconds.
        live: The in-process projector, if any: its death fails the wait at once.

    Returns:
        The stored offsets reached.

    Raises:
        AssertionError: Not caught up within ``timeout_s``, or the projector died.
    """
    ends = committed_log_ends(settings)
    deadline = time.monotonic() + timeout_s
    have: dict[int, int] = {}
    while time.monotonic() < deadline:
        if live is not None and not live.alive():
            raise AssertionError(f"the live projector died: {live.errors!r}")
        try:
            have = projected_offsets(settings, names)
        except psycopg.OperationalError:
            have = {}
        if all(have.get(p, 0) >= end for p, end in ends.items()):
            return have
        time.sleep(0.2)
    raise AssertionError(f"the projection did not catch up with the log within {timeout_s} s: {have} < {ends}")


def check_clean(settings: Settings, names: ProjectionNames, promise_id: str, timeout_s: float = 60.0) -> CheckReport:
    """Run `settled.projections.check` (live vs a fresh rebuild vs the reference fold) and demand no difference.

    Args:
        settings: Namespace, Kafka and Postgres.
        names: The projection's schema names.
        promise_id: The promise a difference breaks (e.g. ``"DUR-015.rebuild"``).
        timeout_s: Bound on the check, in seconds.

    Returns:
        The clean report.
    """
    report = check(settings, names, timeout_s=timeout_s)
    shown = "\n".join(f"  {d}" for d in report.differences[:15])
    promise(promise_id, report.ok, f"live, rebuild and reference fold differ at {report.offsets}:\n{shown}")
    return report


def projection_rows(settings: Settings, names: ProjectionNames, table: str) -> list[dict[str, Any]]:
    """Every row of one live projection table (or view), as dicts.

    Args:
        settings: The Postgres DSN.
        names: The projection's schema names.
        table: The table or view, e.g. ``"settlements"``.

    Returns:
        The rows, column name → value.
    """
    with psycopg.connect(settings.postgres_dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(names.live, table))).fetchall()
