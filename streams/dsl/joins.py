"""Stream-stream joins: each side's records buffered in a window store with a changelog, a
record joined with the other side's records within the join window.

Kafka Streams' semantics (KStreamKStreamJoin, with KIP-633's fix for spurious results):

- a left record at ``t`` joins the right records of its key in ``[t - before, t + after]``
  (a right record at ``t`` the left ones in ``[t - after, t + before]``); each pair is
  emitted once, when its second record arrives, with the larger of the two timestamps;
- in a left (outer) join, a left (either) record that found no partner waits in the
  "outer" store until its window closes (stream time past ``t + after + grace`` for a left
  record, ``t + before + grace`` for a right one); a later partner deletes it; once closed,
  it is emitted joined with None, with its own timestamp, in timestamp order. A record
  that arrives already closed is emitted at once.

Stores: ``<join>-left`` and ``<join>-right`` keyed ``(key, timestamp, offset, topic)`` (the
input offset and topic tell apart records of one key and time), and ``<join>-outer`` keyed
``(timestamp, side, key, offset, topic)`` so that the closed ones come first. Each window
store drops records past ``before + after + grace`` as stream time advances.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streams.dsl.processors import Node, ProcessorContext
from streams.dsl.sessions import purge_due

LEFT, RIGHT = 0, 1


@dataclass(frozen=True)
class JoinWindows:
    """A left record at ``t`` joins right records in ``[t - before_ms, t + after_ms]``;
    records are accepted ``grace_ms`` late. ``after_ms`` defaults to ``before_ms``."""

    before_ms: int
    after_ms: int | None = None
    grace_ms: int = 0

    def __post_init__(self) -> None:
        if self.after_ms is None:
            object.__setattr__(self, "after_ms", self.before_ms)
        if self.before_ms < 0 or self.after < 0:
            raise ValueError(f"join windows need before_ms and after_ms >= 0, not "
                             f"{self.before_ms} and {self.after_ms}")
        if self.before_ms + self.after <= 0:
            raise ValueError("a join window must have a size: before_ms + after_ms > 0")
        if self.grace_ms < 0:
            raise ValueError(f"join grace_ms must be >= 0, not {self.grace_ms}")

    @property
    def after(self) -> int:
        return int(self.after_ms or 0)

    @property
    def retention_ms(self) -> int:
        return self.before_ms + self.after + self.grace_ms


@dataclass
class StreamJoin:
    """What both sides of one stream-stream join share."""

    windows: JoinWindows
    joiner: Callable[[Any, Any], Any]
    stores: tuple[str, str]
    outer_store: str | None
    #: Per side: whether an unmatched record of that side is emitted with None.
    outer: tuple[bool, bool]


class StreamJoinNode(Node):
    """One side of a stream-stream join."""

    def __init__(self, name: str, join: StreamJoin, side: int) -> None:
        super().__init__(name)
        self.join = join
        self.side = side
        windows = join.windows
        # How far this side's record looks back and ahead on the other side.
        self.before, self.after = ((windows.before_ms, windows.after) if side == LEFT
                                   else (windows.after, windows.before_ms))

    def store_names(self) -> list[str]:
        join = self.join
        return [*join.stores, *([join.outer_store] if join.outer_store else [])]

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        join = self.join
        t = ctx.timestamp_ms
        # Both sides share the join's stream time (Kafka Streams' shared time tracker), which
        # every record reaching the join advances, the ones it skips too.
        stream_time = max(ctx.observed_ms.get(join.stores[0], -1), t)
        ctx.observed_ms[join.stores[0]] = stream_time
        if key is None or value is None:
            if join.outer[self.side] and key is None and value is not None:
                self._emit(ctx, None, value, t)  # nothing to join with: at once, as Kafka does
            return  # Kafka Streams skips it
        this_store = ctx.store(join.stores[self.side])
        if t >= stream_time - join.windows.retention_ms:
            this_store.put((key, t, ctx.offset, ctx.topic), value)
        previous = ctx.timestamp_ms
        try:
            if t == stream_time and join.outer_store is not None:
                self._emit_closed(ctx, stream_time)
            other_store = ctx.store(join.stores[1 - self.side])
            matched = False
            outer = None if join.outer_store is None else ctx.store(join.outer_store)
            for (_, other_t, *_), other in other_store.range(
                    (key, max(0, t - self.before)), (key, max(0, t + self.after) + 1)):
                matched = True
                if outer is not None:
                    for waiting, _ in list(outer.prefix((other_t, 1 - self.side, key))):
                        outer.delete(waiting)
                ctx.timestamp_ms = max(t, other_t)
                self._emit(ctx, key, value, ctx.timestamp_ms, other)
            if matched or not join.outer[self.side]:
                return
            if outer is None or t + self.after + join.windows.grace_ms < stream_time:
                self._emit(ctx, key, value, t)
            else:
                outer.put((t, self.side, key, ctx.offset, ctx.topic), value)
        finally:
            ctx.timestamp_ms = previous

    def _emit(self, ctx: ProcessorContext, key: Any, value: Any, timestamp: int,
              other: Any = None) -> None:
        ctx.timestamp_ms = timestamp
        left, right = (value, other) if self.side == LEFT else (other, value)
        self.forward(ctx, key, self.join.joiner(left, right))

    def _emit_closed(self, ctx: ProcessorContext, stream_time: int) -> None:
        """Emit, in time order, the unmatched records whose window closed."""
        join = self.join
        assert join.outer_store is not None
        outer = ctx.store(join.outer_store)
        grace = join.windows.grace_ms
        # A left record waits ``after`` for partners, a right one ``before``.
        wait = (join.windows.after, join.windows.before_ms)
        open_sides: set[int] = set()
        closed: list[tuple[Any, Any]] = []
        for stored_key, value in outer.items():
            t, side = stored_key[0], stored_key[1]
            if t + wait[side] + grace >= stream_time:
                open_sides.add(side)
                if len(open_sides) == 2:
                    break
                continue
            closed.append((stored_key, value))
        for stored_key, value in closed:
            t, side, key = stored_key[0], stored_key[1], stored_key[2]
            outer.delete(stored_key)
            ctx.timestamp_ms = t
            left, right = (value, None) if side == LEFT else (None, value)
            key = tuple(key) if isinstance(key, list) else key
            self.forward(ctx, key, join.joiner(left, right))

    def purge(self, ctx: ProcessorContext) -> int:
        """Drop this side's buffered records past the join's retention."""
        retention = self.join.windows.retention_ms
        horizon = ctx.observed_ms.get(self.join.stores[0], -1) - retention
        if horizon <= 0 or not purge_due(ctx, self.name, horizon, retention // 2):
            return 0
        store = ctx.store(self.join.stores[self.side])
        expired = [k for k, _ in store.items() if k[1] < horizon]
        for key in expired:
            store.delete(key)
        return len(expired)
