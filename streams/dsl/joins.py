"""Stream-stream joins: each side's records buffered in a window store with a changelog, a
record joined with the other side's records within the join window.

Kafka Streams' semantics (KStreamKStreamJoin, with KIP-633's fix for spurious results):

- a left record at ``t`` joins the right records of its key in ``[t - before, t + after]``
  (a right record at ``t`` the left ones in ``[t - after, t + before]``); each pair is
  emitted once, when its second record arrives, with the larger of the two timestamps;
- in a left (outer) join, a left (either) record that found no partner waits in the
  "outer" store until its window closes (the join's stream time, shared by both sides, past
  ``t + after + grace`` for a left record, ``t + before + grace`` for a right one); a later
  partner deletes it; once closed, it is emitted joined with None, with its own timestamp,
  in the store's order. A record whose window's end (``t + after`` for a left record, no
  grace) is already behind the join's stream time is emitted at once.
- the closed records are looked for when a record at the join's stream time arrives, and
  only if the smallest time Kafka Streams' time tracker keeps (the time of the last record
  put in the store, or where the previous look stopped) is past this side's ``after +
  grace``. Kafka Streams also throttles that look to once per
  ``__emit.interval.ms.kstreams.outer.join.spurious.results.fix__`` (1 s) of wall-clock
  time; Relay looks every time, as Kafka Streams does with that interval at 0.

Stores: ``<join>-left`` and ``<join>-right`` keyed ``(key, timestamp, offset, topic)`` (the
input offset and topic tell apart records of one key and time), and ``<join>-outer`` keyed
``(timestamp, side, negative, key, offset, topic)``, in Kafka Streams' order: by time, a right
record before a left one, then by key as its long serde's bytes sort (non-negative integers
before negative ones). Each side's window store keeps its own time, as Kafka Streams' does
(the largest timestamp put in it, not the join's): a record at ``t`` is joined only while
``t`` is past that time - ``before + after + grace``, and purged after.

Times: the join's stream time, each side's store time and the outer store's min time are
kept with the task's state (in its stores' input position, which their changelogs carry, so
learners and standbys get them too) and taken back when the task opens: a run through a
restart or a move gives what an uninterrupted run gives. Kafka Streams keeps its shared time
tracker in memory, from nothing at each start of a task, and rebuilds its window stores' time
only from the records it restores (see docs/kafka-streams.md). State written before the join
kept its times has them rebuilt that way: each side's time the largest timestamp its store
holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from streams.dsl.processors import Node, ProcessorContext, _has_key
from streams.dsl.sessions import purge_due
from streams.dsl.windows import whole_ms

LEFT, RIGHT = 0, 1
#: The side's rank in the outer store: Kafka Streams writes a right record's side as 0 and a
#: left one's as 1, so a right record comes first among those of one time.
_OUTER_RANK = (1, 0)
_OUTER_SIDE = {rank: side for side, rank in enumerate(_OUTER_RANK)}


def _observed(store: str) -> str:
    """The entry of a side's window store's own time in the task's observed times."""
    return f"{store}/observed"


def _min_time(outer_store: str) -> str:
    """The entry of the outer store's min time (Kafka Streams' ``minTime``) in the task's
    observed times: absent while it is unknown (Kafka Streams' ``Long.MAX_VALUE``)."""
    return f"{outer_store}/min-time"


def saved_join_times(join: StreamJoin, saved: Mapping[str, Sequence[int]]) -> dict[str, int] | None:
    """The join's times as the task's state recorded them, given each observed-time entry's
    values over the task's stores: the smallest of each (the state furthest behind, as for
    input offsets). None if the state holds none of the join's times (written before the
    join kept them, or before the join saw a record)."""
    shared = join.stores[0]
    if not saved.get(shared):
        return None
    entries = [shared, *(_observed(store) for store in join.stores)]
    if join.outer_store is not None:
        entries.append(_min_time(join.outer_store))
    return {entry: min(saved[entry]) for entry in entries if saved.get(entry)}


def held_join_times(join: StreamJoin, latest_held: Mapping[str, int]) -> dict[str, int]:
    """The join's times rebuilt from what its stores hold (``latest_held``: the largest
    timestamp in each store that holds any), for state that did not record them: each side's
    time the largest timestamp its store holds, as Kafka Streams' window store rebuilds its
    own from the records it restores; the join's stream time the largest of all. The min
    time stays unknown (the next look reads the outer store)."""
    times = {_observed(store): latest_held[store] for store in join.stores if store in latest_held}
    if latest_held:
        times[join.stores[0]] = max(latest_held.values())
    return times


def _segment(t: int, retention: int) -> int:
    """The segment of Kafka Streams' window store that holds ``t``: it takes a record
    unless the segment is older than the one of its time - retention, so it keeps records
    a little past retention (fetches do not return them)."""
    interval = max(retention // 2, 60_000)
    return t // interval if t >= 0 else -(-t // interval)  # Java's division: towards zero


def _outer_prefix(t: int, side: int, key: Any) -> tuple[Any, ...]:
    """The outer store's key prefix of ``key``'s records of ``side`` at ``t``."""
    return (t, _OUTER_RANK[side], isinstance(key, int) and key < 0, key)


@dataclass(frozen=True)
class JoinWindows:
    """A left record at ``t`` joins right records in ``[t - before_ms, t + after_ms]``;
    records are accepted ``grace_ms`` late. ``after_ms`` defaults to ``before_ms``."""

    before_ms: int
    after_ms: int | None = None
    grace_ms: int = 0

    def __post_init__(self) -> None:
        whole_ms(self, "before_ms", "after_ms", "grace_ms")
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
        retention = join.windows.retention_ms
        # Each side's window store also keeps its own time: the largest timestamp put in it
        # (a record with a key, its value None too), which decides what it still holds.
        this_observed = _observed(join.stores[self.side])
        if key is not None:
            ctx.observed_ms[this_observed] = max(ctx.observed_ms.get(this_observed, -1), t)
        if key is None or value is None:
            if join.outer[self.side] and key is None and value is not None:
                self._emit(ctx, None, value, t)  # nothing to join with: at once, as Kafka does
            elif key is None:
                _has_key(self, ctx, key, "this side of a stream-stream join")
            return  # Kafka Streams skips it (its time counted)
        this_store = ctx.store(join.stores[self.side])
        if _segment(t, retention) >= _segment(ctx.observed_ms[this_observed] - retention,
                                              retention):
            this_store.put((key, t, ctx.offset, ctx.topic), value)
        previous = ctx.timestamp_ms
        try:
            if t == stream_time and join.outer_store is not None:
                self._emit_closed(ctx, stream_time)
            other_store = ctx.store(join.stores[1 - self.side])
            matched = False
            outer = None if join.outer_store is None else ctx.store(join.outer_store)
            # The other store holds what its own time has not expired (Kafka Streams' window
            # store answers a fetch from its time - retention + 1 at the earliest).
            earliest = max(0, t - self.before,
                           ctx.observed_ms.get(_observed(join.stores[1 - self.side]), -1)
                           - retention + 1)
            for (_, other_t, *_), other in other_store.range(
                    (key, earliest), (key, max(earliest, max(0, t + self.after) + 1))):
                matched = True
                if outer is not None:
                    prefix = _outer_prefix(other_t, 1 - self.side, key)
                    for waiting, _ in list(outer.prefix(prefix)):
                        outer.delete(waiting)
                ctx.timestamp_ms = max(t, other_t)
                self._emit(ctx, key, value, ctx.timestamp_ms, other)
            if matched or not join.outer[self.side]:
                return
            # Kafka Streams emits it at once when its window's end, without the grace, is
            # behind the join's stream time.
            if outer is None or max(0, t + self.after) < stream_time:
                self._emit(ctx, key, value, t)
            else:
                min_time = _min_time(join.outer_store)
                ctx.observed_ms[min_time] = min(ctx.observed_ms.get(min_time, t), t)
                outer.put((*_outer_prefix(t, self.side, key), ctx.offset, ctx.topic), value)
        finally:
            ctx.timestamp_ms = previous

    def _emit(self, ctx: ProcessorContext, key: Any, value: Any, timestamp: int,
              other: Any = None) -> None:
        ctx.timestamp_ms = timestamp
        left, right = (value, other) if self.side == LEFT else (other, value)
        self.forward(ctx, key, self.join.joiner(left, right))

    def _emit_closed(self, ctx: ProcessorContext, stream_time: int) -> None:
        """Emit, in the store's order, the unmatched records whose window closed, as Kafka
        Streams' ``emitNonJoinedOuterRecords`` does (its emit interval at 0)."""
        join = self.join
        assert join.outer_store is not None
        grace = join.windows.grace_ms
        min_time_entry = _min_time(join.outer_store)
        # Absent when the store is empty, or its time unknown (state written before the join
        # kept it): then the store is read, as Kafka Streams' overflowing check does.
        min_time = ctx.observed_ms.get(min_time_entry)
        if min_time is not None and min_time + self.after + grace >= stream_time:
            return
        outer = ctx.store(join.outer_store)
        # A left record waits ``after`` for partners, a right one ``before``.
        wait = (join.windows.after, join.windows.before_ms)
        open_sides: set[int] = set()
        closed: list[tuple[Any, Any]] = []
        last_seen = None
        for stored_key, value in outer.items():
            t, side = stored_key[0], _OUTER_SIDE[stored_key[1]]
            last_seen = t
            if len(open_sides) == 2:
                break  # later records are open on both sides
            if t + wait[side] + grace >= stream_time:
                open_sides.add(side)
                continue
            closed.append((stored_key, value))
        if last_seen is None:
            ctx.observed_ms.pop(min_time_entry, None)
        else:
            ctx.observed_ms[min_time_entry] = last_seen
        for stored_key, value in closed:
            t, side, key = stored_key[0], _OUTER_SIDE[stored_key[1]], stored_key[3]
            outer.delete(stored_key)
            ctx.timestamp_ms = t
            left, right = (value, None) if side == LEFT else (None, value)
            key = tuple(key) if isinstance(key, list) else key
            self.forward(ctx, key, join.joiner(left, right))

    def restore_times(self, ctx: ProcessorContext, saved: Mapping[str, Sequence[int]]) -> None:
        """Take the join's times back from the task's restored state (``saved``: each
        observed-time entry's values over the task's stores), or, for state that did not
        record them, rebuild them from what the join's stores hold."""
        join = self.join
        if join.stores[0] in ctx.observed_ms:
            return  # the join's other side took them back
        times = saved_join_times(join, saved)
        if times is None:
            latest: dict[str, int] = {}
            for store in (*join.stores, *([join.outer_store] if join.outer_store else [])):
                # Window stores are keyed (key, time, ...), the outer store (time, ...).
                at = 0 if store == join.outer_store else 1
                held = [stored[at] for stored, _ in ctx.store(store).items()]
                if held:
                    latest[store] = max(held)
            times = held_join_times(join, latest)
        ctx.observed_ms.update(times)

    def purge(self, ctx: ProcessorContext) -> int:
        """Drop this side's buffered records past the join's retention."""
        retention = self.join.windows.retention_ms
        horizon = ctx.observed_ms.get(_observed(self.join.stores[self.side]), -1) - retention + 1
        if horizon <= 0 or not purge_due(ctx, self.name, horizon, retention // 2):
            return 0
        store = ctx.store(self.join.stores[self.side])
        expired = [k for k, _ in store.items() if k[1] < horizon]
        for key in expired:
            store.delete(key)
        return len(expired)
