"""Session windows: per key, records closer together than an inactivity gap make one
session; a record that bridges two sessions merges them.

Kafka Streams' semantics (KStreamSessionWindowAggregate): a session is ``[start, end]``, both
the timestamps of records in it (a lone record's session is ``[t, t]``). A record at ``t``
joins every session of its key that ends at or after ``t - gap`` and starts at or before
``t + gap``; the merged sessions are deleted and each is retracted downstream with a
tombstone before the merged session's new aggregate is forwarded. Updates carry the
session's end as their timestamp. A record whose merged session ended before stream time
(the largest timestamp the node has seen) minus gap minus grace is late: dropped and
counted.

Kafka Streams' session store is segmented, its retention the gap plus the grace: it answers
``findSessions`` only with sessions ending at or after its own time (the largest session end
put in it) minus the retention plus one. An older session is not merged, even when a late
record within the gap of it is accepted (it extends a newer session); Relay's store answers
the same, and its purge deletes what it no longer answers.

The store is keyed ``(key, end, start)``: a key's sessions sorted by end, so the candidates
for a merge are one range scan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streams.dsl.errors import TopologyError
from streams.dsl.processors import ProcessorContext, WindowedAggregation, _has_key
from streams.dsl.windows import Windowed, whole_ms

#: Above every timestamp: the upper bound of a key's range scan.
_MAX_TIME = 1 << 62


@dataclass(frozen=True)
class SessionWindows:
    """Sessions of a key separated by at least ``inactivity_gap_ms`` without records; late
    records are accepted for ``grace_ms`` after a session could last have been extended."""

    inactivity_gap_ms: int
    grace_ms: int = 0

    def __post_init__(self) -> None:
        whole_ms(self, "inactivity_gap_ms", "grace_ms")
        if self.inactivity_gap_ms <= 0:
            raise TopologyError(f"inactivity_gap_ms must be > 0, not {self.inactivity_gap_ms}")
        if self.grace_ms < 0:
            raise TopologyError(f"session grace_ms must be >= 0, not {self.grace_ms}")

    @property
    def close_after_ms(self) -> int:
        """How long after a session's end stream time must go for it to close."""
        return self.inactivity_gap_ms + self.grace_ms


class SessionAggregateNode(WindowedAggregation):
    windows: SessionWindows

    def __init__(
        self,
        name: str,
        store: str,
        windows: SessionWindows,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        merger: Callable[[Any, Any, Any], Any],
    ) -> None:
        super().__init__(name, store, windows, initializer, aggregator)
        self.merger = merger

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if not _has_key(self, ctx, key, "a session aggregation"):
            return
        store = ctx.store(self.store)
        timestamp = ctx.timestamp_ms
        # The store's time before this record: the largest session end put in it, which is
        # the node's stream time (the record that moves it is never late).
        store_time = ctx.observed_ms.get(self.name, -1)
        stream_time = self.advance_stream_time(ctx, timestamp)
        close_time = stream_time - self.windows.close_after_ms
        gap = self.windows.inactivity_gap_ms
        merged: list[tuple[int, int, Any]] = []
        start, end = timestamp, timestamp
        aggregate = self.initializer()
        earliest_end = max(timestamp - gap, _earliest_held(store_time, self.windows))
        for (_, s_end, s_start), s_agg in store.range((key, earliest_end), (key, _MAX_TIME)):
            if s_start > timestamp + gap:
                continue
            merged.append((s_start, s_end, s_agg))
            aggregate = self.merger(key, aggregate, s_agg)
            start, end = min(start, s_start), max(end, s_end)
        if end < close_time:
            ctx.drop_late(self.name, self.store, start, end, self.windows.grace_ms,
                          end_included=True, gap_ms=gap)
            return
        previous = ctx.timestamp_ms
        try:
            if (start, end) != (timestamp, timestamp):
                for s_start, s_end, _ in merged:
                    store.delete((key, s_end, s_start))
                    ctx.timestamp_ms = s_end
                    self.forward(ctx, Windowed(key, s_start, s_end), None)
            aggregate = self.aggregator(key, value, aggregate)
            store.put((key, end, start), aggregate)
            ctx.timestamp_ms = end
            self.forward(ctx, Windowed(key, start, end), aggregate)
        finally:
            ctx.timestamp_ms = previous

    def purge(self, ctx: ProcessorContext) -> int:
        """Delete the sessions the store no longer answers (ending before its time minus the
        retention plus one); returns how many."""
        windows = self.windows
        horizon = _earliest_held(ctx.observed_ms.get(self.name, -1), windows)
        if horizon <= 0 or not purge_due(ctx, self.name, horizon, windows.close_after_ms // 2):
            return 0
        store = ctx.store(self.store)
        expired = [k for k, _ in store.items() if k[1] < horizon]
        for key in expired:
            store.delete(key)
        return len(expired)


def _earliest_held(store_time: int, windows: SessionWindows) -> int:
    """The earliest session end Kafka Streams' session store answers at ``store_time``: its
    retention is the gap plus the grace (``SessionStoreMaterializer``), and its fetches start
    at its time minus the retention plus one (``AbstractRocksDBSegmentedBytesStore``)."""
    return store_time - windows.close_after_ms + 1


def purge_due(ctx: ProcessorContext, key: str, horizon: int, step: int) -> bool:
    """Whether a purge up to ``horizon`` is worth its scan of the store: the first one, then
    once the horizon moved ``step`` on (half the retention), not at every commit."""
    last = ctx.node_state.get(f"{key}/purged")
    if last is not None and horizon - last < max(1, step):
        return False
    ctx.node_state[f"{key}/purged"] = horizon
    return True
