"""A new reader's first end-offset query whose answer is lost is asked again at once (issue 24 item 4).

A new librdkafka client's first metadata request can go out on its bootstrap connection just before librdkafka drops
that connection, and its answer is lost; ``get_watermark_offsets`` would then wait 0.5-0.7 s before librdkafka asks
again (docs/architecture.md "Restart in place"). The stand-in speaks confluent-kafka's ``get_watermark_offsets``: it
answers a query by its deadline or raises ``_TIMED_OUT``, as the client does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from settled.producers._kafka import _end_offset


@dataclass
class LosesFirstAnswer:
    """A consumer whose first query's answer never comes (it times out); later ones answer at once."""

    high_watermark: int
    first_error: int = KafkaError._TIMED_OUT
    timeouts_s: list[float] = field(default_factory=list)

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
        assert cached is False
        self.timeouts_s.append(timeout)
        if len(self.timeouts_s) == 1:
            raise KafkaException(KafkaError(self.first_error))
        return 0, self.high_watermark


class AlwaysTimesOut(LosesFirstAnswer):
    """A consumer no query of which is answered in time."""

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
        self.timeouts_s.append(timeout)
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))


def _query(consumer: Any, timeout_s: float = 10.0) -> int:
    return _end_offset(consumer, TopicPartition("ns.log", 3), timeout_s, time.monotonic() + timeout_s)


@pytest.mark.parametrize("ran_out", [KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN])
def test_a_first_query_that_times_out_is_asked_again_at_once_with_the_full_timeout(ran_out: int) -> None:
    """librdkafka answers a query that ran out ``_ALL_BROKERS_DOWN`` when no connection was up at that moment."""
    consumer = LosesFirstAnswer(high_watermark=42, first_error=ran_out)
    assert _query(consumer) == 42
    first_s, second_s = consumer.timeouts_s
    assert first_s < 1.0  # not the whole call's 10 s: a lost answer must not cost the call's timeout
    assert second_s == 10.0


def test_only_the_first_query_is_asked_again() -> None:
    consumer = AlwaysTimesOut(high_watermark=42)
    with pytest.raises(KafkaException) as caught:
        _query(consumer)
    assert caught.value.args[0].code() == KafkaError._TIMED_OUT
    assert len(consumer.timeouts_s) == 2 and consumer.timeouts_s[1] == 10.0


def test_any_other_error_of_the_first_query_is_raised() -> None:
    consumer = LosesFirstAnswer(high_watermark=42, first_error=KafkaError._TRANSPORT)
    with pytest.raises(KafkaException) as caught:
        _query(consumer)
    assert caught.value.args[0].code() == KafkaError._TRANSPORT
    assert len(consumer.timeouts_s) == 1
