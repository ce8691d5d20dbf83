"""settled.producers: the exactly-once path to Kafka (DESIGN.md §3) and Kafka client configuration."""

from settled.producers._appender import (
    BATCH_ID_HEADER,
    AppendBatch,
    AppenderFatalError,
    CheckpointResult,
    OpenTransactionError,
    OutRecord,
    ProducerFencedError,
    Run,
    TransactionalAppender,
    low_watermark,
)
from settled.producers._kafka import (
    EndOffsets,
    consume_promptly,
    consumer_config,
    end_offsets,
    producer_config,
    read_partition,
    transactional_id,
)
from settled.producers._partitioner import murmur2, partition_for_key
from settled.producers._topics import (
    TOPICS,
    PartitionCountMismatchError,
    TopicInfo,
    describe_topics,
    genesis_conversation,
    provision_topics,
    read_genesis,
    topic_configs,
)

__all__ = [
    "BATCH_ID_HEADER",
    "TOPICS",
    "AppendBatch",
    "AppenderFatalError",
    "CheckpointResult",
    "EndOffsets",
    "OpenTransactionError",
    "OutRecord",
    "PartitionCountMismatchError",
    "ProducerFencedError",
    "Run",
    "TopicInfo",
    "TransactionalAppender",
    "consume_promptly",
    "consumer_config",
    "describe_topics",
    "end_offsets",
    "genesis_conversation",
    "low_watermark",
    "murmur2",
    "partition_for_key",
    "producer_config",
    "provision_topics",
    "read_genesis",
    "read_partition",
    "topic_configs",
    "transactional_id",
]
