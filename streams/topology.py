"""The topology: the graph of processor nodes an app declares, split into sub-topologies at
repartition topics, with the partition count (hence the tasks) of each sub-topology.

A task is (sub-topology, partition), written ``"<sub-topology>_<partition>"``. All source
topics of one sub-topology must have the same number of partitions (co-partitioning): a
mismatch is an error at start.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from statestore.store import StoreSpec
from streams.processors import Node, SinkNode, SourceNode, StoreDecl


class TopologyError(ValueError):
    """The declared topology cannot run: a clear message says what to change."""


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
    co_located: list[tuple[Node, Node]] = field(default_factory=list)
    _names: set[str] = field(default_factory=set)
    _counter: int = 0

    def node_name(self, kind: str) -> str:
        self._counter += 1
        return f"{kind}-{self._counter:04d}"

    def declare_store(self, decl: StoreDecl) -> None:
        if decl.name in self.stores:
            raise TopologyError(f"store {decl.name!r} is declared twice; store names are unique")
        StoreSpec(decl.name)  # validates the name
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
        return ordered

    def assign_partitions(
        self, subs: list[SubTopology], external_counts: dict[str, int], default: int
    ) -> dict[str, int]:
        """Set each sub-topology's partition count; returns the repartition topics' counts.

        External source topics dictate their sub-topology's count; a repartition topic gets
        the count of the sub-topology that writes it (or ``default``).
        """
        repartition_counts: dict[str, int] = {}
        pending = list(subs)
        for _ in range(len(subs) + 1):
            still: list[SubTopology] = []
            for sub in pending:
                counts: dict[str, int] = {}
                for topic in sub.sources:
                    if topic in self.repartition_topics:
                        if topic in repartition_counts:
                            counts[topic] = repartition_counts[topic]
                    elif topic not in external_counts:
                        raise TopologyError(
                            f"source topic {topic} does not exist; create it first"
                        )
                    else:
                        counts[topic] = external_counts[topic]
                if len(counts) < len(sub.sources) and not any(
                    t not in self.repartition_topics for t in sub.sources
                ):
                    still.append(sub)
                    continue
                distinct = set(counts.values())
                if len(distinct) > 1:
                    detail = ", ".join(f"{t}={n}" for t, n in sorted(counts.items()))
                    raise TopologyError(
                        f"sub-topology {sub.id} reads topics that are not co-partitioned "
                        f"({detail}); they must have the same number of partitions"
                    )
                sub.partitions = distinct.pop() if distinct else default
                for topic in sub.sink_topics & self.repartition_topics:
                    repartition_counts[topic] = sub.partitions
            pending = still
            if not pending:
                break
        for sub in pending:
            sub.partitions = default
        for sub in subs:
            for topic in sub.repartition_sources:
                repartition_counts.setdefault(topic, sub.partitions)
                if repartition_counts[topic] != sub.partitions:
                    raise TopologyError(
                        f"repartition topic {topic} has {repartition_counts[topic]} "
                        f"partitions but sub-topology {sub.id} has {sub.partitions}"
                    )
        return repartition_counts

    def fingerprint(self) -> str:
        """A short hash of the topology's shape, so members can tell they run the same app."""
        parts = []
        for sub in self.sub_topologies():
            parts.append(f"{sub.id}:{sorted(sub.sources)}:{sorted(sub.stores)}")
        return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]
