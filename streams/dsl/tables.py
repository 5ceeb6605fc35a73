"""Processors of tables as first-class values: filter, map_values, table-table joins and the
re-grouping of a table (``group_by`` then an aggregation with an adder and a subtractor).

A table's updates travel as ``(key, value)``, a None value being a tombstone (a delete), as in
Kafka Streams without ``sendOldValues``. Where an operation needs what a row held before (the
old value a re-grouping subtracts, the other side of a join), it keeps it in a store of its
own with a changelog, so that restore and migration treat it like any other state; Kafka
Streams reads the parent's store through value getters instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streams.dsl.processors import Node, ProcessorContext, _has_key, stamped
from streams.dsl.windows import row_key

#: The two sides of a table-table join in its store's keys.
LEFT, RIGHT = 0, 1


def prepare_children(node: Node, ctx: ProcessorContext, key: Any, value: Any) -> None:
    """Pass an update ahead to the table-table joins below ``node`` (see
    ``Node._forward_to_all``)."""
    for child in node.children:
        prepare = getattr(child, "prepare", None)
        if prepare is not None:
            prepare(ctx, key, value)


class TableFilterNode(Node):
    """Forwards the rows that pass, and a tombstone for those that do not (a row that stops
    passing leaves the filtered table).

    With ``rows_store`` (where Kafka Streams' filter gets old values from its parent) it
    keeps which keys the filtered table holds, and sends no tombstone for a key it does not
    hold; without, every row that does not pass gives a tombstone, as in Kafka Streams."""

    def __init__(self, name: str, predicate: Callable[[Any, Any], bool], keep: bool,
                 rows_store: str | None = None) -> None:
        super().__init__(name)
        self.predicate = predicate
        self.keep = keep
        self.rows_store = rows_store

    def store_names(self) -> list[str]:
        return [] if self.rows_store is None else [self.rows_store]

    def prepare(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        """Pass an update on to the table-table joins below before it is processed."""
        if value is not None and bool(self.predicate(key, value)) != self.keep:
            value = None
        if (value is None and self.rows_store is not None and key is not None
                and ctx.store(self.rows_store).get(row_key(key)) is None):
            return  # process() forwards nothing either
        prepare_children(self, ctx, key, value)

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if value is not None and bool(self.predicate(key, value)) != self.keep:
            value = None
        if self.rows_store is not None and key is not None:
            rows = ctx.store(self.rows_store)
            held = rows.get(row_key(key)) is not None
            if value is None and not held:
                return  # not in the filtered table before, nor now
            if (value is not None) != held:
                rows.put(row_key(key), None if value is None else 1)
        self.forward(ctx, key, value)


class TableMapValuesNode(Node):
    """``fn(value)`` for each row; a tombstone stays a tombstone."""

    def __init__(self, name: str, fn: Callable[[Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def prepare(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        prepare_children(self, ctx, key, None if value is None else self.fn(value))

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        self.forward(ctx, key, None if value is None else self.fn(value))


class TableJoinSide:
    """What both sides of one table-table join share: the store holding each side's latest
    row and its timestamp, keyed ``(side, key)``, and how they join."""

    def __init__(self, store: str, joiner: Callable[[Any, Any], Any], kind: str) -> None:
        self.store = store
        self.joiner = joiner
        self.kind = kind  # "inner", "left" or "outer"


class TableJoinNode(Node):
    """One side of a table-table join (Kafka Streams' KTableKTableJoin family): an update of
    this side joins the other side's current row; the result's timestamp is the larger of
    the two rows'. An inner join holds a result where both sides hold a row, a left join
    where the left side does (``joiner(left, None)`` without a right row), an outer join
    where either does (None for the missing side). An update forwards the new result, or a
    tombstone where there is none; without the other side's row, only where a result existed
    (Kafka Streams cannot tell otherwise, and sends a tombstone for a row this side never
    held when the other side holds one)."""

    def __init__(self, name: str, shared: TableJoinSide, side: int) -> None:
        super().__init__(name)
        self.shared = shared
        self.side = side

    def store_names(self) -> list[str]:
        return [self.shared.store]

    def prepare(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        """Record this side's new row ahead of :meth:`process`, keeping the old one for it."""
        if key is None:
            return
        store = ctx.store(self.shared.store)
        pending = ctx.node_state.setdefault(f"{self.name}/prepared", {})
        if key not in pending:
            pending[key] = store.get((self.side, key))
        store.put((self.side, key), None if value is None else [value, ctx.timestamp_ms])

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if key is None:
            return  # a table row without a key joins nothing (Kafka Streams skips it)
        shared = self.shared
        store = ctx.store(shared.store)
        timestamp = ctx.timestamp_ms
        pending = ctx.node_state.get(f"{self.name}/prepared")
        # The row before this update (prepare() may have written the new one already).
        old_row = (pending.pop(key) if pending and key in pending
                   else store.get((self.side, key)))
        store.put((self.side, key), None if value is None else [value, timestamp])
        other_row = store.get((1 - self.side, key))
        other, other_ts = (None, -1) if other_row is None else other_row
        joined = self._joined(value, other)
        if (other is None and not joined
                and not (old_row is not None and self._joined(old_row[0], other))):
            # No result before, none now: nothing to update or delete. With the other
            # side's row there, Kafka Streams sends the update (a tombstone too) regardless.
            return
        if joined:
            left, right = (value, other) if self.side == LEFT else (other, value)
            result = shared.joiner(left, right)
        else:
            result = None
        previous = ctx.timestamp_ms
        ctx.timestamp_ms = max(timestamp, other_ts)
        try:
            self.forward(ctx, key, result)
        finally:
            ctx.timestamp_ms = previous

    def _joined(self, this: Any, other: Any) -> bool:
        """Whether the join holds a result for the key when this side holds ``this``."""
        kind = self.shared.kind
        if kind == "inner":
            return this is not None and other is not None
        if kind == "outer":
            return this is not None or other is not None
        return (this if self.side == LEFT else other) is not None


class TableGroupByNode(Node):
    """Re-keys a table's rows for a re-grouped aggregation: each update goes to the
    repartition topic as ``[new, old]`` pairs, the old row subtracted from its old group and
    the new one added to its new group (one record when the group stays, as Kafka Streams
    does since KIP-904). The rows' previous values live in its own store."""

    def __init__(self, name: str, store: str,
                 selector: Callable[[Any, Any], tuple[Any, Any]]) -> None:
        super().__init__(name)
        self.store = store
        self.selector = selector

    def store_names(self) -> list[str]:
        return [self.store]

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if key is None:
            return
        store = ctx.store(self.store)
        old = store.get(key)
        store.put(key, value)
        new_pair = None if value is None else self.selector(key, value)
        old_pair = None if old is None else self.selector(key, old)
        if new_pair is not None and old_pair is not None and new_pair[0] == old_pair[0]:
            if new_pair[0] is not None:
                self.forward(ctx, new_pair[0], [new_pair[1], old_pair[1]])
            return
        if old_pair is not None and old_pair[0] is not None:
            self.forward(ctx, old_pair[0], [None, old_pair[1]])
        if new_pair is not None and new_pair[0] is not None:
            self.forward(ctx, new_pair[0], [new_pair[1], None])


class TableAggregateNode(Node):
    """The aggregation of a re-grouped table: ``subtractor`` takes the old value out of its
    group, then ``adder`` puts the new one in (Kafka Streams' KTableAggregate); the update is
    stamped with the larger of its record's timestamp and the group's. ``reducer``
    mode (no initializer) starts a group from its first value and deletes a group that
    becomes None."""

    def __init__(
        self, name: str, store: str, initializer: Callable[[], Any] | None,
        adder: Callable[[Any, Any, Any], Any], subtractor: Callable[[Any, Any, Any], Any],
    ) -> None:
        super().__init__(name)
        self.store = store
        self.initializer = initializer
        self.adder = adder
        self.subtractor = subtractor

    def store_names(self) -> list[str]:
        return [self.store]

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if not _has_key(self, ctx, key, "a table aggregation"):
            return
        new, old = value
        store = ctx.store(self.store)
        stored = store.get_timestamped(key)
        # The larger of the update's timestamp and the group's, where the group exists
        # (Kafka Streams' KTableAggregate and KTableReduce, subtracting or adding).
        timestamp = stamped(stored, ctx.timestamp_ms)
        aggregate = None if stored is None else stored[1]
        if old is not None and aggregate is not None:
            aggregate = self.subtractor(key, old, aggregate)
        if new is not None:
            if aggregate is None:
                if self.initializer is None:
                    aggregate = new
                    new = None
                else:
                    aggregate = self.initializer()
            if new is not None:
                aggregate = self.adder(key, new, aggregate)
        store.put_timestamped(key, aggregate, timestamp)
        self.forward_at(ctx, key, aggregate, timestamp)
