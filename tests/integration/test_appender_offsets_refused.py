"""The appender after the group coordinator refused a transaction's offsets (`settled.producers` step 6).

After a broker restart under CPU load the first ``send_offsets_to_transaction`` can be refused by a coordinator still
loading (``COORDINATOR_LOAD_IN_PROGRESS``, ``NOT_COORDINATOR``), and the next one on the same librdkafka 2.16 producer
was seen to block past its timeout until the process was killed (librdkafka#5456, #5511; scenario 20's test under two
CPU hogs: three of the six worker restarts). The appender therefore replaces its producer before the next checkpoint.
That refusal needs the coordinator still loading its state, so it is injected at step 4
(``appender.offsets_refused_by_coordinator``: a ``NOT_COORDINATOR`` abortable error); the stall itself is not
reproduced here. A membership refusal is produced for real — the offsets carry the group metadata of a member that has
left the group (``UNKNOWN_MEMBER_ID``, KIP-447) — and must NOT replace the producer: the partition may have a new
owner, whose producer a new ``init_transactions`` would fence (a review found that with the first version).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer

from settled import _failpoints
from settled._settings import Settings
from settled.producers import AppendBatch, OutRecord, ProducerFencedError, TransactionalAppender, consumer_config
from tests.integration.helpers import read_topic, wait_for

pytestmark = pytest.mark.integration


def _member(s: Settings) -> Consumer:
    """A member of the workers' group that holds partition 0 of the inbox."""
    c = Consumer(consumer_config(s, f"{s.namespace}.{s.app_id}.workers"))  # the group of `Worker.group_id`
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


def _appender(s: Settings, metadata: list[Any]) -> TransactionalAppender:
    return TransactionalAppender(
        settings=s,
        partition=0,
        input_topic=s.topic("inbox"),
        group_metadata=lambda: metadata[0],
        replace_poison=lambda run, _why: run,
    )


def _producers_made(caplog: pytest.LogCaptureFixture) -> int:
    return sum(r.getMessage() == "producer ready" for r in caplog.records)


def test_a_stale_coordinators_refusal_defers_the_batch_and_the_next_checkpoint_appends_it_on_a_new_producer(
    topics: Settings, members: tuple[Any, Consumer], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    s = topics
    _stale, current = members
    appender = _appender(s, [current.consumer_group_metadata()])
    caplog.set_level(logging.INFO, logger="settled.producers._appender")
    appender.open()
    _failpoints.configure("appender.offsets_refused_by_coordinator=1*raise", control_dir=tmp_path / "fp")
    try:
        first = _batch(s, 0)
        refused = appender.checkpoint([first], [0], 1)
        assert refused.committed == () and refused.deferred == (first,) and refused.aborts == 1, refused
        assert _producers_made(caplog) == 1  # replaced lazily: at the next checkpoint, after the caller's poll

        again = appender.checkpoint([first], [0], 1)
        assert again.committed == (first,) and again.deferred == () and again.input_offset == 1, again
        assert _producers_made(caplog) == 2, "the producer that saw the stale coordinator was not replaced"

        second = _batch(s, 1)
        normal = appender.checkpoint([second], [1], 2)
        assert normal.committed == (second,), normal
        assert _producers_made(caplog) == 2, "a checkpoint after a committed one replaced the producer"
    finally:
        _failpoints.reset()

    # Each batch is in the log once: the aborted attempt left nothing readable.
    log = [r.value for r in read_topic(s, "log") if r.key == b"conv-refused"]
    assert log == [b"batch 0", b"batch 1"]


def test_a_membership_refusal_keeps_the_producer_so_a_zombie_never_fences_the_new_owner(
    topics: Settings, members: tuple[Any, Consumer], caplog: pytest.LogCaptureFixture
) -> None:
    """A's member left the group (``UNKNOWN_MEMBER_ID``); B claims the partition (fencing A) and commits; A's worker,
    not yet told of its loss by a poll, checkpoints its deferred batch again: A must be fenced, B must go on."""
    s = topics
    stale, current = members
    caplog.set_level(logging.INFO, logger="settled.producers._appender")
    zombie = _appender(s, [stale])
    zombie.open()
    first = _batch(s, 0)
    refused = zombie.checkpoint([first], [0], 1)
    assert refused.committed == () and refused.deferred == (first,) and refused.aborts == 1, refused

    owner = _appender(s, [current.consumer_group_metadata()])
    owner.open()  # claim step 2: fences the zombie's producer
    assert owner.checkpoint([first], [0], 1).committed == (first,)

    with pytest.raises(ProducerFencedError):
        zombie.checkpoint([first], [0], 1)
    assert _producers_made(caplog) == 2, "the zombie made a new producer after a membership refusal"

    second = _batch(s, 1)
    assert owner.checkpoint([second], [1], 2).committed == (second,)
    log = [r.value for r in read_topic(s, "log") if r.key == b"conv-refused"]
    assert log == [b"batch 0", b"batch 1"]
