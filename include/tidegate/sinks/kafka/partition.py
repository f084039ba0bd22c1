"""Which partition a record goes to: Kafka's murmur2, as the Java clients (and librdkafka's
``murmur2_random`` partitioner, the producer's setting) compute it. The checkpoint record's
partition is picked here too, so a reader finds it where the producer put it."""

from __future__ import annotations


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (as Java's ``Utils.murmur2``), unsigned 32-bit."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest, idx = length % 4, length & ~3
    if rest == 3:
        h ^= data[idx + 2] << 16
    if rest >= 2:
        h ^= data[idx + 1] << 8
    if rest >= 1:
        h ^= data[idx]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The partition Java clients (and librdkafka's ``murmur2_random``) pick for ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


__all__ = ["murmur2", "murmur2_partition"]
