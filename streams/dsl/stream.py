"""The DSL people write apps with: streams and tables over topics, and their operations.

Each operation adds a processor node to the app's topology. Changing the key (``map``,
``select_key``, ``flat_map``, ``group_by``) marks the stream; a stateful operation after that
goes through an internal repartition topic, which starts a new sub-topology, so that every
record of one key is processed by the same task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from statestore.serdes import BytesSerde, MsgPackSerde, Serde, StrSerde, serde_from_name
from streams.config import topic_name_problem
from streams.dsl.checks import check_arity, functions_checked
from streams.dsl.deprecated import DeprecatedTableOperations
from streams.dsl.fk_joins import (
    ForeignKeyJoin,
    ResponseNode,
    RightUpdateNode,
    SubscribeNode,
    SubscriptionNode,
)
from streams.dsl.joins import JoinWindows, StreamJoin, StreamJoinNode
from streams.dsl.metadata import HeadersPeekNode, TimestampExtractorNode, wants_headers
from streams.dsl.processors import (
    AggregateNode,
    BranchNode,
    CustomProcessorNode,
    FilterNode,
    FlatMapNode,
    MapNode,
    MapValuesNode,
    Node,
    PeekNode,
    Processor,
    ReduceNode,
    SinkNode,
    SourceNode,
    StoreDecl,
    StreamTableJoinNode,
    TableNode,
    WindowAggregateNode,
)
from streams.dsl.sessions import SessionAggregateNode, SessionWindows
from streams.dsl.sliding import SlidingAggregateNode, SlidingWindows
from streams.dsl.suppress import suppress_node
from streams.dsl.tables import (
    LEFT,
    RIGHT,
    TableAggregateNode,
    TableFilterNode,
    TableGroupByNode,
    TableJoinNode,
    TableJoinSide,
    TableMapValuesNode,
)
from streams.dsl.topology import TopicDecl, Topology, TopologyError
from streams.dsl.windows import HoppingWindows


@functions_checked
class Stream:
    """A stream of (key, value) records.

    Besides its node, a stream knows how its records are partitioned: the key serde of the
    topic it was read from (a key's partition is the murmur2 hash of its encoded bytes), and,
    when that topic is a repartition topic whose key serde nobody chose, the topic, so that a
    join after it can give it the joined table's key serde.
    """

    def __init__(self, topology: Topology, node: Node, key_changed: bool = False,
                 key_serde: Serde | None = None, open_repartition: str | None = None,
                 windowed_keys: bool = False) -> None:
        self._topology = topology
        self._node = node
        self._key_changed = key_changed
        self._key_serde = key_serde
        self._open_repartition = open_repartition
        #: Its keys are ``Windowed`` (a windowed table's updates), until a step sets new ones.
        self._windowed_keys = windowed_keys

    def _then(self, node: Node, key_changed: bool | None = None) -> Stream:
        self._node.add_child(node)
        changed = self._key_changed if key_changed is None else key_changed
        stream = self._like(node, changed)
        stream._windowed_keys = self._windowed_keys and not key_changed
        return stream

    def _like(self, node: Node, key_changed: bool) -> Stream:
        return Stream(self._topology, node, key_changed, self._key_serde,
                      self._open_repartition, self._windowed_keys)

    def _name(self, kind: str) -> str:
        return self._topology.node_name(kind)

    # -- stateless operations -------------------------------------------------------------

    def filter(self, predicate: Callable[[Any, Any], bool]) -> Stream:
        return self._then(FilterNode(self._name("filter"), predicate))

    def filter_not(self, predicate: Callable[[Any, Any], bool]) -> Stream:
        return self.filter(lambda k, v: not predicate(k, v))

    def map(self, fn: Callable[[Any, Any], tuple[Any, Any]]) -> Stream:
        """``fn(key, value) -> (new_key, new_value)``; marks the key as changed."""
        return self._then(MapNode(self._name("map"), fn), key_changed=True)

    def map_values(self, fn: Callable[[Any], Any]) -> Stream:
        return self._then(MapValuesNode(self._name("map-values"), fn))

    def flat_map(self, fn: Callable[[Any, Any], Iterable[tuple[Any, Any]]]) -> Stream:
        return self._then(FlatMapNode(self._name("flat-map"), fn), key_changed=True)

    def flat_map_values(self, fn: Callable[[Any], Iterable[Any]]) -> Stream:
        def expand(key: Any, value: Any) -> Iterable[tuple[Any, Any]]:
            values = fn(value)
            if isinstance(values, str | bytes):
                # Iterable, but surely not meant as one record per character.
                raise TypeError(f"flat_map_values: the function returned a "
                                f"{type(values).__name__} ({values!r:.40}), not a list of "
                                f"values: return [value] for one record")
            return ((key, v) for v in values)

        return self._then(FlatMapNode(self._name("flat-map-values"), expand))

    def select_key(self, fn: Callable[[Any, Any], Any]) -> Stream:
        return self._then(
            MapNode(self._name("select-key"), lambda k, v: (fn(k, v), v)), key_changed=True
        )

    def foreach(self, fn: Callable[..., None]) -> None:
        """``fn(key, value)`` (or ``fn(key, value, headers)``) for each record, for its side
        effect; nothing follows (Kafka Streams' ``KStream.foreach``)."""
        self._peek("foreach", fn)

    def peek(self, fn: Callable[..., None]) -> Stream:
        """``fn(key, value)``, or ``fn(key, value, headers)`` to read the record's headers,
        for its side effect; the record goes on unchanged."""
        return self._peek("peek", fn)

    def _peek(self, kind: str, fn: Callable[..., None]) -> Stream:
        if wants_headers(fn):
            return self._then(HeadersPeekNode(self._name(kind), fn))
        return self._then(PeekNode(self._name(kind), fn))

    def branch(self, *predicates: Callable[[Any, Any], bool]) -> list[Stream]:
        """One stream per predicate; a record goes to the first branch whose predicate holds."""
        if not predicates:
            raise TopologyError("branch() needs at least one predicate")
        node = BranchNode(self._name("branch"), list(predicates))
        self._node.add_child(node)
        return [self._like(b, self._key_changed) for b in node.branches]

    def merge(self, other: Stream) -> Stream:
        merged = Node(self._name("merge"))
        self._node.add_child(merged)
        other._node.add_child(merged)
        return self._like(merged, self._key_changed or other._key_changed)

    def to(
        self,
        topic: str | TopicDecl,
        key_serde: str | Serde | None = None,
        value_serde: str | Serde | None = None,
    ) -> None:
        """Write to ``topic`` (the app does not create it unless it was declared with
        ``app.topic(name, partitions=N)``); serdes default to the topic's declared ones."""
        name = topic_name(topic)
        keys, values = self._topology.serdes_for(name, key_serde, value_serde)
        if self._windowed_keys and isinstance(keys, StrSerde | BytesSerde):
            # Caught here rather than as one dead letter per record, each update lost.
            raise TopologyError(
                f"to({name!r}): the keys here are Windowed (a windowed table's updates), which "
                f"the {type(keys).__name__} cannot write; write them with key_serde='msgpack', "
                f"'json' or 'windowed' (as [key, start_ms, end_ms]), or set plain keys first: "
                f".map(lambda w, v: (w.key, v))")
        self._node.add_child(SinkNode(self._name("sink"), name, keys, values))

    def repartition(
        self,
        partitions: int | None = None,
        key_serde: str | Serde | None = None,
        value_serde: str | Serde | None = None,
        *,
        name: str | None = None,
    ) -> Stream:
        """Write the stream to an internal topic and read it back, with ``partitions``
        partitions (by default what the step after it needs: a joined table's count).

        ``key_serde`` encodes the keys in that topic, and so picks each key's partition (the
        murmur2 hash of its bytes): by default the key serde of the table the stream is then
        joined with, else msgpack. ``value_serde``: msgpack by default. ``name``: the topic
        is ``<app>-<name>-repartition`` (Kafka Streams' ``Repartitioned.as``), so that steps
        added before it in a later version do not rename it."""
        if partitions is not None and partitions < 1:
            raise TopologyError(f"repartition(partitions=...) must be >= 1, not {partitions}")
        return self._repartitioned("repartition", partitions, key_serde, value_serde,
                                   named=_checked_name(name))

    def process(
        self, factory: Callable[[], Processor], stores: Iterable[str | StoreDecl] = ()
    ) -> Stream:
        """Run a custom processor (an object with ``init(context)`` and ``process(k, v)``),
        one instance per task; ``stores`` are created for it and reached by
        ``context.store(name)``."""
        names = []
        for store in stores:
            decl = store if isinstance(store, StoreDecl) else StoreDecl(store)
            self._topology.declare_store(decl)
            names.append(decl.name)
        source = self._repartitioned("process") if names and self._key_changed else self
        return source._then(CustomProcessorNode(self._name("processor"), factory, names))

    def to_table(self, store: str | None = None) -> Table:
        """The stream read as a table: the latest value per key, in ``store`` (named after the
        node when not given); a None value deletes its key."""
        source = self._repartitioned("to-table") if self._key_changed else self
        name = self._name("to-table")
        store = store or f"{name}-store"
        self._topology.declare_store(StoreDecl.timestamped(store))
        return Table(source._then(TableNode(name, store)), store)

    # -- joins and grouping ---------------------------------------------------------------

    def join(self, other: Table | Stream | Any, joiner: Callable[..., Any],
             windows: JoinWindows | Callable[..., Any] | None = None, *,
             name: str | None = None) -> Stream:
        """Inner join on the key. With a table, ``join(table, joiner)``: each record with the
        table's current value. With a stream, ``join(stream, joiner, JoinWindows(...))``:
        each pair of records within the window. With a global table,
        ``join(global_table, key_selector, joiner)``: ``key_selector(key, value)`` picks the
        row. ``joiner(value, other_value)``. ``name`` names the join's stores and
        repartition topics (Kafka Streams' ``StreamJoined.withName``), so that steps added
        before it in a later version do not rename them."""
        return self._dispatch_join(other, joiner, windows, "inner", _checked_name(name))

    def left_join(self, other: Table | Stream | Any, joiner: Callable[..., Any],
                  windows: JoinWindows | Callable[..., Any] | None = None, *,
                  name: str | None = None) -> Stream:
        """Like ``join``, and a record without a partner gives ``joiner(value, None)`` (with a
        stream, once its window closed)."""
        return self._dispatch_join(other, joiner, windows, "left", _checked_name(name))

    def outer_join(self, other: Stream, joiner: Callable[[Any, Any], Any],
                   windows: JoinWindows, *, name: str | None = None) -> Stream:
        """Stream-stream outer join: unmatched records of either side are emitted joined with
        None once their window closed."""
        if not isinstance(other, Stream):
            raise TopologyError("outer_join takes a stream (a table outer join is "
                                "Table.outer_join)")
        return self._dispatch_join(other, joiner, windows, "outer", _checked_name(name))

    def _dispatch_join(self, other: Any, fn: Callable[..., Any], extra: Any,
                       kind: str, named: str | None = None) -> Stream:
        call = f"Stream.{'join' if kind == 'inner' else f'{kind}_join'}()"
        if isinstance(other, Table):
            if extra is not None:
                # Kafka Streams' stream-table join takes no windows either: the record meets
                # the table's row of the moment.
                raise TopologyError(f"{call}: a stream-table join takes no {extra!r:.40}: each "
                                    f"record joins the table's current row; join(table, joiner)")
            check_arity(call, fn, 2, "joiner(value, table_value)")
            return self._join(other, fn, left=kind == "left", named=named)
        if isinstance(other, Stream):
            if not isinstance(extra, JoinWindows):
                raise TopologyError("a stream-stream join needs JoinWindows(before_ms, "
                                    "after_ms, grace_ms) as its third argument")
            check_arity(call, fn, 2, "joiner(value, other_value)")
            return self._stream_join(other, fn, extra, kind, named)
        join_global = getattr(other, "join_stream", None)
        if join_global is not None:
            if not callable(extra):
                raise TopologyError("a global table join is join(global_table, key_selector, "
                                    "joiner)")
            check_arity(call, fn, 2, "key_selector(key, value)")
            check_arity(call, extra, 2, "joiner(value, row)")
            return join_global(self, fn, extra, kind == "left")  # type: ignore[no-any-return]
        raise TopologyError(f"cannot join a stream with {type(other).__name__}")

    def _stream_join(self, other: Stream, joiner: Callable[[Any, Any], Any],
                     windows: JoinWindows, kind: str, named: str | None = None) -> Stream:
        topology = self._topology
        name = named or self._name(f"stream-{kind}-join")
        # Records without a key cross either side's repartition topic, as in Kafka Streams
        # (whose repartition topics filter nothing): the join counts their time, and a side
        # whose unmatched records are emitted answers them at once, with None (KIP-962).
        left = (self._repartitioned("join-left", requires_key=False,
                                    named=named and f"{named}-left")
                if self._key_changed else self)
        right = (other._repartitioned("join-right", requires_key=False,
                                      named=named and f"{named}-right")
                 if other._key_changed else other)
        stores = (f"{name}-left", f"{name}-right")
        outer_store = None if kind == "inner" else f"{name}-outer"
        for store in (*stores, *([outer_store] if outer_store else [])):
            topology.declare_store(StoreDecl(store))
        shared = StreamJoin(windows, joiner, stores, outer_store,
                            (kind != "inner", kind == "outer"))
        left_node = left._then(StreamJoinNode(f"{name}-this", shared, LEFT))
        right_node = right._then(StreamJoinNode(f"{name}-other", shared, RIGHT))
        merged = Node(f"{name}-merge")
        left_node._node.add_child(merged)
        right_node._node.add_child(merged)
        return Stream(topology, merged, key_serde=left._key_serde)

    def _join(self, table: Table, joiner: Callable[[Any, Any], Any], left: bool,
              named: str | None = None) -> Stream:
        # Both sides must put a key in the same partition: the stream's repartition topic
        # encodes keys as the table's topic does (a mismatch left is refused at start). A left
        # join answers records without a key too: they cross the repartition topic.
        if self._key_changed:
            source = self._repartitioned("join", key_serde=table.key_serde,
                                         requires_key=not left, named=named)
        else:
            source = self
            if self._open_repartition is not None and table.key_serde is not None:
                self._topology.set_repartition_key_serde(self._open_repartition,
                                                         table.key_serde)
        node = StreamTableJoinNode(self._name("join"), table._materialized(), joiner, left)
        result = source._then(node)
        self._topology.co_located.append((node, table._node))
        return result

    def group_by_key(
        self, key_serde: str | Serde | None = None, value_serde: str | Serde | None = None,
        *, name: str | None = None,
    ) -> GroupedStream:
        """Group by the current key. The serdes encode the repartition topic an aggregation
        of a re-keyed stream goes through (msgpack by default); ``name`` names it
        ``<app>-<name>-repartition`` (Kafka Streams' ``Grouped.as``)."""
        return GroupedStream(self, key_serde, value_serde, _checked_name(name))

    def group_by(
        self, fn: Callable[[Any, Any], Any],
        key_serde: str | Serde | None = None, value_serde: str | Serde | None = None,
        *, name: str | None = None,
    ) -> GroupedStream:
        """Group by ``fn(key, value)``: the records go through a repartition topic encoded
        with ``key_serde`` and ``value_serde`` (msgpack by default), named
        ``<app>-<name>-repartition`` with ``name`` (Kafka Streams' ``Grouped.as``)."""
        return GroupedStream(self.select_key(fn), key_serde, value_serde, _checked_name(name))

    def _repartitioned(
        self, purpose: str, partitions: int | None = None,
        key_serde: str | Serde | None = None, value_serde: str | Serde | None = None,
        requires_key: bool = True, named: str | None = None,
    ) -> Stream:
        """Write to an internal repartition topic and read it back in a new sub-topology.
        ``named``: the topic is ``<app>-<named>-repartition``, whatever steps come before it
        (else its name carries the step's number, which another step added upstream
        changes)."""
        app = self._topology.application_id
        name = f"{named}-repartition" if named else self._name(f"{purpose}-repartition")
        topic = f"{app}-{name}"
        if topic in self._topology.repartition_topics:
            raise TopologyError(f"repartition topic {topic} is named twice: names given to "
                                f"group_by, repartition and joins are unique")
        keys = serde_from_name(key_serde or "msgpack")
        values = serde_from_name(value_serde or "msgpack")
        sink = SinkNode(f"{name}-sink", topic, keys, values, requires_key=requires_key)
        self._node.add_child(sink)
        self._topology.repartition_topics.add(topic)
        if partitions is not None:
            self._topology.repartition_partitions[topic] = partitions
        source = SourceNode(f"{name}-source", topic, keys, values)
        self._topology.add_source(source)
        self._topology.repartition_nodes[topic] = (sink, source)
        return Stream(self._topology, source, key_changed=False, key_serde=keys,
                      open_repartition=None if key_serde is not None else topic)


@functions_checked
class GroupedStream:
    """A stream grouped by key, ready for an aggregation into a named store."""

    def __init__(self, stream: Stream, key_serde: str | Serde | None = None,
                 value_serde: str | Serde | None = None, name: str | None = None) -> None:
        self._stream = stream
        self._key_serde = key_serde
        self._value_serde = value_serde
        #: The repartition topic's name, when the grouping was given one.
        self._repartition_name = name

    def _prepared(self, store: str) -> Stream:
        self._stream._topology.declare_store(StoreDecl.timestamped(store))
        if self._stream._key_changed:
            return self._stream._repartitioned(store, key_serde=self._key_serde or "msgpack",
                                               value_serde=self._value_serde,
                                               named=self._repartition_name)
        return self._stream

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        store: str,
    ) -> Table:
        """``aggregator(key, value, aggregate) -> new aggregate``, kept per key in ``store``."""
        stream = self._prepared(store)
        node = AggregateNode(stream._name("aggregate"), store, initializer, aggregator)
        return Table(stream._then(node), store, stream._key_serde)

    def count(self, store: str) -> Table:
        return self.aggregate(lambda: 0, lambda _k, _v, n: n + 1, store)

    def reduce(self, reducer: Callable[[Any, Any], Any], store: str) -> Table:
        stream = self._prepared(store)
        return Table(stream._then(ReduceNode(stream._name("reduce"), store, reducer)), store,
                     stream._key_serde)

    def windowed_by(
        self, windows: HoppingWindows | SessionWindows | SlidingWindows
    ) -> WindowedStream:
        """Cut the grouped stream into time windows (tumbling, hopping, sliding) or sessions."""
        return WindowedStream(self, windows)


@functions_checked
class WindowedStream:
    """A grouped stream cut into time windows (by record timestamp). Its aggregations are
    tables keyed by ``Windowed(key, start, end)``, kept in a store keyed
    ``(key, window_start)``."""

    def __init__(self, grouped: GroupedStream,
                 windows: HoppingWindows | SessionWindows | SlidingWindows) -> None:
        self._grouped = grouped
        self._windows = windows

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        store: str,
        merger: Callable[[Any, Any, Any], Any] | None = None,
        *,
        retention_ms: int | timedelta | None = None,
    ) -> Table:
        """``aggregator(key, value, aggregate)`` per window; session windows also need
        ``merger(key, aggregate_a, aggregate_b)`` to merge two sessions a record bridges.
        ``retention_ms``: how long tumbling and hopping windows stay in the store, for
        queries of past windows (their size plus grace by default, the least it may be)."""
        windows = self._windows
        if isinstance(windows, SessionWindows) and merger is None:
            raise TopologyError("a session-windowed aggregate needs merger=fn(key, a, b): "
                                "a record that bridges two sessions merges their aggregates")
        retention = _window_retention(windows, retention_ms)
        stream = self._grouped._prepared(store)
        node: Node
        if isinstance(windows, SessionWindows):
            assert merger is not None
            node = SessionAggregateNode(stream._name("session-aggregate"), store, windows,
                                        initializer, aggregator, merger)
        elif isinstance(windows, SlidingWindows):
            node = SlidingAggregateNode(stream._name("sliding-aggregate"), store, windows,
                                        initializer, aggregator)
        else:
            window_node = WindowAggregateNode(
                stream._name("window-aggregate"), store, windows, initializer, aggregator
            )
            window_node.retention_ms = retention
            node = window_node
        return Table(stream._then(node), store, stream._key_serde, windows=windows)

    def count(self, store: str, *, retention_ms: int | timedelta | None = None) -> Table:
        return self.aggregate(lambda: 0, lambda _k, _v, n: n + 1, store,
                              merger=lambda _k, a, b: a + b, retention_ms=retention_ms)

    def reduce(self, reducer: Callable[[Any, Any], Any], store: str, *,
               retention_ms: int | timedelta | None = None) -> Table:
        sentinel: dict[str, Any] = {}

        def reduce_or_first(_key: Any, value: Any, current: Any) -> Any:
            return value if current is sentinel else reducer(current, value)

        def merge(_key: Any, a: Any, b: Any) -> Any:
            if a is sentinel:
                return b
            return a if b is sentinel else reducer(a, b)

        return self.aggregate(lambda: sentinel, reduce_or_first, store, merger=merge,
                              retention_ms=retention_ms)


@functions_checked
class Table(DeprecatedTableOperations):
    """The latest value per key, kept in a store (or, for a filtered or mapped table, derived
    from its parent's updates); its updates can be read as a stream. A None value is a
    tombstone: the key leaves the table.

    ``key_serde``: how the topic that partitions the table encodes its keys (a stream joined
    with it must encode them alike)."""

    def __init__(self, stream: Stream, store: str | None, key_serde: Serde | None = None,
                 windows: Any = None, knows_old_rows: bool | None = None) -> None:
        self._stream = stream
        self._node = stream._node
        self._topology = stream._topology
        self.store = store
        # A table read from a stream (``to_table``, an aggregation) is partitioned as the
        # stream was, by its keys encoded with the stream's key serde.
        self.key_serde = key_serde if key_serde is not None else stream._key_serde
        #: Its keys are ``Windowed``: a windowed aggregation's table, or one derived from it.
        self.windowed_keys = windows is not None
        #: The windows of a windowed aggregation's table (what suppression waits for).
        self.windows = windows
        #: Whether Kafka Streams would know a row's previous value here (its parent sends old
        #: values): a stored table, a table-table join, or a filter or mapping of one. A
        #: filter of such a table sends no tombstone for a row that was not in it.
        self.knows_old_rows = store is not None if knows_old_rows is None else knows_old_rows
        #: The filters between this table and the nearest point whose old rows are known
        #: (a foreign-key join's result): a re-grouping downstream makes them keep their rows,
        #: as it makes Kafka Streams materialize that point and send old values down.
        self.forgetful_filters: tuple[TableFilterNode, ...] = ()

    def to_stream(self) -> Stream:
        return Stream(self._topology, self._node, False, self.key_serde,
                      self._stream._open_repartition, self.windowed_keys)

    def _then(self, node: Node, store: str | None = None) -> Table:
        self._node.add_child(node)
        table = Table(Stream(self._topology, node), store,
                      knows_old_rows=store is not None or self.knows_old_rows)
        table.key_serde = self.key_serde
        table.windowed_keys = self.windowed_keys
        if store is None:
            table.forgetful_filters = self.forgetful_filters
        return table

    def _materialized(self) -> str:
        """The store holding this table's rows, added (named after the node) if it has none:
        a stream-table join reads it."""
        if self.store is None:
            store = f"{self._node.name}-store"
            if store not in self._topology.stores:
                self._topology.declare_store(StoreDecl.timestamped(store))
                self._node.add_child(TableNode(f"{self._node.name}-materialize", store))
            self.store = store
        return self.store

    def _maybe_stored(self, table: Table, store: str | None) -> Table:
        if store is None:
            return table
        self._topology.declare_store(StoreDecl.timestamped(store))
        return table._then(TableNode(self._topology.node_name("table-materialize"), store),
                           store)

    def filter(self, predicate: Callable[[Any, Any], bool], store: str | None = None) -> Table:
        """The rows for which ``predicate(key, value)`` holds; a row that stops passing is
        deleted (a tombstone). ``store``: keep the result in a store of that name."""
        return self._filtered("table-filter", predicate, True, store)

    def filter_not(self, predicate: Callable[[Any, Any], bool],
                   store: str | None = None) -> Table:
        return self._filtered("table-filter-not", predicate, False, store)

    def _filtered(self, kind: str, predicate: Callable[[Any, Any], bool], keep: bool,
                  store: str | None) -> Table:
        name = self._topology.node_name(kind)
        rows = None
        if self.knows_old_rows:
            rows = f"{name}-rows"
            self._topology.declare_store(StoreDecl(rows))
        node = TableFilterNode(name, predicate, keep, rows)
        filtered = self._then(node)
        if rows is None:
            filtered.forgetful_filters = (*self.forgetful_filters, node)
        return self._maybe_stored(filtered, store)

    def _send_old_values(self) -> None:
        """What a re-grouping asks of its parents: the filters above it keep which rows they
        hold, and send no tombstone for a row they never held."""
        for node in self.forgetful_filters:
            node.rows_store = f"{node.name}-rows"
            self._topology.declare_store(StoreDecl(node.rows_store))
        self.forgetful_filters = ()

    def map_values(self, fn: Callable[[Any], Any], store: str | None = None) -> Table:
        node = TableMapValuesNode(self._topology.node_name("table-map-values"), fn)
        return self._maybe_stored(self._then(node), store)

    def join(self, other: Table, joiner: Callable[[Any, Any], Any],
             store: str | None = None, *,
             foreign_key: Callable[[Any], Any] | None = None,
             name: str | None = None) -> Table:
        """Inner table-table join on the key, co-partitioned: ``joiner(left, right)`` for
        every key both hold, updated as either side changes. With ``foreign_key(value)``:
        the right row whose key the left row names (KIP-213), keyed by the left key; the
        tables need not be co-partitioned. ``name`` names a foreign-key join's stores and
        topics (``<app>-<name>-subscription-repartition``...), so that steps added before it
        in a later version do not rename them."""
        if foreign_key is not None:
            return self._foreign_key_join(other, foreign_key, joiner, False, store,
                                          _checked_name(name))
        return self._table_join(other, joiner, "inner", store)

    def left_join(self, other: Table, joiner: Callable[[Any, Any], Any],
                  store: str | None = None, *,
                  foreign_key: Callable[[Any], Any] | None = None,
                  name: str | None = None) -> Table:
        if foreign_key is not None:
            return self._foreign_key_join(other, foreign_key, joiner, True, store,
                                          _checked_name(name))
        return self._table_join(other, joiner, "left", store)

    def _foreign_key_join(self, other: Table, foreign_key: Callable[[Any], Any],
                          joiner: Callable[[Any, Any], Any], left: bool,
                          store: str | None, named: str | None = None) -> Table:
        topology = self._topology
        name = named or topology.node_name("fk-join")
        join = ForeignKeyJoin(foreign_key, joiner, left, f"{name}-rows",
                              f"{name}-subscriptions", other._materialized())
        topology.declare_store(StoreDecl(join.rows_store))
        topology.declare_store(StoreDecl(join.subscriptions_store))
        subscribe = SubscribeNode(f"{name}-subscribe", join)
        self._node.add_child(subscribe)
        # Keyed as the right table's topic is, so that a foreign key reaches its row's task.
        subscriptions = Stream(topology, subscribe)._repartitioned(
            f"{name}-subscription", key_serde=other.key_serde or MsgPackSerde(),
            named=named and f"{named}-subscription")
        answer = subscriptions._then(SubscriptionNode(f"{name}-answer", join))
        right_update = RightUpdateNode(f"{name}-right-update", join)
        other._node.add_child(right_update)
        answers = Node(f"{name}-answers")
        answer._node.add_child(answers)
        right_update.add_child(answers)
        responses = Stream(topology, answers)._repartitioned(
            f"{name}-response", key_serde=self.key_serde or MsgPackSerde(),
            named=named and f"{named}-response")
        result = Table(responses._then(ResponseNode(f"{name}-result", join)), None)
        result.key_serde = self.key_serde
        return self._maybe_stored(result, store)

    def outer_join(self, other: Table, joiner: Callable[[Any, Any], Any],
                   store: str | None = None) -> Table:
        return self._table_join(other, joiner, "outer", store)

    def _table_join(self, other: Table, joiner: Callable[[Any, Any], Any], kind: str,
                    store: str | None) -> Table:
        topology = self._topology
        name = topology.node_name(f"table-{kind}-join")
        rows = f"{name}-rows"
        topology.declare_store(StoreDecl(rows))
        shared = TableJoinSide(rows, joiner, kind)
        left = TableJoinNode(f"{name}-left", shared, LEFT)
        right = TableJoinNode(f"{name}-right", shared, RIGHT)
        self._node.add_child(left)
        other._node.add_child(right)
        merged = Node(f"{name}-merge")
        left.add_child(merged)
        right.add_child(merged)
        # Both tables are partitioned alike (the topology refuses them otherwise): the result is
        # partitioned as the left one is.
        return self._maybe_stored(Table(Stream(topology, merged), None, self.key_serde,
                                        knows_old_rows=True), store)

    def group_by(self, selector: Callable[[Any, Any], tuple[Any, Any]], *,
                 name: str | None = None) -> GroupedTable:
        """Re-group the table: ``selector(key, value) -> (new_key, new_value)``; then
        ``count``, ``reduce`` or ``aggregate`` with an adder and a subtractor. ``name``
        names the repartition topic ``<app>-<name>-repartition``."""
        return GroupedTable(self, selector, _checked_name(name))

    def suppress(self, *, until_window_closes: bool = False, time_limit_ms: int | None = None,
                 max_records: int | None = None, store: str | None = None) -> Table:
        """Hold the table's updates back: ``until_window_closes`` emits one final result per
        window of a windowed table once stream time passes its end plus grace;
        ``time_limit_ms`` / ``max_records`` emit a key's latest update once it has waited
        that long or the buffer holds more keys. The buffer is a store with a changelog."""
        node = suppress_node(self, until_window_closes, time_limit_ms, max_records, store)
        return Table(Stream(self._topology, node), None, self.key_serde, windows=self.windows,
                     knows_old_rows=self.knows_old_rows)


@functions_checked
class GroupedTable:
    """A table re-grouped by ``selector``, ready for an aggregation with a subtractor."""

    def __init__(self, table: Table,
                 selector: Callable[[Any, Any], tuple[Any, Any]],
                 name: str | None = None) -> None:
        self._table = table
        self._selector = selector
        self._repartition_name = name

    def aggregate(
        self,
        initializer: Callable[[], Any],
        adder: Callable[[Any, Any, Any], Any],
        subtractor: Callable[[Any, Any, Any], Any],
        store: str,
    ) -> Table:
        """``adder(key, value, aggregate)`` adds a row to its group, ``subtractor(key, value,
        aggregate)`` takes it out when it changes or leaves the group."""
        return self._aggregated(initializer, adder, subtractor, store)

    def count(self, store: str) -> Table:
        return self._aggregated(lambda: 0, lambda _k, _v, n: n + 1, lambda _k, _v, n: n - 1,
                                store)

    def reduce(self, adder: Callable[[Any, Any], Any], subtractor: Callable[[Any, Any], Any],
               store: str) -> Table:
        """``adder(aggregate, value)``, ``subtractor(aggregate, value)``."""
        return self._aggregated(None, lambda _k, v, agg: adder(agg, v),
                                lambda _k, v, agg: subtractor(agg, v), store)

    def _aggregated(self, initializer: Callable[[], Any] | None,
                    adder: Callable[[Any, Any, Any], Any],
                    subtractor: Callable[[Any, Any, Any], Any], store: str) -> Table:
        table = self._table
        table._send_old_values()
        topology = table._topology
        prior = f"{store}-prior"
        topology.declare_store(StoreDecl(prior))
        topology.declare_store(StoreDecl.timestamped(store))
        regroup = TableGroupByNode(topology.node_name("table-group-by"), prior, self._selector)
        table._node.add_child(regroup)
        stream = Stream(topology, regroup)._repartitioned(store, named=self._repartition_name)
        node = TableAggregateNode(stream._name("table-aggregate"), store, initializer, adder,
                                  subtractor)
        return Table(stream._then(node), store)


def _window_retention(windows: Any, retention_ms: int | timedelta | None) -> int:
    """How long windows stay in their store: ``retention_ms``, which tumbling and hopping
    windows take, at least their size plus grace (0: that default)."""
    if retention_ms is None:
        return 0
    if not isinstance(windows, HoppingWindows):
        raise TopologyError(f"retention_ms= applies to tumbling and hopping windows, not "
                            f"{type(windows).__name__}")
    if isinstance(retention_ms, timedelta):
        retention_ms = retention_ms // timedelta(milliseconds=1)
    if not isinstance(retention_ms, int) or isinstance(retention_ms, bool) or (
            retention_ms < windows.retention_ms):
        raise TopologyError(f"retention_ms={retention_ms!r}: windows are kept at least their "
                            f"size plus grace ({windows.retention_ms} ms here)")
    return retention_ms


def _checked_name(name: str | None) -> str | None:
    """A name given to a step whose internal topics and stores it names: a legal part of a
    topic name."""
    if name is None:
        return None
    if not isinstance(name, str) or not name or topic_name_problem(name):
        raise TopologyError(f"name={name!r}: a step's name becomes part of topic names: "
                            f"use ASCII letters, digits, '.', '_' and '-'")
    return name


def topic_name(topic: str | TopicDecl) -> str:
    """The name of ``topic``; a :class:`TopologyError` for anything but a name or a declared
    topic (a function, as Kafka Streams' per-record topic choice, is not supported)."""
    if isinstance(topic, TopicDecl):
        return topic.name
    if isinstance(topic, str):
        return topic
    hint = (" (a topic chosen per record, as Kafka Streams' TopicNameExtractor, is not "
            "supported: send each kind of record to its own topic with branch())"
            if callable(topic) else "")
    raise TopologyError(f"a topic is named by a str or app.topic(...), not "
                        f"{type(topic).__name__} {topic!r:.60}{hint}")


def stream_from_topic(
    topology: Topology, topic: str | TopicDecl,
    key_serde: str | Serde | None = None, value_serde: str | Serde | None = None,
    timestamp: Callable[[Any, Any, int], int] | None = None,
) -> Stream:
    name = topic_name(topic)
    keys, values = topology.serdes_for(name, key_serde, value_serde)
    source = SourceNode(topology.node_name("source"), name, keys, values)
    topology.add_source(source)
    if timestamp is not None:
        extractor = TimestampExtractorNode(topology.node_name("timestamp-extractor"), timestamp)
        source.add_child(extractor)
        return Stream(topology, extractor, key_serde=keys)
    return Stream(topology, source, key_serde=keys)


def table_from_topic(
    topology: Topology, topic: str | TopicDecl, store: str,
    key_serde: str | Serde | None = None, value_serde: str | Serde | None = None,
) -> Table:
    name = topic_name(topic)
    keys, values = topology.serdes_for(name, key_serde, value_serde)
    source = SourceNode(topology.node_name("table-source"), name, keys, values)
    topology.add_source(source)
    topology.declare_store(StoreDecl.timestamped(store))
    node = TableNode(topology.node_name("table"), store)
    source.add_child(node)
    return Table(Stream(topology, node, key_serde=keys), store, keys)
