"""The worker's wait for an unreachable broker at start (`settled.processors._worker`): its backoff and what counts."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from settled.processors._worker import BROKER_WAIT_MAX_S, _broker_unreachable, broker_wait_s
from settled.producers import PartitionCountMismatchError


def test_the_backoff_doubles_from_half_a_second_up_to_its_bound() -> None:
    assert [broker_wait_s(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert broker_wait_s(10_000) == BROKER_WAIT_MAX_S  # no overflow however long the outage


def test_the_backoff_refuses_a_try_count_below_one() -> None:
    with pytest.raises(ValueError, match="tries must be at least 1, got 0"):
        broker_wait_s(0)


@pytest.mark.parametrize(
    "code",
    [KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError._RESOLVE],
)
def test_an_unanswered_admin_call_means_wait_for_the_broker(code: int) -> None:
    assert _broker_unreachable(KafkaException(KafkaError(code)))


def test_an_admin_future_that_ran_out_means_wait_for_the_broker() -> None:
    assert _broker_unreachable(TimeoutError())


@pytest.mark.parametrize(
    "exc",
    [
        KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)),
        KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)),
        KafkaException("no error object"),
        PartitionCountMismatchError("topics missing: ns.inbox; run `settled topics create`"),
        RuntimeError("anything else"),
    ],
)
def test_any_other_error_fails_the_worker_at_once(exc: Exception) -> None:
    assert not _broker_unreachable(exc)
