"""A fenced static member tells a live twin from its own lost join, on the real group coordinator (issue 24 item 4).

The coordinator fences a static member (``FENCED_INSTANCE_ID``) when another join took its ``group.instance.id``.
That join is a twin's when a live member still holds the id a session timeout later (exit 78: do not restart), and a
lost join of the worker's own after a broker restart otherwise (it expires: exit 75, restart). Here a real consumer
holds the id, once live and once closed (a static member sends no LeaveGroup, so the coordinator keeps its join until
the session timeout, as it keeps a lost one). The coordinator keeps the first join's ``client.id`` across
replacements, so the worker tells them apart by liveness, not by name. (Two real workers end to end, the older exiting
78: ``tests/integration/engine/test_engine_restart.py``.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from settled._settings import Settings
from settled.processors import InstanceFencedError, StaticMembershipLostError, Worker
from settled.producers import admin_config, consumer_config
from tests.conftest import TopicFactory

pytestmark = pytest.mark.integration

FENCED = "Fatal error: Broker: Static consumer fenced by other consumer with same group.instance.id"


def _never(_partition: int) -> object:
    raise AssertionError("the worker's loop does not run here")


@contextmanager
def _member(settings: Settings, group: str, topic: str, instance_id: str) -> Iterator[Consumer]:
    """A static member of ``group`` holding ``instance_id``, closed (without leaving) when the block ends."""
    consumer = Consumer(consumer_config(settings, group, **{"group.instance.id": instance_id}))
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while not consumer.assignment():
        consumer.poll(0.1)  # polls drive the join; it ends when the coordinator assigned the partition
        assert time.monotonic() < deadline, f"no partition of {topic} within 30 s"
    try:
        yield consumer
    finally:
        consumer.close()


def test_a_live_holder_of_the_instance_id_is_a_twin_and_an_expired_one_a_lost_membership(
    settings: Settings, make_topic: TopicFactory
) -> None:
    topic = make_topic("inbox")
    s = settings.model_copy(update={"worker_instance_id": "slot-7"})
    worker = Worker(s, _never)  # type: ignore[arg-type]
    session_s = s.session_timeout_ms / 1000

    with _member(s, worker.group_id, topic, "slot-7") as twin:
        holders = worker._instance_holders(AdminClient(admin_config(s)), "slot-7")
        assert holders is not None and len(holders) == 1, holders
        t0 = time.monotonic()
        judged = worker._judge_fence(FENCED)
        waited_s = time.monotonic() - t0
        assert twin.assignment(), "the twin kept its partition while the worker waited"
    assert isinstance(judged, InstanceFencedError), judged
    assert f"member {holders[0].member_id} " in str(judged), judged
    assert waited_s >= 1.5 * session_s, f"judged a twin after {waited_s:.1f} s, before the session timeout"

    # The member just closed (no LeaveGroup): the coordinator holds the id until its session ends, as it would hold
    # a join of the worker's own that a broker restart lost. The worker waits for it to expire.
    t0 = time.monotonic()
    lost = worker._judge_fence(FENCED)
    waited_s = time.monotonic() - t0
    assert isinstance(lost, StaticMembershipLostError), lost
    assert "has no member with it a session timeout later" in str(lost)
    assert waited_s < 1.5 * session_s + 1.0, f"waited {waited_s:.1f} s: the expiry was not seen"

    # Nobody holds the id any more: judged at once.
    t0 = time.monotonic()
    assert isinstance(worker._judge_fence(FENCED), StaticMembershipLostError)
    assert time.monotonic() - t0 < session_s
