"""The topology's drawing, pure: longest-path ranks, sub-topology boxes around their own
nodes only, no two nodes or boxes overlapping, long edges bent around the rows they cross,
for the examples (a foreign-key join's subscription and response topics included)."""

from __future__ import annotations

import itertools

import pytest

from examples.fk_enrichment import app as fk_enrichment
from examples.sessionized_clicks import app as sessionized_clicks
from streams.app import App
from streams.dsl.describe import TopologyDescription
from tests.unit.streams.test_describe_data import final_counts, stream_table_join, word_count
from tools.web.topology_layout import (
    Box,
    LaidNode,
    Layout,
    layout_topology,
    longest_path_ranks,
    node_id,
    store_id,
    topic_id,
)


def overlap(a: LaidNode | Box, b: LaidNode | Box) -> bool:
    return a.x < b.x + b.w and b.x < a.x + a.w and a.y < b.y + b.h and b.y < a.y + a.h


def inside(n: LaidNode, box: Box) -> bool:
    return box.x <= n.x and n.x + n.w <= box.x + box.w and box.y <= n.y and \
        n.y + n.h <= box.y + box.h


def test_ranks_are_longest_paths_and_a_cycle_does_not_stop_them() -> None:
    edges = {"a": ["b", "c"], "b": ["c"], "c": ["d"], "d": ["b"], "e": []}
    # d -> b closes a cycle: left out, b is ranked by a alone.
    assert longest_path_ranks(["a", "b", "c", "d", "e"], edges) == {
        "a": 0, "b": 1, "c": 2, "d": 3, "e": 0}
    assert longest_path_ranks(["x", "y"], {"x": ["y"], "y": []}) == {"x": 0, "y": 1}


def check_drawing(layout: Layout, description: TopologyDescription) -> None:
    nodes = layout.nodes
    for a, b in itertools.combinations(nodes, 2):
        assert not overlap(a, b), (a.id, b.id)
    for a, b in itertools.combinations(layout.boxes, 2):
        assert not overlap(a, b), (a.sub, b.sub)
    for box in layout.boxes:
        for n in nodes:
            if n.sub == box.sub and n.kind not in ("topic", "repartition-topic"):
                assert inside(n, box), (n.id, box.sub)
            else:
                assert not overlap(n, box), (n.id, box.sub)
    ids = {n.id for n in nodes}
    assert len(ids) == len(nodes)
    for sub in description.sub_topologies:
        for d in sub.nodes:
            assert node_id(d.name) in ids
            assert all(topic_id(t) in ids for t in d.topics)
            assert all(store_id(s) in ids for s in d.stores)
    assert {topic_id(t) for t in description.changelog_topics} <= ids
    by_id = {n.id: n for n in nodes}
    for edge in layout.edges:
        assert edge.source in ids and edge.target in ids
        a, b = by_id[edge.source], by_id[edge.target]
        if edge.kind in ("flow", "topic"):
            assert b.rank > a.rank, (edge.source, edge.target)
        assert edge.points[0][1] in (a.y + a.h, a.y + a.h / 2)
    assert all(n.x >= 0 and n.x + n.w <= layout.width and n.y + n.h <= layout.height
               for n in nodes)


@pytest.mark.parametrize("app", [word_count(), stream_table_join(), final_counts(),
                                 fk_enrichment, sessionized_clicks],
                         ids=["word-count", "stream-table-join", "final-counts",
                              "fk-enrichment", "sessionized-clicks"])
def test_nothing_overlaps_and_every_node_and_topic_is_drawn(app: App) -> None:
    description = app.describe()
    check_drawing(layout_topology(description, app.config.application_id), description)


def test_the_word_count_flows_down_through_its_repartition_topic() -> None:
    layout = layout_topology(word_count().describe(), "wc")
    rank = {n.id: n.rank for n in layout.nodes}
    chain = [topic_id("lines"), node_id("source-0001"), node_id("flat-map-values-0002"),
             node_id("select-key-0003"), node_id("counts-repartition-0004-sink"),
             topic_id("wc-counts-repartition-0004"), node_id("counts-repartition-0004-source"),
             node_id("aggregate-0005"), node_id("sink-0006"), topic_id("word-counts")]
    assert [rank[i] for i in chain] == list(range(10))
    repartition = layout.node(topic_id("wc-counts-repartition-0004"))
    assert repartition.kind == "repartition-topic" and repartition.sub is None
    assert repartition.label == "…-counts-repartition-0004"  # the app's prefix elided
    assert repartition.name == "wc-counts-repartition-0004"
    left, right = sorted(layout.boxes, key=lambda b: b.x)
    assert (left.sub, right.sub) == (0, 1)
    assert left.x + left.w < repartition.x and repartition.x + repartition.w < right.x
    # The store and its changelog sit right of the processor using them, in its row.
    aggregate, store = layout.node(node_id("aggregate-0005")), layout.node(store_id("counts"))
    changelog = layout.node(topic_id("wc-counts-changelog"))
    assert aggregate.y == store.y == changelog.y and aggregate.x < store.x < changelog.x
    assert changelog.kind == "changelog-topic"
    kinds = {(e.source, e.target): e.kind for e in layout.edges}
    assert kinds[(store_id("counts"), node_id("aggregate-0005"))] == "store"
    assert kinds[(store_id("counts"), topic_id("wc-counts-changelog"))] == "changelog"
    assert kinds[(node_id("counts-repartition-0004-sink"),
                  topic_id("wc-counts-repartition-0004"))] == "topic"


def test_the_fk_join_links_its_sub_topologies_through_subscription_and_response() -> None:
    layout = layout_topology(fk_enrichment.describe(), "fk-enrichment")
    subscription = layout.node(topic_id(
        "fk-enrichment-fk-join-0005-subscription-repartition-0006"))
    response = layout.node(topic_id("fk-enrichment-fk-join-0005-response-repartition-0007"))
    assert subscription.caption == "FK subscription topic"
    assert response.caption == "FK response topic"
    # Sub-topology 0 writes the subscription and reads the response, 1 the other way round.
    sink = layout.node(node_id("fk-join-0005-subscription-repartition-0006-sink"))
    answer_source = layout.node(node_id("fk-join-0005-subscription-repartition-0006-source"))
    assert sink.rank < subscription.rank < answer_source.rank < response.rank
    assert (sink.sub, answer_source.sub) == (0, 1)
    assert layout.node(node_id("fk-join-0005-result")).rank > response.rank


def test_an_edge_spanning_rows_bends_around_them() -> None:
    layout = layout_topology(fk_enrichment.describe(), "fk-enrichment")
    # The rows store is used by the subscribing processor and, far below, by the result.
    edge = next(e for e in layout.edges if (e.source, e.target) ==
                (store_id("fk-join-0005-rows"), node_id("fk-join-0005-result")))
    store, result = layout.node(edge.source), layout.node(edge.target)
    assert len(edge.points) == 2 + 2 * (result.rank - store.rank - 1)
    for x, y in edge.points[1:-1]:  # a bend point in a row is clear of that row's nodes
        assert not any(n.x <= x <= n.x + n.w and n.y <= y <= n.y + n.h
                       for n in layout.nodes), (x, y)
