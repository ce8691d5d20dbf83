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
    consumer_config,
    end_offsets,
    producer_config,
    read_partition,
    transactional_id,
)

__all__ = [
    "BATCH_ID_HEADER",
    "AppendBatch",
    "AppenderFatalError",
    "CheckpointResult",
    "EndOffsets",
    "OpenTransactionError",
    "OutRecord",
    "ProducerFencedError",
    "Run",
    "TransactionalAppender",
    "consumer_config",
    "end_offsets",
    "low_watermark",
    "producer_config",
    "read_partition",
    "transactional_id",
]
