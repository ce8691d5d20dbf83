"""Topic provisioning: the co-partitioned topics of docs/design.md §2 and the genesis record (issue 4 item 4).

``settled.inbox``, ``settled.log``, ``settled.receipts``, ``settled.settlements``, ``settled.quarantine``, the
provisional ``settled.stream`` (issue 19, kept one hour) and ``settled.lifecycle`` (issue 17 item 5: the ``durable.*``
events), under the configured namespace, share one partition count.
``settled.log`` keeps everything (it is the source of truth) and is stamped by the broker (``LogAppendTime``); receipts
and settlements are kept as long (a receipt's settlement must stay findable). The first batch of every log partition
is a ``Genesis`` event fixing the partition count: provisioning refuses, and every partition owner halts, when a
topic's count differs from it — adding partitions would move conversations to a partition with no history and admit
their keys again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic  # type: ignore[attr-defined]

from settled._errors import ErrorCategory, SettledError
from settled._settings import Settings
from settled.producers._appender import AppendBatch, OutRecord, TransactionalAppender
from settled.producers._kafka import admin_config, end_offsets, read_partition
from settled.producers._stream import STREAM_RETENTION_MS, STREAM_SEGMENT_MS
from settled.schemas import Codec, Genesis, LogBatch

__all__ = [
    "TOPICS",
    "PartitionCountMismatchError",
    "TopicInfo",
    "describe_topics",
    "genesis_conversation",
    "provision_topics",
    "read_genesis",
    "topic_configs",
]

#: The short names of settled's co-partitioned topics.
TOPICS = ("inbox", "log", "receipts", "settlements", "quarantine", "stream", "lifecycle")

#: Configuration entries `describe_topics` reports for every topic (``settled topics describe`` shows them).
_DESCRIBED = ("retention.ms", "message.timestamp.type", "max.message.bytes")


class PartitionCountMismatchError(SettledError, RuntimeError):
    """A topic's partition count differs from the genesis record's (docs/design.md §2)."""

    category = ErrorCategory.REJECTED  # `settled topics create` refuses: exit 1


@dataclass(frozen=True)
class TopicInfo:
    """A provisioned topic as the broker describes it.

    Attributes:
        name: Full topic name.
        partitions: Partition count, or 0 when the topic does not exist.
        config: Its settled-relevant configuration entries.
    """

    name: str
    partitions: int
    config: dict[str, str]


def genesis_conversation(partition: int) -> str:
    """Return the pseudo-conversation id of a partition's own records (genesis, ownership claims)."""
    return f"~partition/{partition}"


def topic_configs(settings: Settings) -> dict[str, dict[str, str]]:
    """Return the configuration of each topic, by full name.

    Args:
        settings: The namespace.

    Returns:
        ``{topic: {config: value}}``.
    """
    keep_forever = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
    return {
        settings.topic("inbox"): {},
        settings.topic("log"): {**keep_forever, "message.timestamp.type": "LogAppendTime"},
        settings.topic("receipts"): dict(keep_forever),
        settings.topic("settlements"): dict(keep_forever),
        settings.topic("quarantine"): dict(keep_forever),
        # Provisional parts (issue 19): kept briefly; co-partitioned like the others (settled/producers/_stream.py).
        settings.topic("stream"): {
            "retention.ms": str(STREAM_RETENTION_MS),
            "segment.ms": str(STREAM_SEGMENT_MS),
            "cleanup.policy": "delete",
        },
        # durable.* lifecycle events (issue 17 item 5), produced in the owner's transactions with their causes; kept
        # as long as the log, so a subscriber from the beginning sees every event the log explains.
        settings.topic("lifecycle"): dict(keep_forever),
    }


def describe_topics(settings: Settings, timeout_s: float = 30.0) -> list[TopicInfo]:
    """Describe settled's topics under the configured namespace.

    Args:
        settings: Namespace and bootstrap servers.
        timeout_s: Bound on each admin call, in seconds.

    Returns:
        One `TopicInfo` per topic, in `TOPICS` order (``partitions=0`` for a missing one).
    """
    admin = AdminClient(admin_config(settings))
    metadata = admin.list_topics(timeout=timeout_s).topics
    out: list[TopicInfo] = []
    wanted = topic_configs(settings)
    for name in wanted:
        meta = metadata.get(name)
        if meta is None:
            out.append(TopicInfo(name, 0, {}))
            continue
        resource = ConfigResource(ConfigResource.Type.TOPIC, name)
        entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout=timeout_s)
        keys = {*wanted[name], *_DESCRIBED}
        out.append(TopicInfo(name, len(meta.partitions), {k: str(v.value) for k, v in entries.items() if k in keys}))
    return out


def read_genesis(settings: Settings, codec: Codec, partition: int, timeout_s: float = 30.0) -> Genesis | None:
    """Return the genesis event of a log partition, or ``None`` when the partition is empty.

    Args:
        settings: Namespace and bootstrap servers.
        codec: Decodes the log record.
        partition: The log partition.
        timeout_s: Bound on the read, in seconds.

    Raises:
        PartitionCountMismatchError: The partition's first batch is not a genesis batch.
    """
    log = settings.topic("log")
    if end_offsets(settings, log, partition, timeout_s).last_stable == 0:
        return None
    for msg in read_partition(settings, log, partition, 0, timeout_s):
        value, offset = msg.value(), msg.offset()
        if value is None or offset is None:
            continue
        batch = codec.decode_batch(value, topic=log, partition=partition, offset=offset).batch
        first = batch.events[0]
        if not isinstance(first, Genesis):
            raise PartitionCountMismatchError(f"{log}[{partition}] does not start with a genesis record")
        return first
    return None


def provision_topics(settings: Settings, codec: Codec, now: datetime, timeout_s: float = 30.0) -> list[TopicInfo]:
    """Create the missing topics and write the genesis batch to every empty log partition; idempotent.

    Args:
        settings: Namespace, bootstrap servers and ``partitions``.
        codec: Encodes the genesis batch.
        now: The genesis time (aware UTC).
        timeout_s: Bound on each admin and transactional call, in seconds.

    Returns:
        The topics as described after provisioning.

    Raises:
        PartitionCountMismatchError: An existing topic's partition count differs from ``settings.partitions`` or
            from the genesis record.
    """
    admin = AdminClient(admin_config(settings))
    existing = {info.name: info for info in describe_topics(settings, timeout_s)}
    for name, info in existing.items():
        if info.partitions and info.partitions != settings.partitions:
            raise PartitionCountMismatchError(
                f"topic {name} has {info.partitions} partitions, settled is configured for {settings.partitions}"
            )
    missing = [
        NewTopic(name, num_partitions=settings.partitions, replication_factor=-1, config=config)
        for name, config in topic_configs(settings).items()
        if not existing[name].partitions
    ]
    if missing:
        for fut in admin.create_topics(missing, operation_timeout=timeout_s).values():
            fut.result()
    for p in range(settings.partitions):
        genesis = read_genesis(settings, codec, p, timeout_s)
        if genesis is not None:
            if genesis.partition_count != settings.partitions:
                raise PartitionCountMismatchError(
                    f"genesis of {settings.topic('log')}[{p}] fixes {genesis.partition_count} partitions, "
                    f"settled is configured for {settings.partitions}"
                )
            continue
        _write_genesis(settings, codec, p, now)
    return describe_topics(settings, timeout_s)


def _write_genesis(settings: Settings, codec: Codec, partition: int, now: datetime) -> None:
    conversation = genesis_conversation(partition)
    batch = LogBatch.seal(
        conversation_id=conversation,
        batch_id=f"{conversation}:1",
        first_event_seq=1,
        owner_epoch=0,
        prev_batch_digest=None,
        recorded_at=now,
        events=[Genesis(namespace=settings.namespace, partition_count=settings.partitions, created_at=now)],
    )
    appender = TransactionalAppender(
        settings=settings,
        partition=partition,
        input_topic=settings.topic("inbox"),
        group_metadata=lambda: None,
        replace_poison=_no_replacement,
    )
    appender.open()
    try:
        record = OutRecord(settings.topic("log"), conversation.encode(), codec.encode(batch))
        appender.checkpoint([AppendBatch(batch.batch_id, conversation, record)], [], None)
    finally:
        appender.close()


def _no_replacement(run: tuple[AppendBatch, ...], reason: str) -> tuple[AppendBatch, ...]:
    raise PartitionCountMismatchError(f"the genesis batch cannot be appended: {reason}")
