"""When a changelog fetch of a partition grows: it returned bytes but made no progress while
more is readable (a batch or a transaction larger than the fetch)."""

from __future__ import annotations

from aiokafka.structs import TopicPartition

from statestore.fetch import MAX_GROWN_PARTITION_BYTES, FetchedPartition, grown_size

TP = TopicPartition("app-counts-changelog", 0)
MIB = 1 << 20


def test_a_fetch_that_made_no_progress_for_its_size_grows() -> None:
    stuck = FetchedPartition(TP, 364, 364, end=90_000, size=16 * MIB)
    assert grown_size(stuck, 16 * MIB) == 32 * MIB
    assert grown_size(stuck, MAX_GROWN_PARTITION_BYTES) == MAX_GROWN_PARTITION_BYTES
    # Progress, no bytes (the response filled up with other partitions), the readable end
    # reached (a transaction still open), or a position past the log: nothing to grow.
    assert grown_size(FetchedPartition(TP, 364, 900, 90_000, [(b"k", b"v")], 16 * MIB),
                      16 * MIB) is None
    assert grown_size(FetchedPartition(TP, 364, 364, 90_000, size=0), 16 * MIB) is None
    assert grown_size(FetchedPartition(TP, 364, 364, 364, size=5 * MIB), 16 * MIB) is None
    assert grown_size(FetchedPartition(TP, 364, 364, 90_000, size=1, past_end=True),
                      16 * MIB) is None
