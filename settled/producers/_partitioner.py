"""The Java client's murmur2 partitioner in Python (docs/design.md §2, §10).

settled's producers place records with librdkafka's ``murmur2_random`` partitioner, which hashes a non-null key like
the Java client's default partitioner: ``toPositive(murmur2(key)) % partitions``. The client needs the same placement
without producing, to read a conversation's partition of ``settled.settlements`` (`Client.wait`). The integration
tests compare this port with librdkafka's placement of real records.
"""

from __future__ import annotations

__all__ = ["murmur2", "partition_for_key"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Return the Java client's 32-bit murmur2 hash of ``data`` (``org.apache.kafka.common.utils.Utils.murmur2``).

    Args:
        data: The key bytes.

    Returns:
        The hash as a signed 32-bit integer, as Java returns it.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """Return the partition librdkafka's ``murmur2_random`` partitioner gives a non-null key.

    Args:
        key: The record key (for settled, the UTF-8 conversation id).
        partitions: The topic's partition count.

    Returns:
        ``(murmur2(key) & 0x7fffffff) % partitions``.

    Raises:
        ValueError: If ``partitions`` is below 1.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions
