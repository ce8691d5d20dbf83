"""The Java client's murmur2 partitioner in Python (DESIGN.md §2).

librdkafka's ``murmur2_random`` partitioner places a keyed record on ``(murmur2(key) & 0x7fffffff) % partitions``,
as Java's ``DefaultPartitioner`` does. The owner recomputes it to refuse a misrouted record; a test checks it
against librdkafka's own placement on a real broker (never trust a hand port untested).
"""

from __future__ import annotations

__all__ = ["murmur2", "partition_for_key"]

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Return Kafka's 32-bit murmur2 hash of ``data`` as an unsigned int (``org.apache.kafka.common.utils.Utils``).

    Args:
        data: The key bytes.

    Returns:
        The hash, 0 .. 2**32 - 1.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK
    end = length - (length % 4)
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for_key(key: bytes, partitions: int) -> int:
    """Return the partition the murmur2 partitioner picks for ``key`` among ``partitions``.

    Args:
        key: The record key.
        partitions: The topic's partition count (>= 1).

    Returns:
        ``(murmur2(key) & 0x7fffffff) % partitions``.

    Raises:
        ValueError: ``partitions`` is below 1.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions
