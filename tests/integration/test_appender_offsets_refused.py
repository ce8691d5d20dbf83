"""The appender after the group coordinator refused a transaction's offsets (`settled.producers` step 6).

After a broker restart under CPU load the first ``send_offsets_to_transaction`` can be refused
(``COORDINATOR_LOAD_IN_PROGRESS``, ``NOT_COORDINATOR``, ``UNKNOWN_MEMBER_ID``), and the next one on the same librdkafka
2.16 producer was seen to block past its timeout until the process was killed (librdkafka#5456, #5511; scenario 20's
test under two CPU hogs: three of the six worker restarts). The appender therefore replaces its producer before the
next checkpoint. A refusal is produced here for real: the offsets carry the group metadata of a member that has left
the group (``UNKNOWN_MEMBER_ID``, KIP-447). The stall itself needs a broker restart under load and is not reproduced
here: this test checks the replacement.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import Consumer

from settled._settings import Settings
from settled.producers import AppendBatch, OutRecord, TransactionalAppender, provision_topics
from tests.integration.helpers import CODEC, read_topic, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def topics(settings: Settings) -> Settings:
    s = settings.model_copy(update={"partitions": 1})
    provision_topics(s, CODEC, datetime.now(UTC))
    return s


def _member(s: Settings) -> Consumer:
    """A member of the workers' group that holds partition 0 of the inbox."""
    c = Consumer(
        {
            "bootstrap.servers": s.kafka_bootstrap,
            "group.id": f"{s.namespace}.{s.app_id}.workers",
            "session.timeout.ms": s.session_timeout_ms,
            "heartbeat.interval.ms": s.heartbeat_interval_ms,
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.commit": False,
        }
    )
    assigned: list[int] = []
    c.subscribe([s.topic("inbox")], on_assign=lambda _c, tps: assigned.extend(tp.partition for tp in tps))
    wait_for(lambda: bool(c.poll(0.1)) or assigned == [0], 30, "the member to be assigned partition 0")
    return c


@pytest.fixture
def members(topics: Settings) -> Iterator[tuple[Any, Consumer]]:
    """The metadata of a member that has left the group, and a current member."""
    gone = _member(topics)
    stale = gone.consumer_group_metadata()
    gone.close()
    current = _member(topics)
    yield stale, current
    current.close()


def _batch(s: Settings, n: int) -> AppendBatch:
    record = OutRecord(s.topic("log"), b"conv-refused", f"batch {n}".encode())
    return AppendBatch(
        batch_id=f"conv-refused:{n}", conversation_id="conv-refused", log_record=record, inputs=frozenset({n})
    )


def test_refused_offsets_defer_the_batches_and_the_next_checkpoint_appends_them_on_a_new_producer(
    topics: Settings, members: tuple[Any, Consumer], caplog: pytest.LogCaptureFixture
) -> None:
    s = topics
    stale, current = members
    metadata = [stale]
    appender = TransactionalAppender(
        settings=s,
        partition=0,
        input_topic=s.topic("inbox"),
        group_metadata=lambda: metadata[0],
        replace_poison=lambda run, _why: run,
    )
    caplog.set_level(logging.INFO, logger="settled.producers._appender")

    def producers_made() -> int:
        return sum(r.getMessage() == "producer ready" for r in caplog.records)

    appender.open()
    first = _batch(s, 0)
    refused = appender.checkpoint([first], [0], 1)
    assert refused.committed == () and refused.deferred == (first,) and refused.aborts == 1, refused
    assert producers_made() == 1  # replaced lazily: at the next checkpoint, after the caller's poll

    metadata[0] = current.consumer_group_metadata()
    again = appender.checkpoint([first], [0], 1)
    assert again.committed == (first,) and again.deferred == () and again.input_offset == 1, again
    assert producers_made() == 2, "the producer that saw the refusal was not replaced"

    second = _batch(s, 1)
    normal = appender.checkpoint([second], [1], 2)
    assert normal.committed == (second,), normal
    assert producers_made() == 2, "a checkpoint after a committed one replaced the producer"

    # Each batch is in the log once: the aborted attempt left nothing readable.
    log = [r.value for r in read_topic(s, "log") if r.key == b"conv-refused"]
    assert log == [b"batch 0", b"batch 1"]
