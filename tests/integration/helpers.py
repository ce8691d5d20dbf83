"""Helpers for integration tests: proposals, raw inbox produce, and read_committed reads of whole topics."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from settled._settings import Settings
from settled.producers import producer_config, read_partition
from settled.schemas import Codec, SubmissionPayload, SubmissionProposed, canonical_json, payload_digest

CODEC = Codec()


def proposal(
    conversation: str, key: str | None = None, value: Any = "hello", tools: tuple[str, ...] = ()
) -> SubmissionProposed:
    payload = SubmissionPayload(input_json=canonical_json(value), tools_offered=tools)
    return SubmissionProposed(
        submission_id=str(uuid.uuid4()),
        principal="tester",
        conversation_id=conversation,
        idempotency_key=key or str(uuid.uuid4()),
        payload=payload,
        payload_digest=payload_digest(payload),
        proposed_at=datetime.now(UTC),
    )


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
    md = AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).list_topics(topic, timeout=timeout_s)
    out: list[Rec] = []
    for p in sorted(md.topics[topic].partitions):
        for m in read_partition(settings, topic, p, 0, timeout_s):
            out.append(Rec(p, m.offset() or 0, m.key(), m.value(), list(m.headers() or [])))  # type: ignore[arg-type]
    return out


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
