"""Static membership settings and the fatal error of a fenced instance (issue 24 item 4), without a broker.

A fence is a twin's (`InstanceFencedError`, exit 78) only when a member still holds the instance id a session
timeout after the fence; otherwise the broker lost this worker's membership (`StaticMembershipLostError`, exit 75).
The waiting and the group's description on a real broker: ``tests/integration/test_static_member_fence.py``.
"""

from __future__ import annotations

from datetime import datetime

import pytest
from confluent_kafka import KafkaError, KafkaException
from pydantic import ValidationError

from settled._errors import ErrorCategory
from settled._settings import Settings
from settled.processors import InstanceFencedError, StaticMembershipLostError, Worker
from settled.processors._worker import InstanceHolder, _FenceSeen, instance_fence_error

#: librdkafka's report of a static member fenced by another with its ``group.instance.id``, as a consumer error event.
FENCED = (
    "Fatal error: Broker: Static consumer fenced by other consumer with same group.instance.id: Fatal consumer error: "
    "Broker: Static consumer fenced by other consumer with same group.instance.id"
)


class _NoDecider:
    def initial_state(self, partition: int) -> None:
        raise AssertionError("not used")

    def fold(self, state: None, batch: object) -> None:
        raise AssertionError("not used")

    def decide(self, state: None, inp: object, now: datetime) -> list[object]:
        raise AssertionError("not used")

    def poison(self, state: None, decisions: object, reason: str, now: datetime) -> list[object]:
        raise AssertionError("not used")


def _worker(instance_id: str | None) -> Worker[None]:
    return Worker(Settings(namespace="ns", worker_instance_id=instance_id), lambda _p: _NoDecider())  # type: ignore[arg-type, return-value]


def test_a_fence_ends_the_loop_to_be_judged_once_every_partition_is_dropped() -> None:
    assert isinstance(_worker("slot-3")._fatal_consumer_error(KafkaError(KafkaError._FATAL, FENCED)), _FenceSeen)


def test_a_member_still_holding_the_id_is_a_twin_named_in_the_instance_fenced_error() -> None:
    holders = [InstanceHolder("settled-worker-7f3a", "/10.0.0.7")]
    error = instance_fence_error("ns.settled.workers", "slot-3", FENCED, holders)
    assert isinstance(error, InstanceFencedError)
    assert error.category is ErrorCategory.CONFLICT
    assert "SETTLED_WORKER_INSTANCE_ID='slot-3'" in str(error) and "ns.settled.workers" in str(error)
    assert "member settled-worker-7f3a (first joined from /10.0.0.7)" in str(error)


@pytest.mark.parametrize(
    ("holders", "says"),
    [([], "has no member with it a session timeout later"), (None, "could not be described")],
)
def test_no_member_holding_the_id_is_a_lost_membership(holders: list[InstanceHolder] | None, says: str) -> None:
    error = instance_fence_error("ns.settled.workers", "slot-3", FENCED, holders)
    assert isinstance(error, StaticMembershipLostError)
    assert error.category is ErrorCategory.UNAVAILABLE
    assert says in str(error) and "SETTLED_WORKER_INSTANCE_ID='slot-3'" in str(error)


def test_another_fatal_consumer_error_is_raised_as_librdkafka_reports_it() -> None:
    error = _worker(None)._fatal_consumer_error(KafkaError(KafkaError._FATAL, "Fatal error: something else"))
    assert isinstance(error, KafkaException) and error.args[0].code() == KafkaError._FATAL


@pytest.mark.parametrize("bad", ["", "has space", "x" * 250, "slash/no"])
def test_a_bad_instance_id_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(ValidationError, match="worker_instance_id"):
        Settings(worker_instance_id=bad)


def test_no_instance_id_is_dynamic_membership_by_default() -> None:
    assert Settings().worker_instance_id is None
