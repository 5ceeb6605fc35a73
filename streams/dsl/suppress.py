"""Suppression: a table's updates held back in a buffer, emitted as final results once their
window closed, or rate-limited by a time limit and a size.

Kafka Streams' semantics (KTableSuppressProcessor):

- ``until_window_closes``: an update of window ``w`` waits until stream time reaches
  ``w.end + grace`` (``+ gap`` too for sessions, whose end is inclusive); then the window's
  latest value is emitted, once. Tombstones (sessions retracted by a merge) are dropped.
- ``time_limit_ms`` / ``max_records``: a key's first buffered update waits until stream time
  passes its timestamp plus the limit, then its latest value is emitted (tombstones too); a
  later update of a buffered key keeps its place. When the buffer holds more than
  ``max_records`` keys the oldest is emitted early.

The buffer is a store with a changelog, keyed ``("v", key)`` for the latest update and
``("i", buffer_time, key)`` for the order of emission, so that it survives restarts and moves
with its task. Stream time is the largest timestamp the node has seen, kept with the task's
state (Kafka Streams' observed stream time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statestore.store import KeyValueStore
from streams.dsl.processors import Node, ProcessorContext, StoreDecl, _has_key
from streams.dsl.topology import TopologyError
from streams.dsl.windows import Windowed

if TYPE_CHECKING:
    from streams.dsl.stream import Table

_COUNT_KEY = ("n",)


def _store_key(key: Any) -> tuple[Any, ...]:
    if isinstance(key, Windowed):
        return ("w", key.key, key.start, key.end)
    return ("k", key)


def _key_of(stored: tuple[Any, ...] | list[Any]) -> Any:
    if stored[0] == "w":
        inner = stored[1]
        return Windowed(tuple(inner) if isinstance(inner, list) else inner, stored[2], stored[3])
    return stored[1]


class SuppressNode(Node):
    def __init__(self, name: str, store: str, *, final: bool, close_after_ms: int,
                 max_records: int | None) -> None:
        super().__init__(name)
        self.store = store
        self.final = final
        #: How long after its buffer time an entry is emitted.
        self.close_after_ms = close_after_ms
        self.max_records = max_records

    def store_names(self) -> list[str]:
        return [self.store]

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if not _has_key(self, ctx, key, "suppression"):
            return
        store = ctx.store(self.store)
        stream_time = max(ctx.observed_ms.get(self.name, -1), ctx.timestamp_ms)
        ctx.observed_ms[self.name] = stream_time
        if self.final:
            if not isinstance(key, Windowed):
                raise TypeError(f"{self.name}: until_window_closes needs a windowed key")
            buffer_time = key.end
        else:
            buffer_time = ctx.timestamp_ms
        state = self._state(ctx, store)
        skey = _store_key(key)
        held = store.get(("v", *skey))
        if held is None:
            store.put(("i", buffer_time, *skey), 1)
            state.count += 1
            if state.floor is None or buffer_time < state.floor:
                state.floor = buffer_time
            if self.max_records is not None:
                store.put(_COUNT_KEY, state.count)
        else:
            buffer_time = held[0]  # a buffered key keeps its place
        store.put(("v", *skey), [buffer_time, value, ctx.timestamp_ms])
        expiry = stream_time - self.close_after_ms
        over = self.max_records is not None and state.count > self.max_records
        if state.floor is not None and (state.floor <= expiry or over):
            self._evict(ctx, store, state, expiry)

    def _state(self, ctx: ProcessorContext, store: KeyValueStore) -> _BufferState:
        state = ctx.node_state.get(self.name)
        if state is None:
            first = next(store.prefix(("i",)), None)
            state = _BufferState(None if first is None else first[0][1],
                                 store.get(_COUNT_KEY, 0))
            ctx.node_state[self.name] = state
        return state

    def _evict(self, ctx: ProcessorContext, store: KeyValueStore, state: _BufferState,
               expiry: int) -> None:
        previous = ctx.timestamp_ms
        floor = state.floor
        assert floor is not None
        over = self.max_records is not None and state.count > self.max_records
        # Only the due entries are scanned, unless the buffer is over its size: then the
        # oldest go whatever their time. What is left starts after ``expiry`` at the
        # earliest (a lower bound is all ``floor`` promises).
        upper = ("j",) if over else ("i", expiry + 1)
        try:
            state.floor = expiry + 1
            for index_key, _ in store.range(("i", floor), upper):
                over = self.max_records is not None and state.count > self.max_records
                if index_key[1] > expiry and not over:
                    state.floor = index_key[1]
                    break
                skey = tuple(index_key[2:])
                held = store.get(("v", *skey))
                store.delete(index_key)
                store.delete(("v", *skey))
                state.count -= 1
                if held is None:
                    continue
                _, value, timestamp = held
                if value is None and self.final:
                    continue  # a retracted session: its final result is its merged one
                ctx.timestamp_ms = timestamp
                self.forward(ctx, _key_of(skey), value)
        finally:
            ctx.timestamp_ms = previous
            if self.max_records is not None:
                store.put(_COUNT_KEY, state.count)


@dataclass
class _BufferState:
    """A task's view of its buffer, kept in memory: no entry has a buffer time below
    ``floor`` (None: empty), and how many keys it holds."""

    floor: int | None
    count: int


def suppress_node(table: Table, until_window_closes: bool, time_limit_ms: int | None,
                  max_records: int | None, store: str | None) -> SuppressNode:
    """The node of ``table.suppress(...)`` (see :meth:`streams.dsl.stream.Table.suppress`),
    its buffer store declared and the node added under the table's."""
    topology = table._topology
    if until_window_closes:
        if time_limit_ms is not None or max_records is not None:
            raise TopologyError("suppress(until_window_closes=True) takes no time_limit_ms or "
                                "max_records: it holds every window until it closes")
        windows = table.windows
        if windows is None:
            raise TopologyError("suppress(until_window_closes=True) needs a windowed table "
                                "(an aggregation after windowed_by)")
        # Time windows close at end + grace; sessions and sliding windows say their own.
        close_after = getattr(windows, "close_after_ms", None)
        if close_after is None:
            close_after = windows.grace_ms
    else:
        if time_limit_ms is None and max_records is None:
            raise TopologyError("suppress() needs until_window_closes=True, or time_limit_ms "
                                "and/or max_records")
        if time_limit_ms is not None and time_limit_ms < 0:
            raise TopologyError(f"suppress(time_limit_ms=...) must be >= 0, not {time_limit_ms}")
        if max_records is not None and max_records < 1:
            raise TopologyError(f"suppress(max_records=...) must be >= 1, not {max_records}")
        # Without a time limit only the size bounds the wait.
        close_after = (1 << 62) if time_limit_ms is None else time_limit_ms
    name = topology.node_name("suppress")
    store = store or f"{name}-buffer"
    topology.declare_store(StoreDecl(store))
    node = SuppressNode(name, store, final=until_window_closes, close_after_ms=close_after,
                        max_records=max_records)
    table._node.add_child(node)
    return node
