"""Sliding windows (KIP-450): windows of a fixed time difference that exist only where
records are, so that every distinct set of records within ``time_difference_ms`` of each
other is aggregated once.

A record at ``t`` has a left window ``[t - d, t]`` and, when later records fall within ``d``
after it, a right window ``[t + 1, t + 1 + d]``; both ends are inclusive. The algorithm is
Kafka Streams' (KStreamSlidingWindowAggregate, its reverse-iterator variant, and the
``[0, d]`` window that holds records earlier than ``d``), so the same input gives the same
updates in the same order. Each stored window keeps its aggregate and the largest timestamp
in it, ``[aggregate, max_timestamp]``, keyed ``(key, start)``; an update carries that
largest timestamp. A record is late once stream time minus grace passes ``t + 1 + d``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from statestore.store import KeyValueStore
from streams.dsl.errors import TopologyError
from streams.dsl.processors import ProcessorContext, WindowedAggregation
from streams.dsl.sessions import purge_due
from streams.dsl.windows import Windowed, whole_ms


@dataclass(frozen=True)
class SlidingWindows:
    """Windows of ``time_difference_ms`` (both ends inclusive) that slide with the records;
    late records are accepted for ``grace_ms``."""

    time_difference_ms: int
    grace_ms: int = 0

    def __post_init__(self) -> None:
        whole_ms(self, "time_difference_ms", "grace_ms")
        if self.time_difference_ms <= 0:
            raise TopologyError(f"time_difference_ms must be > 0, not {self.time_difference_ms}")
        if self.grace_ms < 0:
            raise TopologyError(f"sliding grace_ms must be >= 0, not {self.grace_ms}")

    @property
    def close_after_ms(self) -> int:
        """Grace after a window's end (suppression of final results waits for it)."""
        return self.grace_ms


class SlidingAggregateNode(WindowedAggregation):
    windows: SlidingWindows

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if key is None or value is None:
            return  # skipped, as Kafka Streams does
        store = ctx.store(self.store)
        t = ctx.timestamp_ms
        d = self.windows.time_difference_ms
        stream_time = self.advance_stream_time(ctx, t)
        close_time = stream_time - self.windows.grace_ms
        if t + 1 + d <= close_time:
            # Its left window; a record before d falls in the first window, [0, d].
            start = max(t - d, 0)
            ctx.drop_late(self.name, self.store, start, start + d, self.windows.grace_ms,
                          end_included=True)
            return
        previous = ctx.timestamp_ms
        try:
            if t < d:
                self._process_early(ctx, store, key, value, t, close_time)
            else:
                self._process_reverse(ctx, store, key, value, t, close_time)
        finally:
            ctx.timestamp_ms = previous

    def _fetch(self, store: KeyValueStore, key: Any, start: int, end: int,
               reverse: bool) -> list[tuple[int, list[Any]]]:
        """The key's windows with ``start <= window start <= end``."""
        return [(k[1], v) for k, v in store.range((key, start), (key, end + 1), reverse=reverse)]

    def _process_reverse(self, ctx: ProcessorContext, store: KeyValueStore, key: Any,
                         value: Any, t: int, close_time: int) -> None:
        d = self.windows.time_difference_ms
        starts: set[int] = set()
        left_agg: list[Any] | None = None
        right_agg: list[Any] | None = None
        left_created = right_created = False
        previous_ts: int | None = None
        for start, window in self._fetch(store, key, max(0, t - 2 * d), t + 1, reverse=True):
            starts.add(start)
            end = start + d
            max_ts = window[1]
            if start == t + 1:
                right_created = True
            elif end > t:
                if right_agg is None:
                    right_agg = window
                self._update(ctx, store, key, value, start, window, close_time, t)
            elif end == t:
                left_created = True
                self._update(ctx, store, key, value, start, window, close_time, t)
                if max_ts < t:
                    previous_ts = max_ts
                else:
                    return
            else:
                left_agg = window
                previous_ts = max_ts
                break
        if previous_ts is not None:
            right_start = previous_ts + 1
            if right_start not in starts and right_start + d >= t:
                self._update(ctx, store, key, value, right_start, [self.initializer(), t],
                             close_time, t)
        if not left_created:
            if previous_ts is not None and t - d <= previous_ts and left_agg is not None:
                window = [left_agg[0], t]
            else:
                window = [self.initializer(), t]
            self._update(ctx, store, key, value, t - d, window, close_time, t)
        if not right_created and right_agg is not None and right_agg[1] > t:
            self._create_right(ctx, store, key, t, right_agg)

    def _process_early(self, ctx: ProcessorContext, store: KeyValueStore, key: Any,
                       value: Any, t: int, close_time: int) -> None:
        combined: tuple[int, list[Any]] | None = None
        right_agg: list[Any] | None = None
        right_created = False
        starts: set[int] = set()
        previous_ts: int | None = None
        for start, window in self._fetch(store, key, 0, t + 1, reverse=False):
            starts.add(start)
            if start == 0:
                combined = (start, window)
                if window[1] < t:
                    previous_ts = window[1]
            elif start <= t:
                right_agg = window
                self._update(ctx, store, key, value, start, window, close_time, t)
            else:
                right_created = True
        if right_agg is None and combined is not None and combined[1][1] > t:
            right_agg = combined[1]
        if not right_created and right_agg is not None and right_agg[1] > t:
            self._create_right(ctx, store, key, t, right_agg)
        if previous_ts is not None and previous_ts + 1 not in starts:
            self._update(ctx, store, key, value, previous_ts + 1, [self.initializer(), t],
                         close_time, t)
        if combined is None:
            self._update(ctx, store, key, value, 0, [self.initializer(), t], close_time, t)
        else:
            self._update(ctx, store, key, value, 0, combined[1], close_time, t)

    def _create_right(self, ctx: ProcessorContext, store: KeyValueStore, key: Any, t: int,
                      window: list[Any]) -> None:
        start = t + 1
        store.put((key, start), window)
        ctx.timestamp_ms = window[1]
        self.forward(ctx, Windowed(key, start, start + self.windows.time_difference_ms),
                     window[0])

    def _update(self, ctx: ProcessorContext, store: KeyValueStore, key: Any, value: Any,
                start: int, window: list[Any], close_time: int, t: int) -> None:
        end = start + self.windows.time_difference_ms
        if end < close_time:
            ctx.drop_late(self.name, self.store, start, end, self.windows.grace_ms,
                          end_included=True)
            return
        aggregate = self.aggregator(key, value, window[0])
        timestamp = max(t, window[1])
        store.put((key, start), [aggregate, timestamp])
        ctx.timestamp_ms = timestamp
        self.forward(ctx, Windowed(key, start, end), aggregate)

    def purge(self, ctx: ProcessorContext) -> int:
        """Delete windows no record can reach any more: a record is accepted up to ``d +
        grace`` behind stream time and looks ``2 d`` further back."""
        d = self.windows.time_difference_ms
        horizon = ctx.observed_ms.get(self.name, -1) - 3 * d - self.windows.grace_ms - 1
        if horizon <= 0 or not purge_due(ctx, self.name, horizon,
                                         (3 * d + self.windows.grace_ms) // 2):
            return 0
        store = ctx.store(self.store)
        expired = [k for k, _ in store.items() if k[1] < horizon]
        for key in expired:
            store.delete(key)
        return len(expired)
