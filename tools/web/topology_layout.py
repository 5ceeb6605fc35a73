"""Where the web view draws an app's topology: a layered layout of its graph, pure and
deterministic (the page only draws the boxes, nodes and edges it is given).

The graph: each node of each sub-topology (source, processor, sink), each topic (source,
sink, repartition, changelog) as a node of its own, and each store next to the first
processor using it. Edges go from parent to child, from a topic to its source node, from a
sink node to its topic, between a store and the processors using it, and from a store to its
changelog topic.

The layout flows top to bottom. A node's rank (its row) is the longest path to it from a
node without parents (a back edge of a cycle, which only a topic an app both writes and reads
could make, does not count). Each sub-topology has a column band of its own and is drawn as a
box around its band; the topics linking sub-topologies (repartition topics, and any topic one
writes and another reads) go in the gap band to the right of the leftmost one they link, so
no box holds a node of another. A topic only one sub-topology reads goes just above its box,
one it only writes just below. Within a row, nodes are ordered by their parents' mean
position (one downward sweep), stores and changelogs right after their processor. An edge
spanning several rows of one band bends through a point of its own in each row between (a
dummy node taking part in the ordering, as in Sugiyama's method), so it goes around the nodes
of those rows rather than through them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from streams.dsl.describe import TopologyDescription

NODE_H = 36
RANK_STEP = 80
NODE_GAP = 16
BAND_GAP = 40
BOX_PAD = 12
BOX_TITLE = 30
MARGIN = 20
CHAR_W = 7.2  # the page draws labels in 12px monospace
MIN_NODE_W = 90
BEND_W = 10
EMPTY_GAP_W = 0


@dataclass
class LaidNode:
    id: str
    kind: str  # source, processor, sink, topic, repartition-topic, changelog-topic, store, ...
    name: str
    caption: str
    sub: int | None  # its sub-topology (None: a topic between them, a global store)
    rank: int = 0
    band: int = 0
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0
    h: float = NODE_H
    #: What the node shows: its name, an internal topic's without the app's prefix.
    label: str = ""


@dataclass(frozen=True)
class LaidEdge:
    source: str
    target: str
    kind: str  # flow, topic, store, changelog
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Box:
    sub: int
    label: str
    x: float
    y: float
    w: float
    h: float


@dataclass
class Layout:
    width: float
    height: float
    nodes: list[LaidNode] = field(default_factory=list)
    edges: list[LaidEdge] = field(default_factory=list)
    boxes: list[Box] = field(default_factory=list)

    def node(self, node_id: str) -> LaidNode:
        return next(n for n in self.nodes if n.id == node_id)

    def to_data(self) -> dict[str, Any]:
        return {"width": self.width, "height": self.height,
                "nodes": [asdict(n) for n in self.nodes],
                "edges": [{"source": e.source, "target": e.target, "kind": e.kind,
                           "points": [list(p) for p in e.points]} for e in self.edges],
                "boxes": [asdict(b) for b in self.boxes]}


def node_id(name: str) -> str:
    return f"node:{name}"


def topic_id(topic: str) -> str:
    return f"topic:{topic}"


def store_id(store: str) -> str:
    return f"store:{store}"


def topic_caption(topic: str, repartition: bool) -> str:
    if not repartition:
        return "topic"
    # The foreign-key join names its two internal topics so (streams.dsl.fk_joins).
    if "-subscription-repartition-" in topic:
        return "FK subscription topic"
    if "-response-repartition-" in topic:
        return "FK response topic"
    return "repartition topic"


def layout_topology(description: TopologyDescription, app_id: str = "") -> Layout:
    """The drawing of ``description``: nodes with their boxes, edges with their points.
    Internal topics are labelled without ``app_id``'s prefix (their full name stays in
    ``name``), which keeps the drawing narrow."""
    graph = _Graph(description, f"{app_id}-" if app_id else "")
    ranks = longest_path_ranks(graph.order, graph.flow)
    for node in graph.nodes.values():
        node.rank = ranks.get(node.id, 0)
    graph.place_topics()
    graph.place_stores()
    graph.add_bends()
    return graph.coordinates()


def longest_path_ranks(order: list[str], edges: dict[str, list[str]]) -> dict[str, int]:
    """Each node's rank: 0 for a node no edge reaches, else one more than its highest-ranked
    parent's. Edges closing a cycle (back edges of a depth-first search from the nodes in
    ``order``) are left out."""
    state: dict[str, int] = {}  # 1: on the search's path, 2: done
    finished: list[str] = []
    kept: dict[str, list[str]] = {n: [] for n in order}
    for root in order:
        if root in state:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            current, i = stack.pop()
            children = edges.get(current, [])
            if i < len(children):
                stack.append((current, i + 1))
                child = children[i]
                if state.get(child) == 1:
                    continue  # a back edge
                kept[current].append(child)
                if child not in state:
                    state[child] = 1
                    stack.append((child, 0))
            else:
                state[current] = 2
                finished.append(current)
    ranks = {n: 0 for n in order}
    for current in reversed(finished):  # a topological order of the kept edges
        for child in kept[current]:
            ranks[child] = max(ranks[child], ranks[current] + 1)
    return ranks


class _Graph:
    """The nodes and edges of one description while they are laid out."""

    def __init__(self, description: TopologyDescription, prefix: str) -> None:
        self.description = description
        self.prefix = prefix
        self.nodes: dict[str, LaidNode] = {}
        self.order: list[str] = []
        self.flow: dict[str, list[str]] = {}
        self.edges: list[tuple[str, str, str]] = []
        self.store_users: dict[str, list[str]] = {}
        #: Each edge's bend points (dummy nodes), by (source, target, kind).
        self.bends: dict[tuple[str, str, str], list[str]] = {}
        readers: dict[str, set[int]] = {}
        writers: dict[str, set[int]] = {}
        repartition = set(description.repartition_topics)
        for sub in description.sub_topologies:
            for n in sub.nodes:
                self._add(LaidNode(node_id(n.name), n.kind.lower(), n.name, n.kind.lower(),
                                   sub.id))
                for child in n.successors:
                    self._edge(node_id(n.name), node_id(child), "flow")
                for store in n.stores:
                    self.store_users.setdefault(store, []).append(node_id(n.name))
                for topic in n.topics:
                    (readers if n.kind == "Source" else writers).setdefault(
                        topic, set()).add(sub.id)
        for topic in sorted({*readers, *writers}):
            kind = "repartition-topic" if topic in repartition else "topic"
            subs = readers.get(topic, set()) | writers.get(topic, set())
            self._add(LaidNode(topic_id(topic), kind, topic, topic_caption(topic, kind != "topic"),
                               next(iter(subs)) if len(subs) == 1 else None))
        self.readers, self.writers = readers, writers
        for sub in description.sub_topologies:
            for n in sub.nodes:
                for topic in n.topics:
                    if n.kind == "Source":
                        self._edge(topic_id(topic), node_id(n.name), "topic")
                    else:
                        self._edge(node_id(n.name), topic_id(topic), "topic")
        changelogs = dict(description.changelogs)
        for store, users in self.store_users.items():
            sub = self.nodes[users[0]].sub
            self._add(LaidNode(store_id(store), "store", store, "store", sub))
            for user in dict.fromkeys(users):
                self.edges.append((store_id(store), user, "store"))
            if store in changelogs:
                topic = changelogs[store]
                self._add(LaidNode(topic_id(topic), "changelog-topic", topic,
                                   "changelog topic", sub))
                self.edges.append((store_id(store), topic_id(topic), "changelog"))
        for entry in description.global_stores:
            self._add(LaidNode(f"global:{entry}", "global-store", entry, "global store", None))

    def _add(self, node: LaidNode) -> None:
        if node.id not in self.nodes:
            self.nodes[node.id] = node
            self.order.append(node.id)
            internal = node.kind in ("repartition-topic", "changelog-topic")
            node.label = (f"…{node.name[len(self.prefix) - 1:]}"
                          if internal and self.prefix and node.name.startswith(self.prefix)
                          else node.name)
            node.w = max(MIN_NODE_W, round(max(len(node.label), len(node.caption)) * CHAR_W)
                         + 16)

    def _edge(self, source: str, target: str, kind: str) -> None:
        self.flow.setdefault(source, []).append(target)
        self.edges.append((source, target, kind))

    def _sub_nodes(self, sub: int) -> list[LaidNode]:
        return [n for n in self.nodes.values()
                if n.sub == sub and n.kind in ("source", "processor", "sink")]

    def place_topics(self) -> None:
        """Bands: sub-topology i in band 2i+1, the gap bands between them even. Topics one
        sub-topology only reads (writes) go just above (below) its box."""
        subs = [s.id for s in self.description.sub_topologies]
        band_of = {sub: 2 * i + 1 for i, sub in enumerate(subs)}
        extent = {sub: (min(n.rank for n in nodes), max(n.rank for n in nodes))
                  for sub in subs if (nodes := self._sub_nodes(sub))}
        for node in self.nodes.values():
            if node.kind in ("source", "processor", "sink"):
                node.band = band_of[node.sub]  # type: ignore[index]
            elif node.kind in ("topic", "repartition-topic"):
                topic = node.name
                read, written = self.readers.get(topic, set()), self.writers.get(topic, set())
                if node.sub is not None and not (read and written):
                    node.band = band_of[node.sub]
                    top, bottom = extent[node.sub]
                    node.rank = top - 1 if read else bottom + 1
                else:
                    node.sub = None
                    node.band = min(band_of[s] for s in read | written) + 1
        if any(n.rank < 0 for n in self.nodes.values()):
            low = min(n.rank for n in self.nodes.values())
            for node in self.nodes.values():
                node.rank -= low
        globals_ = [n for n in self.nodes.values() if n.kind == "global-store"]
        for i, node in enumerate(globals_):
            node.band, node.rank = 2 * len(subs) + 1, i

    def place_stores(self) -> None:
        for store, users in self.store_users.items():
            anchor = min((self.nodes[u] for u in users), key=lambda n: n.rank)
            node = self.nodes[store_id(store)]
            node.band, node.rank = anchor.band, anchor.rank
        for node in self.nodes.values():
            if node.kind == "changelog-topic":
                store = next(s for s, t, k in self.edges if t == node.id and k == "changelog")
                node.band, node.rank = self.nodes[store].band, self.nodes[store].rank

    def add_bends(self) -> None:
        for edge in self.edges:
            a, b = self.nodes[edge[0]], self.nodes[edge[1]]
            if a.band != b.band or b.rank - a.rank < 2:
                continue
            chain = []
            for rank in range(a.rank + 1, b.rank):
                bend = LaidNode(f"bend:{len(self.order)}", "bend", "", "", a.sub, rank, a.band,
                                w=BEND_W)
                self.nodes[bend.id] = bend
                self.order.append(bend.id)
                chain.append(bend.id)
            self.bends[edge] = chain

    def rows(self) -> dict[tuple[int, int], list[LaidNode]]:
        """Each (band, rank) row's nodes, in their drawing order."""
        position: dict[str, float] = {}
        parents: dict[str, list[str]] = {}
        for edge in self.edges:
            path = [edge[0], *self.bends.get(edge, []), edge[1]]
            for source, target in itertools.pairwise(path):
                if edge[2] in ("flow", "topic") or target.startswith("bend:"):
                    parents.setdefault(target, []).append(source)
        attached: dict[str, list[str]] = {}  # anchor -> its stores and their changelogs
        for store, users in self.store_users.items():
            anchor = min((self.nodes[u] for u in users), key=lambda n: n.rank)
            attached.setdefault(anchor.id, []).append(store_id(store))
        for source, target, kind in self.edges:
            if kind == "changelog":
                attached.setdefault(source, []).append(target)
        placed = {i for ids in attached.values() for i in ids}
        index = {node_id: i for i, node_id in enumerate(self.order)}
        grouped: dict[tuple[int, int], list[LaidNode]] = {}
        for node in self.nodes.values():
            if node.id not in placed:
                grouped.setdefault((node.band, node.rank), []).append(node)
        rows: dict[tuple[int, int], list[LaidNode]] = {}
        for key in sorted(grouped, key=lambda k: (k[1], k[0])):
            def weight(node: LaidNode) -> tuple[float, int]:
                known = [position[p] for p in parents.get(node.id, []) if p in position]
                return (sum(known) / len(known) if known else float(index[node.id]),
                        index[node.id])

            row: list[LaidNode] = []
            for node in sorted(grouped[key], key=weight):
                row.append(node)
                row.extend(self._attached(node.id, attached))
            for i, node in enumerate(row):
                position[node.id] = i
            rows[key] = row
        return rows

    def _attached(self, anchor: str, attached: dict[str, list[str]]) -> Iterable[LaidNode]:
        for item in attached.get(anchor, []):
            yield self.nodes[item]
            yield from self._attached(item, attached)

    def coordinates(self) -> Layout:
        rows = self.rows()
        bands = 2 * len(self.description.sub_topologies) + 2
        band_w = [float(EMPTY_GAP_W)] * bands
        for (band, _rank), row in rows.items():
            band_w[band] = max(band_w[band], _row_width(row))
        for i in range(1, bands, 2):
            if i < 2 * len(self.description.sub_topologies):
                band_w[i] = max(band_w[i], 120.0)  # room for the box's title
        band_x: list[float] = []
        x = float(MARGIN + BOX_PAD)
        for width in band_w:
            band_x.append(x)
            x += width + (BAND_GAP if width else BAND_GAP / 2)
        for (band, rank), row in rows.items():
            left = band_x[band] + (band_w[band] - _row_width(row)) / 2
            for node in row:
                node.x, node.y = left, _row_y(rank)
                left += node.w + NODE_GAP
        boxes = []
        for i, sub in enumerate(self.description.sub_topologies):
            members = [n for n in self.nodes.values() if n.sub == sub.id and
                       n.kind not in ("topic", "repartition-topic", "bend")]
            if not members:
                continue
            top, bottom = min(n.y for n in members), max(n.y for n in members)
            band = 2 * i + 1
            boxes.append(Box(sub.id, f"Sub-topology {sub.id}", band_x[band] - BOX_PAD,
                             top - BOX_TITLE, band_w[band] + 2 * BOX_PAD,
                             bottom - top + NODE_H + BOX_TITLE + BOX_PAD))
        edges = [LaidEdge(*edge, _route([self.nodes[i] for i in
                                         (edge[0], *self.bends.get(edge, []), edge[1])]))
                 for edge in self.edges]
        width = max((n.x + n.w for n in self.nodes.values()), default=0.0) + MARGIN + BOX_PAD
        height = max((n.y + n.h for n in self.nodes.values()), default=0.0) + MARGIN
        ordered = [n for row in rows.values() for n in row if n.kind != "bend"]
        return Layout(width, height, ordered, edges, boxes)


def _row_width(row: list[LaidNode]) -> float:
    return sum(n.w for n in row) + NODE_GAP * (len(row) - 1)


def _row_y(rank: int) -> float:
    return MARGIN + BOX_TITLE + rank * RANK_STEP


def _route(path: list[LaidNode]) -> tuple[tuple[float, float], ...]:
    """Bottom of the first node to top of the last downwards, through each bend point's top
    and bottom; side to side within a row; around the right of both otherwise."""
    a, b = path[0], path[-1]
    if b.y > a.y:
        points = [(a.x + a.w / 2, a.y + a.h)]
        for bend in path[1:-1]:
            points += [(bend.x + bend.w / 2, bend.y), (bend.x + bend.w / 2, bend.y + bend.h)]
        return (*points, (b.x + b.w / 2, b.y))
    if b.y == a.y:
        if b.x >= a.x:
            return ((a.x + a.w, a.y + a.h / 2), (b.x, b.y + b.h / 2))
        return ((a.x, a.y + a.h / 2), (b.x + b.w, b.y + b.h / 2))
    return ((a.x + a.w, a.y + a.h / 2), (b.x + b.w, b.y + b.h / 2))
