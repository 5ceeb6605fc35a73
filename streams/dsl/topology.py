"""The topology: the graph of processor nodes an app declares, split into sub-topologies at
repartition topics, with the partition count (hence the tasks) of each sub-topology.

A task is (sub-topology, partition), written ``"<sub-topology>_<partition>"``. All source
topics of one sub-topology must have the same number of partitions (co-partitioning): a
mismatch is an error at start.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from statestore.serdes import Serde, serde_from_name
from statestore.store import StoreSpec
from streams.config import topic_name_problem
from streams.dsl.errors import TopologyError
from streams.dsl.processors import Node, SinkNode, SourceNode, StoreDecl, TableNode


@dataclass(frozen=True)
class TopicDecl:
    """A topic declared once with its serdes (used wherever the DSL reads or writes it unless
    an operation names its own) and, optionally, the partition count the app creates it with
    when it is missing."""

    name: str
    key_serde: Serde | None = None
    value_serde: Serde | None = None
    partitions: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise TopologyError("a topic needs a name")
        if self.partitions is not None and self.partitions < 1:
            raise TopologyError(f"topic {self.name}: partitions must be >= 1, "
                                f"not {self.partitions}")
        for attribute in ("key_serde", "value_serde"):
            serde = getattr(self, attribute)
            if serde is not None:
                object.__setattr__(self, attribute, serde_from_name(serde))


@dataclass
class SubTopology:
    id: int
    sources: dict[str, SourceNode]
    stores: dict[str, StoreDecl]
    sink_topics: set[str]
    repartition_sources: set[str]
    partitions: int = 0

    def task_ids(self) -> list[str]:
        return [f"{self.id}_{p}" for p in range(self.partitions)]

    @property
    def stateful(self) -> bool:
        return bool(self.stores)


@dataclass
class Topology:
    """Every node the DSL created, by creation order, and the stores they use."""

    application_id: str
    sources: list[SourceNode] = field(default_factory=list)
    stores: dict[str, StoreDecl] = field(default_factory=dict)
    repartition_topics: set[str] = field(default_factory=set)
    #: Partition counts asked for with ``repartition(partitions=...)``.
    repartition_partitions: dict[str, int] = field(default_factory=dict)
    topics: dict[str, TopicDecl] = field(default_factory=dict)
    co_located: list[tuple[Node, Node]] = field(default_factory=list)
    #: Each repartition topic's sink (writing it) and source (reading it back).
    repartition_nodes: dict[str, tuple[SinkNode, SourceNode]] = field(default_factory=dict)
    _counter: int = 0
    #: Topics read or written with the default (msgpack) serdes for want of a declaration.
    _defaulted: dict[str, set[str]] = field(default_factory=dict)

    def node_name(self, kind: str) -> str:
        self._counter += 1
        return f"{kind}-{self._counter:04d}"

    def declare_topic(self, decl: TopicDecl) -> TopicDecl:
        known = self.topics.get(decl.name)
        if known is not None and _shape(known) != _shape(decl):
            raise TopologyError(f"topic {decl.name} is declared twice, differently")
        defaulted = self._defaulted.get(decl.name, set())
        if ("key" in defaulted and decl.key_serde) or ("value" in defaulted and decl.value_serde):
            raise TopologyError(
                f"topic {decl.name} is declared after a stream, table or to() of it was made "
                f"with the default msgpack serdes, which its declaration would not change: "
                f"call app.topic({decl.name!r}, ...) before using the topic")
        self.topics[decl.name] = decl
        return decl

    def serdes_for(
        self, topic: str, key_serde: str | Serde | None, value_serde: str | Serde | None
    ) -> tuple[Serde, Serde]:
        """The serdes to read or write ``topic`` with: the operation's own, else the topic's
        declared ones, else msgpack."""
        decl = self.topics.get(topic)
        key = key_serde if key_serde is not None else decl and decl.key_serde
        value = value_serde if value_serde is not None else decl and decl.value_serde
        if not key:
            self._defaulted.setdefault(topic, set()).add("key")
        if not value:
            self._defaulted.setdefault(topic, set()).add("value")
        return serde_from_name(key or "msgpack"), serde_from_name(value or "msgpack")

    def set_repartition_key_serde(self, topic: str, serde: Serde) -> None:
        """Encode the keys of repartition topic ``topic`` with ``serde`` (both its writer
        and its reader)."""
        sink, source = self.repartition_nodes[topic]
        sink.key_serde = source.key_serde = serde

    def topics_to_create(self) -> dict[str, int]:
        """Declared topics with a partition count: the app creates them when missing."""
        return {t.name: t.partitions for t in self.topics.values() if t.partitions is not None}

    def declare_store(self, decl: StoreDecl) -> None:
        if decl.name in self.stores:
            raise TopologyError(f"store {decl.name!r} is declared twice; store names are unique")
        StoreSpec(decl.name)  # validates the name
        if topic_name_problem(decl.name):
            # The store's changelog topic is named after it.
            raise TopologyError(f"store name {decl.name!r} may only hold ASCII letters, digits, "
                                f"'.', '_' and '-' (it names the store's changelog topic)")
        self.stores[decl.name] = decl

    def add_source(self, source: SourceNode) -> None:
        if any(s.topic == source.topic for s in self.sources):
            raise TopologyError(
                f"topic {source.topic} is read twice; read it once and branch the stream"
            )
        self.sources.append(source)

    def sub_topologies(self) -> list[SubTopology]:
        """Connected groups of nodes; ids follow the order their first source was declared."""
        parent: dict[int, int] = {}

        def find(x: int) -> int:
            while parent.setdefault(x, x) != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        def union(a: Node, b: Node) -> None:
            parent[find(id(a))] = find(id(b))

        nodes_by_id: dict[int, Node] = {}
        for source in self.sources:
            stack: list[Node] = [source]
            while stack:
                node = stack.pop()
                if id(node) in nodes_by_id:
                    continue
                nodes_by_id[id(node)] = node
                for child in node.children:
                    union(node, child)
                    stack.append(child)
        for a, b in self.co_located:
            union(a, b)
        # Nodes sharing a store run in the same task.
        by_store: dict[str, Node] = {}
        for node in nodes_by_id.values():
            for store in node.store_names():
                if store in by_store:
                    union(node, by_store[store])
                by_store[store] = node

        groups: dict[int, SubTopology] = {}
        ordered: list[SubTopology] = []
        for source in self.sources:
            root = find(id(source))
            if root not in groups:
                groups[root] = SubTopology(len(ordered), {}, {}, set(), set())
                ordered.append(groups[root])
            group = groups[root]
            group.sources[source.topic] = source
            if source.topic in self.repartition_topics:
                group.repartition_sources.add(source.topic)
        for node in nodes_by_id.values():
            group = groups[find(id(node))]
            for store in node.store_names():
                if store not in self.stores:
                    raise TopologyError(f"node {node.name} uses undeclared store {store!r}")
                group.stores[store] = self.stores[store]
            if isinstance(node, SinkNode):
                group.sink_topics.add(node.topic)
        for group in ordered:
            problem = _key_bytes_problem(group)
            if problem:
                raise TopologyError(problem)
        return ordered

    def assign_partitions(
        self, subs: list[SubTopology], external_counts: dict[str, int], default: int
    ) -> dict[str, int]:
        """Set each sub-topology's partition count; returns the repartition topics' counts.

        A sub-topology that reads your topics takes their partition count (they must agree:
        a join reads partition p of both sides in one task). One that reads only repartition
        topics takes the count ``repartition(partitions=...)`` asked for, else the largest
        count among the sub-topologies writing them, else ``default``. A repartition topic
        gets the count of the sub-topology reading it, so a re-keyed stream joined with a
        table is repartitioned to the table's count.
        """
        writers: dict[str, list[SubTopology]] = {}
        for sub in subs:
            for topic in sub.sink_topics & self.repartition_topics:
                writers.setdefault(topic, []).append(sub)
        resolved: dict[int, int] = {}
        for sub in subs:
            counts: dict[str, int] = {}
            for topic in sorted(sub.sources):
                if topic in self.repartition_topics:
                    if topic in self.repartition_partitions:
                        counts[topic] = self.repartition_partitions[topic]
                elif topic not in external_counts:
                    known = (set(self.topics) | set(external_counts)) - {topic}
                    close = difflib.get_close_matches(topic, sorted(known), n=1, cutoff=0.75)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise TopologyError(
                        f"source topic {topic} does not exist{hint}; create it first, or "
                        f"declare it with app.topic({topic!r}, partitions=N) so that the app "
                        f"creates it"
                    )
                else:
                    counts[topic] = external_counts[topic]
            if len(set(counts.values())) > 1:
                raise TopologyError(self._not_co_partitioned(sub, counts))
            if counts:
                resolved[sub.id] = next(iter(counts.values()))
        for _ in range(len(subs)):
            for sub in subs:
                if sub.id in resolved:
                    continue
                upstream = [w for t in sub.repartition_sources for w in writers.get(t, [])]
                if all(w.id in resolved for w in upstream):
                    resolved[sub.id] = max((resolved[w.id] for w in upstream), default=default)
        for sub in subs:
            sub.partitions = resolved.get(sub.id, default)
        return {topic: sub.partitions for sub in subs for topic in sub.repartition_sources}

    def _not_co_partitioned(self, sub: SubTopology, counts: dict[str, int]) -> str:
        detail = ", ".join(f"{t}={n}" for t, n in sorted(counts.items()))
        tables = sorted(t for t, source in sub.sources.items()
                        if any(isinstance(c, TableNode) for c in source.children))
        if tables:
            what = f"joins a stream with table {', '.join(tables)}"
            fix = ("Call .repartition() on the stream before the join (it is then written to "
                   "an internal topic with the table's count)")
        else:
            what = "reads several topics"
            fix = "Call .repartition() on the streams before they meet"
        return (
            f"sub-topology {sub.id} {what}, but the topics are not co-partitioned ({detail}): "
            f"partition p of each is processed by the same task, so they need the same number "
            f"of partitions. {fix}, or create the topics with the same partition count"
        )

def _key_bytes_problem(sub: SubTopology) -> str | None:
    """Why the topics of a stateful sub-topology may put one key in different partitions:
    they encode keys differently (a partition is the murmur2 hash of the key's bytes)."""
    if not sub.stateful or len(sub.sources) < 2:
        return None
    serdes = {t: s.key_serde for t, s in sorted(sub.sources.items())}
    if len({serde_identity(s) for s in serdes.values()}) < 2:
        return None
    detail = " and ".join(f"{t} with key serde {serde_label(s)}" for t, s in serdes.items())
    return (f"sub-topology {sub.id} reads {detail}: a key encoded two ways is hashed to two "
            f"partitions, so its records and its state meet in different tasks. Read the "
            f"topics with one key serde, or give the stream .repartition(key_serde=...) "
            f"with the table's")


def serde_identity(serde: Serde) -> tuple[type, str | None]:
    return type(serde), getattr(serde, "name", None)


def serde_label(serde: Serde) -> str:
    name = getattr(serde, "name", None)
    return name if isinstance(name, str) else type(serde).__name__


def _shape(decl: TopicDecl) -> tuple[object, ...]:
    serdes = (decl.key_serde, decl.value_serde)
    return (decl.partitions, *(None if x is None else (type(x), x.name) for x in serdes))
