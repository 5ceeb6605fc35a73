"""The topology description as data (what an app publishes for ``relay web``): sub-topologies,
nodes with their kind, parents and children, stores and topics, written out by hand for a
repartitioned word count, a stream-table join and a windowed count with final results; and
its round trip, from which ``describe()``'s text renders the same."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streams.app import App
from streams.dsl.describe import DESCRIPTION_VERSION, description_from_data
from streams.dsl.windows import TumblingWindows


def app(app_id: str) -> App:
    return App(app_id, bootstrap_servers="127.0.0.1:1")


def node(kind: str, name: str, topics: tuple[str, ...] = (), stores: tuple[str, ...] = (),
         successors: tuple[str, ...] = (), predecessors: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"kind": kind, "name": name, "topics": list(topics), "stores": list(stores),
            "successors": list(successors), "predecessors": list(predecessors)}


def word_count() -> App:
    a = app("wc")
    (a.stream("lines").flat_map_values(lambda line: line.split())
     .select_key(lambda _k, word: word).group_by_key().count(store="counts")
     .to_stream().to("word-counts"))
    return a


def stream_table_join() -> App:
    a = app("enrich")
    users = a.table("users", store="users")
    a.stream("clicks").join(users, lambda click, user: [click, user]).to("enriched")
    return a


def final_counts() -> App:
    a = app("win")
    (a.stream("pageviews").group_by_key()
     .windowed_by(TumblingWindows(size_ms=60_000, grace_ms=0)).count(store="per-minute")
     .suppress(until_window_closes=True).to_stream().to("final"))
    return a


def test_a_repartitioned_word_count() -> None:
    data = word_count().describe().to_data()
    assert data == {
        "version": DESCRIPTION_VERSION,
        "sub_topologies": [
            {"id": 0, "stores": [], "nodes": [
                node("source", "source-0001", topics=("lines",),
                     successors=("flat-map-values-0002",)),
                node("processor", "flat-map-values-0002", successors=("select-key-0003",),
                     predecessors=("source-0001",)),
                node("processor", "select-key-0003",
                     successors=("counts-repartition-0004-sink",),
                     predecessors=("flat-map-values-0002",)),
                node("sink", "counts-repartition-0004-sink",
                     topics=("wc-counts-repartition-0004",),
                     predecessors=("select-key-0003",)),
            ]},
            {"id": 1, "stores": ["counts"], "nodes": [
                node("source", "counts-repartition-0004-source",
                     topics=("wc-counts-repartition-0004",), successors=("aggregate-0005",)),
                node("processor", "aggregate-0005", stores=("counts",),
                     successors=("sink-0006",),
                     predecessors=("counts-repartition-0004-source",)),
                node("sink", "sink-0006", topics=("word-counts",),
                     predecessors=("aggregate-0005",)),
            ]},
        ],
        "topics": {"source": ["lines"], "sink": ["word-counts"],
                   "repartition": ["wc-counts-repartition-0004"],
                   "changelog": ["wc-counts-changelog"]},
        "changelogs": {"counts": "wc-counts-changelog"},
        "global_stores": [],
    }


def test_a_stream_table_join_reads_the_tables_store_in_one_sub_topology() -> None:
    data = stream_table_join().describe().to_data()
    assert data["sub_topologies"] == [{"id": 0, "stores": ["users"], "nodes": [
        node("source", "table-source-0001", topics=("users",), successors=("table-0002",)),
        node("source", "source-0003", topics=("clicks",), successors=("join-0004",)),
        node("processor", "table-0002", stores=("users",),
             predecessors=("table-source-0001",)),
        node("processor", "join-0004", stores=("users",), successors=("sink-0005",),
             predecessors=("source-0003",)),
        node("sink", "sink-0005", topics=("enriched",), predecessors=("join-0004",)),
    ]}]
    assert data["topics"] == {"source": ["clicks", "users"], "sink": ["enriched"],
                              "repartition": [], "changelog": ["enrich-users-changelog"]}
    assert data["changelogs"] == {"users": "enrich-users-changelog"}


def test_a_windowed_count_with_final_results_has_the_buffer_as_a_store() -> None:
    data = final_counts().describe().to_data()
    assert data["sub_topologies"] == [
        {"id": 0, "stores": ["per-minute", "suppress-0003-buffer"], "nodes": [
            node("source", "source-0001", topics=("pageviews",),
                 successors=("window-aggregate-0002",)),
            node("processor", "window-aggregate-0002", stores=("per-minute",),
                 successors=("suppress-0003",), predecessors=("source-0001",)),
            node("processor", "suppress-0003", stores=("suppress-0003-buffer",),
                 successors=("sink-0004",), predecessors=("window-aggregate-0002",)),
            node("sink", "sink-0004", topics=("final",), predecessors=("suppress-0003",)),
        ]}]
    assert data["topics"] == {
        "source": ["pageviews"], "sink": ["final"], "repartition": [],
        "changelog": ["win-per-minute-changelog", "win-suppress-0003-buffer-changelog"]}
    assert data["changelogs"] == {"per-minute": "win-per-minute-changelog",
                                  "suppress-0003-buffer": "win-suppress-0003-buffer-changelog"}


@pytest.mark.parametrize("build", [word_count, stream_table_join, final_counts])
def test_the_data_survives_json_and_renders_describes_text(build: Any) -> None:
    description = build().describe()
    back = description_from_data(json.loads(json.dumps(description.to_data())))
    assert back == description
    assert str(back) == str(description)


@pytest.mark.parametrize(("data", "message"), [
    ([], "is a map"),
    ({"version": 2}, "version 2"),
    ({"version": DESCRIPTION_VERSION}, "malformed topology description"),
    ({**word_count().describe().to_data(), "topics": {"source": "lines"}},
     "malformed topology description"),
    ({**word_count().describe().to_data(),
      "sub_topologies": [{"id": 0, "stores": [], "nodes": [node("widget", "x")]}]},
     "malformed topology description"),
    ({**word_count().describe().to_data(),
      "sub_topologies": [{"id": 0, "stores": [], "nodes": [node("source", "a", ("t",),
                                                                 successors=("b",))]}]},
     "edges to nodes it does not describe: b"),
    ({**word_count().describe().to_data(),
      "sub_topologies": [{"id": 0, "stores": [], "nodes": [node("processor", "a")] * 2}]},
     "a node name appears twice"),
])
def test_anything_else_is_refused_with_what_is_wrong(data: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        description_from_data(data)
