"""Timestamp synchronization across a task's input partitions (no broker)."""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.structs import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from streams.runtime.partition_group import MAX_WAIT_FOR_LAGGING_MS, PartitionGroup

ORDERS, USERS = TopicPartition("orders", 0), TopicPartition("users", 0)


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    timestamp: int


def recs(tp: TopicPartition, *stamps: int, first: int = 0) -> list[Rec]:
    return [Rec(tp.topic, tp.partition, first + i, ts) for i, ts in enumerate(stamps)]


def test_a_stream_waits_for_the_table_it_joins_while_the_table_lags() -> None:
    # The first fetch brought only orders; users, written earlier, are still at the broker.
    group = PartitionGroup([ORDERS, USERS])
    group.add(recs(ORDERS, 10, 11))
    assert group.take(lambda tp: tp == USERS, now_ms=0) == []
    group.add(recs(USERS, 1, 2))
    taken = group.take(lambda tp: False, now_ms=10)
    assert [(r.topic, r.timestamp) for r in taken] == [
        ("users", 1), ("users", 2), ("orders", 10), ("orders", 11)]
    assert group.buffered == 0


def test_a_caught_up_partition_holds_nobody_back() -> None:
    group = PartitionGroup([ORDERS, USERS])
    group.add(recs(ORDERS, 10, 11))
    assert [r.offset for r in group.take(lambda tp: False, now_ms=0)] == [0, 1]


def test_draining_a_lagging_partition_stops_the_pass() -> None:
    group = PartitionGroup([ORDERS, USERS])
    group.add(recs(ORDERS, 5, 50))
    group.add(recs(USERS, 1))
    # users has more at the broker: once its one record is taken, orders' 5 goes only if
    # it is older than what users may bring next, which nobody knows yet.
    taken = group.take(lambda tp: tp == USERS, now_ms=0)
    assert [(r.topic, r.timestamp) for r in taken] == [("users", 1)]
    assert group.buffered == 2


def test_a_lagging_partition_that_brings_nothing_is_waited_for_a_bounded_time() -> None:
    group = PartitionGroup([ORDERS, USERS])
    group.add(recs(ORDERS, 10))
    assert group.take(lambda tp: tp == USERS, now_ms=1_000) == []
    assert group.take(lambda tp: tp == USERS, now_ms=1_000 + MAX_WAIT_FOR_LAGGING_MS - 1) == []
    taken = group.take(lambda tp: tp == USERS, now_ms=1_000 + MAX_WAIT_FOR_LAGGING_MS)
    assert [r.timestamp for r in taken] == [10]


def test_records_fetched_again_after_a_seek_back_replace_the_buffered_copies() -> None:
    group = PartitionGroup([ORDERS, USERS])
    group.add(recs(ORDERS, 10, 11, 12))
    group.add(recs(ORDERS, 11, 12, first=1))  # sought back to offset 1
    assert [r.offset for r in group.take(lambda tp: False, now_ms=0)] == [1, 2]


@given(st.lists(st.integers(0, 100), max_size=20), st.lists(st.integers(0, 100), max_size=20))
def test_everything_comes_out_once_in_offset_order_per_partition(a: list[int],
                                                                 b: list[int]) -> None:
    group = PartitionGroup([ORDERS, USERS])
    group.add(recs(ORDERS, *a))
    group.add(recs(USERS, *b))
    out = group.take(lambda tp: False, now_ms=0)
    assert len(out) == len(a) + len(b) and group.buffered == 0
    for tp in (ORDERS, USERS):
        offsets = [r.offset for r in out if r.topic == tp.topic]
        assert offsets == sorted(offsets)
