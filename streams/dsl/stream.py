"""The DSL people write apps with: streams and tables over topics, and their operations.

Each operation adds a processor node to the app's topology. Changing the key (``map``,
``select_key``, ``flat_map``, ``group_by``) marks the stream; a stateful operation after that
goes through an internal repartition topic, which starts a new sub-topology, so that every
record of one key is processed by the same task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from statestore.serdes import Serde, serde_from_name
from streams.dsl.deprecated import DeprecatedTableOperations
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
from streams.dsl.topology import TopicDecl, Topology, TopologyError
from streams.dsl.windows import HoppingWindows


class Stream:
    """A stream of (key, value) records.

    Besides its node, a stream knows how its records are partitioned: the key serde of the
    topic it was read from (a key's partition is the murmur2 hash of its encoded bytes), and,
    when that topic is a repartition topic whose key serde nobody chose, the topic, so that a
    join after it can give it the joined table's key serde.
    """

    def __init__(self, topology: Topology, node: Node, key_changed: bool = False,
                 key_serde: Serde | None = None, open_repartition: str | None = None) -> None:
        self._topology = topology
        self._node = node
        self._key_changed = key_changed
        self._key_serde = key_serde
        self._open_repartition = open_repartition

    def _then(self, node: Node, key_changed: bool | None = None) -> Stream:
        self._node.add_child(node)
        changed = self._key_changed if key_changed is None else key_changed
        return self._like(node, changed)

    def _like(self, node: Node, key_changed: bool) -> Stream:
        return Stream(self._topology, node, key_changed, self._key_serde,
                      self._open_repartition)

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
            return ((key, v) for v in fn(value))

        return self._then(FlatMapNode(self._name("flat-map-values"), expand))

    def select_key(self, fn: Callable[[Any, Any], Any]) -> Stream:
        return self._then(
            MapNode(self._name("select-key"), lambda k, v: (fn(k, v), v)), key_changed=True
        )

    def peek(self, fn: Callable[[Any, Any], None]) -> Stream:
        return self._then(PeekNode(self._name("peek"), fn))

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
        self._node.add_child(SinkNode(self._name("sink"), name, keys, values))

    def repartition(
        self,
        partitions: int | None = None,
        key_serde: str | Serde | None = None,
        value_serde: str | Serde | None = None,
    ) -> Stream:
        """Write the stream to an internal topic and read it back, with ``partitions``
        partitions (by default what the step after it needs: a joined table's count).

        ``key_serde`` encodes the keys in that topic, and so picks each key's partition (the
        murmur2 hash of its bytes): by default the key serde of the table the stream is then
        joined with, else msgpack. ``value_serde``: msgpack by default."""
        if partitions is not None and partitions < 1:
            raise TopologyError(f"repartition(partitions=...) must be >= 1, not {partitions}")
        return self._repartitioned("repartition", partitions, key_serde, value_serde)

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

    # -- joins and grouping ---------------------------------------------------------------

    def join(self, table: Table, joiner: Callable[[Any, Any], Any]) -> Stream:
        """Inner stream-table join on the key: each record with the table's current value."""
        return self._join(table, joiner, left=False)

    def left_join(self, table: Table, joiner: Callable[[Any, Any], Any]) -> Stream:
        return self._join(table, joiner, left=True)

    def _join(self, table: Table, joiner: Callable[[Any, Any], Any], left: bool) -> Stream:
        # Both sides must put a key in the same partition: the stream's repartition topic
        # encodes keys as the table's topic does (a mismatch left is refused at start). A left
        # join answers records without a key too: they cross the repartition topic.
        if self._key_changed:
            source = self._repartitioned("join", key_serde=table.key_serde,
                                         requires_key=not left)
        else:
            source = self
            if self._open_repartition is not None and table.key_serde is not None:
                self._topology.set_repartition_key_serde(self._open_repartition,
                                                         table.key_serde)
        node = StreamTableJoinNode(self._name("join"), table.store, joiner, left)
        result = source._then(node)
        self._topology.co_located.append((node, table._node))
        return result

    def group_by_key(
        self, key_serde: str | Serde | None = None, value_serde: str | Serde | None = None,
    ) -> GroupedStream:
        """Group by the current key. The serdes encode the repartition topic an aggregation
        of a re-keyed stream goes through (msgpack by default)."""
        return GroupedStream(self, key_serde, value_serde)

    def group_by(
        self, fn: Callable[[Any, Any], Any],
        key_serde: str | Serde | None = None, value_serde: str | Serde | None = None,
    ) -> GroupedStream:
        """Group by ``fn(key, value)``: the records go through a repartition topic encoded
        with ``key_serde`` and ``value_serde`` (msgpack by default)."""
        return GroupedStream(self.select_key(fn), key_serde, value_serde)

    def _repartitioned(
        self, purpose: str, partitions: int | None = None,
        key_serde: str | Serde | None = None, value_serde: str | Serde | None = None,
        requires_key: bool = True,
    ) -> Stream:
        """Write to an internal repartition topic and read it back in a new sub-topology."""
        app = self._topology.application_id
        name = self._name(f"{purpose}-repartition")
        topic = f"{app}-{name}"
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


class GroupedStream:
    """A stream grouped by key, ready for an aggregation into a named store."""

    def __init__(self, stream: Stream, key_serde: str | Serde | None = None,
                 value_serde: str | Serde | None = None) -> None:
        self._stream = stream
        self._key_serde = key_serde
        self._value_serde = value_serde

    def _prepared(self, store: str) -> Stream:
        self._stream._topology.declare_store(StoreDecl(store))
        if self._stream._key_changed:
            return self._stream._repartitioned(store, key_serde=self._key_serde or "msgpack",
                                               value_serde=self._value_serde)
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

    def windowed_by(self, windows: HoppingWindows) -> WindowedStream:
        return WindowedStream(self, windows)


class WindowedStream:
    """A grouped stream cut into time windows (by record timestamp). Its aggregations are
    tables keyed by ``Windowed(key, start, end)``, kept in a store keyed
    ``(key, window_start)``."""

    def __init__(self, grouped: GroupedStream, windows: HoppingWindows) -> None:
        self._grouped = grouped
        self._windows = windows

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        store: str,
    ) -> Table:
        stream = self._grouped._prepared(store)
        node = WindowAggregateNode(
            stream._name("window-aggregate"), store, self._windows, initializer, aggregator
        )
        return Table(stream._then(node), store, stream._key_serde)

    def count(self, store: str) -> Table:
        return self.aggregate(lambda: 0, lambda _k, _v, n: n + 1, store)

    def reduce(self, reducer: Callable[[Any, Any], Any], store: str) -> Table:
        sentinel: dict[str, Any] = {}

        def reduce_or_first(_key: Any, value: Any, current: Any) -> Any:
            return value if current is sentinel else reducer(current, value)

        return self.aggregate(lambda: sentinel, reduce_or_first, store)


class Table(DeprecatedTableOperations):
    """The latest value per key, kept in a store; its updates can be read as a stream.

    ``key_serde``: how the topic that partitions the table encodes its keys (a stream joined
    with it must encode them alike)."""

    def __init__(self, stream: Stream, store: str, key_serde: Serde | None = None) -> None:
        self._stream = stream
        self._node = stream._node
        self.store = store
        self.key_serde = key_serde

    def to_stream(self) -> Stream:
        return self._stream._like(self._node, key_changed=False)


def topic_name(topic: str | TopicDecl) -> str:
    return topic.name if isinstance(topic, TopicDecl) else topic


def stream_from_topic(
    topology: Topology, topic: str | TopicDecl,
    key_serde: str | Serde | None = None, value_serde: str | Serde | None = None,
) -> Stream:
    name = topic_name(topic)
    keys, values = topology.serdes_for(name, key_serde, value_serde)
    source = SourceNode(topology.node_name("source"), name, keys, values)
    topology.add_source(source)
    return Stream(topology, source, key_serde=keys)


def table_from_topic(
    topology: Topology, topic: str | TopicDecl, store: str,
    key_serde: str | Serde | None = None, value_serde: str | Serde | None = None,
) -> Table:
    name = topic_name(topic)
    keys, values = topology.serdes_for(name, key_serde, value_serde)
    source = SourceNode(topology.node_name("table-source"), name, keys, values)
    topology.add_source(source)
    topology.declare_store(StoreDecl(store))
    node = TableNode(topology.node_name("table"), store)
    source.add_child(node)
    return Table(Stream(topology, node, key_serde=keys), store, keys)
