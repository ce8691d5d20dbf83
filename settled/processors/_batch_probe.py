"""Find where a record batch the consumer cannot read ends, so the worker can quarantine it and move past it.

librdkafka reports a batch it cannot read — e.g. a zstd batch whose decompressed size exceeds
``receive.message.max.bytes`` — as a consumer error (``_BAD_COMPRESSION``) at the batch's *base* offset, and does not
advance its fetch position: it fetches the same batch again after ``fetch.error.backoff.ms`` and reports the same
error, forever (``rd_kafka_msgset_reader_v2`` returns before it sets the next fetch offset past the batch; checked
against the broker in ``tests/integration/test_quarantine.py``). Seeking to base + 1 does not help either: the broker
answers a fetch with whole batches, so a fetch from anywhere inside the batch returns it again and fails again.

The error does not say where the batch ends. `failing_batch_last_offset` finds it with a second, assign-only consumer
that has the same size limits (so it fails exactly where the group consumer fails): a fetch from offset ``o`` fails
at the same base offset while ``o`` is inside the batch, and returns a record (or a later error, or the end of the
partition) once ``o`` is past it. Galloping then bisecting finds the last offset in O(log n) fetches of one small
compressed batch, never decompressing it. The worker quarantines the whole batch as one input (issue 4 item 6) and
seeks past it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from settled._errors import ErrorCategory, SettledError
from settled._settings import Settings
from settled.producers import reader_config

__all__ = ["BatchProbeError", "failing_batch_last_offset", "probe_consumer_config"]

#: Errors that say nothing about the probed position: keep polling.
_IGNORED = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT})


class BatchProbeError(SettledError, RuntimeError):
    """The end of an unreadable batch could not be determined within the bound (the broker did not answer)."""

    category = ErrorCategory.UNAVAILABLE


def probe_consumer_config(settings: Settings, limits: Mapping[str, Any]) -> dict[str, Any]:
    """Return the probe consumer's configuration: read_committed, assign-only, quick fetches, the given size limits.

    Args:
        settings: Namespace and bootstrap servers.
        limits: The size properties the group consumer runs with (``fetch.max.bytes``,
            ``receive.message.max.bytes``, ...), so that the probe fails exactly where the group consumer fails.

    Returns:
        The configuration dict.
    """
    return reader_config(
        settings,
        f"{settings.namespace}.settled-batch-probe",
        **{"enable.partition.eof": True, "fetch.wait.max.ms": 10, **limits},
    )


def failing_batch_last_offset(
    conf: Mapping[str, Any], topic: str, partition: int, base_offset: int, timeout_s: float
) -> int:
    """Return the last offset of the unreadable batch whose error the consumer reports at ``base_offset``.

    Args:
        conf: The probe consumer's configuration (`probe_consumer_config`).
        topic: The topic.
        partition: The partition.
        base_offset: The offset the consumer error names (the batch's base offset).
        timeout_s: Bound on the whole search, in seconds.

    Returns:
        The batch's last offset (``base_offset`` when the batch holds one record, or when the error does not recur
        from ``base_offset + 1``).

    Raises:
        BatchProbeError: A probe got no answer within the bound.
    """
    deadline = time.monotonic() + timeout_s
    consumer = Consumer(dict(conf))
    try:
        tp = TopicPartition(topic, partition)
        end = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)[1]  # the LSO (read_committed)

        def inside(offset: int) -> bool:
            consumer.assign([TopicPartition(topic, partition, offset)])
            while True:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    raise BatchProbeError(
                        f"no answer fetching {topic}[{partition}]@{offset} while looking for the end of the "
                        f"unreadable batch at {base_offset} within {timeout_s} s"
                    )
                msg = consumer.poll(min(remaining_s, 0.5))
                if msg is None:
                    continue
                got = msg.offset()
                err = msg.error()
                if err is None:
                    if got is not None and got >= offset:
                        return False  # a readable record at or past the probe: the batch ended before it
                    continue
                if err.code() in _IGNORED:
                    continue
                if err.code() == KafkaError._PARTITION_EOF:
                    return False
                if got == base_offset:
                    return True  # the same batch, fetched from inside it, fails again
                if got is not None and got > base_offset:
                    return False  # some other batch past ours
                # An error naming no offset: keep polling until the same batch or a later record shows.

        last = base_offset
        step = 1
        while last + step < end and inside(last + step):  # gallop: inside(last) holds throughout
            last += step
            step *= 2
        high = min(last + step, end)  # the first offset known to lie past the batch
        while high - last > 1:
            mid = (last + high) // 2
            if inside(mid):
                last = mid
            else:
                high = mid
        return last
    finally:
        consumer.close()
