"""What ``app.describe()`` shows: the topology's sub-topologies with their sources,
processors (and the stores they use) and sinks, in the layout of Kafka Streams'
``Topology.describe()``, followed by the internal topics the app creates.

A description is plain data (:class:`TopologyDescription`); ``str()`` renders it, and
:meth:`TopologyDescription.to_data` / :func:`description_from_data` turn it into JSON-able
data and back (the form an app publishes for ``relay web`` to draw, versioned by
:data:`DESCRIPTION_VERSION`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from statestore.store import changelog_topic_name
from streams.dsl.processors import Node, SinkNode, SourceNode, walk_nodes
from streams.dsl.topology import Topology

#: The version of :meth:`TopologyDescription.to_data`'s form; a reader refuses others.
DESCRIPTION_VERSION = 1
_KINDS = {"Source": "source", "Processor": "processor", "Sink": "sink"}


@dataclass(frozen=True)
class NodeDescription:
    kind: str  # "Source", "Processor" or "Sink"
    name: str
    topics: tuple[str, ...] = ()
    stores: tuple[str, ...] = ()
    successors: tuple[str, ...] = ()
    predecessors: tuple[str, ...] = ()

    def render(self) -> list[str]:
        if self.kind == "Source":
            head = f"    Source: {self.name} (topics: [{', '.join(self.topics)}])"
        elif self.kind == "Sink":
            head = f"    Sink: {self.name} (topic: {self.topics[0]})"
        else:
            head = f"    Processor: {self.name} (stores: [{', '.join(self.stores)}])"
        lines = [head]
        if self.successors:
            lines.append(f"      --> {', '.join(self.successors)}")
        if self.predecessors:
            lines.append(f"      <-- {', '.join(self.predecessors)}")
        return lines


@dataclass(frozen=True)
class SubTopologyDescription:
    id: int
    nodes: tuple[NodeDescription, ...]
    stores: tuple[str, ...]


@dataclass(frozen=True)
class TopologyDescription:
    sub_topologies: tuple[SubTopologyDescription, ...]
    source_topics: tuple[str, ...]
    sink_topics: tuple[str, ...]
    repartition_topics: tuple[str, ...]
    changelog_topics: tuple[str, ...]
    global_stores: tuple[str, ...] = field(default=())
    #: Each store's changelog topic: ``(store, topic)``.
    changelogs: tuple[tuple[str, str], ...] = field(default=())

    def to_data(self) -> dict[str, Any]:
        """The description as JSON-able data (see :func:`description_from_data`)."""
        return {
            "version": DESCRIPTION_VERSION,
            "sub_topologies": [
                {"id": sub.id, "stores": list(sub.stores),
                 "nodes": [{"kind": _KINDS[n.kind], "name": n.name, "topics": list(n.topics),
                            "stores": list(n.stores), "successors": list(n.successors),
                            "predecessors": list(n.predecessors)} for n in sub.nodes]}
                for sub in self.sub_topologies],
            "topics": {"source": list(self.source_topics), "sink": list(self.sink_topics),
                       "repartition": list(self.repartition_topics),
                       "changelog": list(self.changelog_topics)},
            "changelogs": dict(self.changelogs),
            "global_stores": list(self.global_stores),
        }

    def __str__(self) -> str:
        lines = ["Topologies:"]
        for sub in self.sub_topologies:
            lines.append(f"   Sub-topology: {sub.id}")
            for node in sub.nodes:
                lines.extend(node.render())
            lines.append("")
        lines.append("Internal topics:")
        for topic in self.repartition_topics:
            lines.append(f"   {topic} (repartition)")
        for topic in self.changelog_topics:
            lines.append(f"   {topic} (changelog)")
        if self.global_stores:
            lines.append("Global stores (restored from their source topics, no changelog):")
            lines.extend(f"   {store}" for store in self.global_stores)
        return "\n".join(lines) + "\n"


def describe(topology: Topology, global_stores: tuple[str, ...] = ()) -> TopologyDescription:
    """Describe ``topology``: its sub-topologies in id order, each node once (sources first,
    then in the order reached from them), and its topics."""
    subs = topology.sub_topologies()
    all_nodes = walk_nodes(topology.sources)
    parents: dict[int, list[str]] = {}
    for node in all_nodes:
        for child in node.children:
            parents.setdefault(id(child), []).append(node.name)
    described = []
    sinks: set[str] = set()
    for sub in subs:
        ordered: list[Node] = []
        seen: set[int] = set()
        queue: list[Node] = list(sub.sources.values())
        while queue:
            node = queue.pop(0)
            if id(node) in seen:
                continue
            seen.add(id(node))
            ordered.append(node)
            queue.extend(node.children)
        nodes = []
        for node in ordered:
            if isinstance(node, SourceNode):
                kind, topics = "Source", (node.topic,)
            elif isinstance(node, SinkNode):
                kind, topics = "Sink", (node.topic,)
                sinks.add(node.topic)
            else:
                kind, topics = "Processor", ()
            # A stream-table join reads the table's store without owning it.
            stores = node.store_names() or [getattr(node, "table_store", None)]
            nodes.append(NodeDescription(
                kind, node.name, topics, tuple(s for s in stores if s),
                tuple(c.name for c in node.children),
                tuple(sorted(set(parents.get(id(node), [])))),
            ))
        described.append(SubTopologyDescription(sub.id, tuple(nodes), tuple(sorted(sub.stores))))
    repartition = tuple(sorted(topology.repartition_topics))
    return TopologyDescription(
        tuple(described),
        tuple(sorted(s.topic for s in topology.sources if s.topic not in repartition)),
        tuple(sorted(sinks - set(repartition))),
        repartition,
        tuple(changelog_topic_name(topology.application_id, store)
              for store in sorted(topology.stores)),
        global_stores,
        tuple((store, changelog_topic_name(topology.application_id, store))
              for store in sorted(topology.stores)),
    )


def description_from_data(data: Any) -> TopologyDescription:
    """The description :meth:`TopologyDescription.to_data` gave; raises ValueError, saying
    what is wrong, for anything else (another version included)."""
    if not isinstance(data, dict):
        raise ValueError(f"a topology description is a map, not {type(data).__name__}")
    version = data.get("version")
    if version != DESCRIPTION_VERSION:
        raise ValueError(f"topology description version {version!r} is not "
                         f"{DESCRIPTION_VERSION}, the one this Relay reads")
    try:
        kinds = {v: k for k, v in _KINDS.items()}
        subs = tuple(
            SubTopologyDescription(
                _int(sub["id"]),
                tuple(NodeDescription(kinds[n["kind"]], _str(n["name"]), _strs(n["topics"]),
                                      _strs(n["stores"]), _strs(n["successors"]),
                                      _strs(n["predecessors"])) for n in sub["nodes"]),
                _strs(sub["stores"]))
            for sub in data["sub_topologies"])
        names = [n.name for sub in subs for n in sub.nodes]
        if len(set(names)) != len(names):
            raise ValueError("a node name appears twice")
        unknown = sorted({other for sub in subs for n in sub.nodes
                          for other in (*n.successors, *n.predecessors)} - set(names))
        if unknown:
            raise ValueError(f"edges to nodes it does not describe: {', '.join(unknown)}")
        topics = data["topics"]
        changelogs = data.get("changelogs", {})
        if not isinstance(changelogs, dict):
            raise TypeError("changelogs is not a map")
        return TopologyDescription(
            subs, _strs(topics["source"]), _strs(topics["sink"]), _strs(topics["repartition"]),
            _strs(topics["changelog"]), _strs(data.get("global_stores", [])),
            tuple((_str(k), _str(v)) for k, v in changelogs.items()))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed topology description: {type(exc).__name__} {exc}") \
            from None


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


def _strs(values: Any) -> tuple[str, ...]:
    if not isinstance(values, list):
        raise TypeError(f"{values!r} is not a list")
    return tuple(_str(v) for v in values)


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not an integer")
    return value
