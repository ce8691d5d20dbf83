"""The inbox producer sends at once: ``linger.ms`` 0 (docs/architecture.md "K=0 turn latency (issue 24)")."""

from __future__ import annotations

from settled._settings import Settings
from settled.client._inbox import InboxProducer


def test_the_inbox_producer_does_not_linger_whatever_the_settings_linger() -> None:
    # The settings' linger (settled's transactional and stream producers) is 1 ms by default; every inbox record has
    # a caller blocked on its receipt, so the inbox producer must not wait for more records.
    settings = Settings(namespace="t-linger", linger_ms=5)
    producer = InboxProducer(settings, delivery_timeout_s=10)
    try:
        assert producer._conf["linger.ms"] == 0
    finally:
        producer.close(0.1)


def test_an_override_of_the_inbox_linger_wins() -> None:
    producer = InboxProducer(Settings(namespace="t-linger"), delivery_timeout_s=10, overrides={"linger.ms": 7})
    try:
        assert producer._conf["linger.ms"] == 7
    finally:
        producer.close(0.1)
