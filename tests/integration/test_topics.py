"""``settled topics create|describe`` against the real broker (issue 4 item 4; docs/design.md §2)."""

from __future__ import annotations

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions  # type: ignore[attr-defined]
from typer.testing import CliRunner

from settled._settings import Settings
from settled.schemas import Genesis
from settled.services.cli import app
from tests.integration.helpers import CODEC, read_topic

pytestmark = pytest.mark.integration

TOPICS = ("inbox", "log", "receipts", "settlements", "quarantine", "stream", "lifecycle")


def _env(s: Settings, partitions: int) -> dict[str, str]:
    return {
        "SETTLED_NAMESPACE": s.namespace,
        "SETTLED_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
        "SETTLED_PARTITIONS": str(partitions),
        "COLUMNS": "250",  # rich wraps table cells to the terminal width
    }


def _settled(s: Settings, partitions: int, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env=_env(s, partitions))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _log_high_watermarks(s: Settings, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": f"{s.namespace}.hw"})
    try:
        return [
            c.get_watermark_offsets(TopicPartition(s.topic("log"), p), timeout=10, cached=False)[1]
            for p in range(partitions)
        ]
    finally:
        c.close()


def _geneses(s: Settings) -> list[tuple[int, Genesis]]:
    out = []
    for rec in read_topic(s, "log"):
        batch = CODEC.decode_batch(rec.value, offset=rec.offset).batch
        assert len(batch.events) == 1 and isinstance(batch.events[0], Genesis), batch
        out.append((rec.partition, batch.events[0]))
    return out


def test_create_twice_is_a_noop_the_second_time(settings: Settings) -> None:
    code, out, err = _settled(settings, 2, "topics", "create")
    assert code == 0, err
    for short in TOPICS:
        assert settings.topic(short) in out
    assert "genesis: 2 log partitions fix 2 partitions" in out
    geneses = _geneses(settings)
    assert sorted(p for p, _ in geneses) == [0, 1]
    assert all(g.partition_count == 2 and g.namespace == settings.namespace for _, g in geneses)
    ends = _log_high_watermarks(settings, 2)

    code, out, err = _settled(settings, 2, "topics", "create")
    assert code == 0, err
    assert _geneses(settings) == geneses  # the same genesis records, and no second genesis batch on any partition
    assert _log_high_watermarks(settings, 2) == ends


def test_log_keeps_everything_and_is_stamped_by_the_broker(settings: Settings) -> None:
    code, _, err = _settled(settings, 1, "topics", "create")
    assert code == 0, err
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, settings.topic("log"))
    config = admin.describe_configs([resource])[resource].result(timeout=30)
    assert config["retention.ms"].value == "-1"
    assert config["message.timestamp.type"].value == "LogAppendTime"
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"{settings.namespace}.ts",
                  "isolation.level": "read_committed"})  # fmt: skip
    c.assign([TopicPartition(settings.topic("log"), 0, 0)])
    msg = c.poll(10)
    c.close()
    assert msg is not None and msg.error() is None
    assert msg.timestamp()[0] == TIMESTAMP_LOG_APPEND_TIME

    code, out, err = _settled(settings, 1, "topics", "describe")
    assert code == 0, err
    log_row = next(line for line in out.splitlines() if f" {settings.topic('log')} " in line)
    assert "forever (-1)" in log_row and "LogAppendTime" in log_row
    inbox_row = next(line for line in out.splitlines() if f" {settings.topic('inbox')} " in line)
    assert "CreateTime" in inbox_row
    # The durable.* lifecycle events (issue 17 item 5) are kept as long as the log that explains them.
    lifecycle_row = next(line for line in out.splitlines() if f" {settings.topic('lifecycle')} " in line)
    assert "forever (-1)" in lifecycle_row


def test_the_provisional_stream_is_kept_briefly(settings: Settings) -> None:
    code, _, err = _settled(settings, 1, "topics", "create")
    assert code == 0, err
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, settings.topic("stream"))
    config = admin.describe_configs([resource])[resource].result(timeout=30)
    assert (config["retention.ms"].value, config["segment.ms"].value) == ("3600000", "600000")


def test_describe_fails_when_topics_are_missing(settings: Settings) -> None:
    code, out, err = _settled(settings, 1, "topics", "describe")
    assert code == 1
    assert "missing" in out and "settled topics create" in err


def test_create_refuses_a_topic_with_another_partition_count(settings: Settings) -> None:
    code, _, err = _settled(settings, 1, "topics", "create")
    assert code == 0, err
    ends = _log_high_watermarks(settings, 1)
    code, _, err = _settled(settings, 2, "topics", "create")
    assert code == 1
    flat = " ".join(err.split())
    assert f"topic {settings.topic('inbox')} has 1 partitions, settled is configured for 2" in flat
    assert _log_high_watermarks(settings, 1) == ends  # nothing was written


def test_create_refuses_when_partitions_were_added_after_genesis(settings: Settings) -> None:
    code, _, err = _settled(settings, 2, "topics", "create")
    assert code == 0, err
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    grown = admin.create_partitions([NewPartitions(settings.topic(short), 3) for short in TOPICS])
    for fut in grown.values():
        fut.result(timeout=30)
    code, _, err = _settled(settings, 3, "topics", "create")
    assert code == 1
    flat = " ".join(err.split())
    assert f"genesis of {settings.topic('log')}[0] fixes 2 partitions, settled is configured for 3" in flat
    assert len(_geneses(settings)) == 2  # the new log partition got no genesis of its own
