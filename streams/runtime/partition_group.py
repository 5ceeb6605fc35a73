"""A task's input records between the fetch and the task: timestamp synchronization.

A task that reads several partitions (a stream and the table it joins, or a repartition topic
and a source) processes their records oldest first, as Kafka Streams does: the next record is
the one with the smallest timestamp among the partitions' first buffered records. A partition
with nothing buffered holds the others back while the consumer knows it has more to fetch
(it lags), since its next record may be older than every buffered one; once it is caught up,
or after :data:`MAX_WAIT_FOR_LAGGING_MS` spent waiting for it, the others go on. So a stream
joined with a table written before it sees the table's rows, even when the first fetch
brought only the stream.

The decision is pure: what lags and the time come in as arguments.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka.structs import TopicPartition

#: The longest a task waits for a lagging partition that brings nothing (paused, or its
#: fetches failing) before it processes the others anyway.
MAX_WAIT_FOR_LAGGING_MS = 5_000


class PartitionGroup:
    """The fetched, not yet processed records of one task's input partitions."""

    def __init__(self, partitions: Iterable[TopicPartition]) -> None:
        self._buffers: dict[TopicPartition, deque[Any]] = {tp: deque() for tp in partitions}
        #: When the task started waiting for a lagging partition (ms; None: not waiting).
        self._waiting_since_ms: float | None = None

    @property
    def synchronizes(self) -> bool:
        """A task of one input partition has nothing to synchronize."""
        return len(self._buffers) > 1

    @property
    def buffered(self) -> int:
        return sum(len(b) for b in self._buffers.values())

    def add(self, records: list[Any]) -> None:
        """A fetch's records of one partition, in offset order. Records at or before the
        partition's last buffered offset mean the consumer was sought back (a rebalance
        seeks kept partitions to their processed position): the older copies are dropped."""
        if not records:
            return
        first = records[0]
        buffer = self._buffers.setdefault(TopicPartition(first.topic, first.partition), deque())
        if buffer and buffer[-1].offset >= first.offset:
            buffer.clear()
        buffer.extend(records)

    def clear(self) -> None:
        for buffer in self._buffers.values():
            buffer.clear()
        self._waiting_since_ms = None

    def take(self, lagging: Callable[[TopicPartition], bool], now_ms: float) -> list[Any]:
        """The records the task may process now, oldest first across partitions (offset
        order within each); the rest stay buffered."""
        heads = [(buffer[0].timestamp, i, tp) for i, (tp, buffer)
                 in enumerate(self._buffers.items()) if buffer]
        if not heads:
            self._waiting_since_ms = None
            return []
        empty_lagging = any(not b and lagging(tp) for tp, b in self._buffers.items())
        if empty_lagging:
            if self._waiting_since_ms is None:
                self._waiting_since_ms = now_ms
            if now_ms - self._waiting_since_ms < MAX_WAIT_FOR_LAGGING_MS:
                return []
        self._waiting_since_ms = None
        heapq.heapify(heads)
        out: list[Any] = []
        while heads:
            _, i, tp = heapq.heappop(heads)
            buffer = self._buffers[tp]
            out.append(buffer.popleft())
            if buffer:
                heapq.heappush(heads, (buffer[0].timestamp, i, tp))
            elif not empty_lagging and lagging(tp):
                # Drained a partition with more to fetch: its next record may be older
                # than the others' heads.
                break
        return out
