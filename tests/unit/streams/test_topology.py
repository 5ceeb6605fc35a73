"""The DSL builds the sub-topologies and partition counts people expect, and refuses
topologies that cannot run with messages that say what to change."""

from __future__ import annotations

import pytest

from streams.app import App
from streams.config import AppConfig, ConfigError
from streams.dsl.topology import TopologyError
from streams.dsl.windows import HoppingWindows, TumblingWindows


def app() -> App:
    return App("topo", bootstrap_servers="127.0.0.1:1")


def test_rekeying_before_a_count_splits_the_topology_at_a_repartition_topic() -> None:
    a = app()
    a.stream("clicks").select_key(lambda k, v: v["page"]).group_by_key().count(store="pages")
    a.stream("orders").group_by_key().count(store="orders-per-user")
    subs = a.topology.sub_topologies()
    (repartition_topic,) = a.topology.repartition_topics
    # Sub-topologies are numbered in the order their first source was declared.
    assert [sorted(s.sources) for s in subs] == [["clicks"], [repartition_topic], ["orders"]]
    assert subs[0].stores == {} and set(subs[1].stores) == {"pages"}
    repartition = a.topology.assign_partitions(subs, {"clicks": 6, "orders": 3}, default=4)
    assert [s.partitions for s in subs] == [6, 6, 3]
    assert repartition == {repartition_topic: 6}
    assert subs[1].task_ids() == [f"1_{p}" for p in range(6)]


def test_a_join_puts_stream_and_table_in_one_co_partitioned_sub_topology() -> None:
    a = app()
    users = a.table("users", store="users")
    a.stream("clicks").join(users, lambda c, u: (c, u)).to("enriched")
    (sub,) = a.topology.sub_topologies()
    assert set(sub.sources) == {"clicks", "users"}
    with pytest.raises(TopologyError, match=r"not co-partitioned \(clicks=4, users=2\)"):
        a.topology.assign_partitions([sub], {"clicks": 4, "users": 2}, default=4)


def test_missing_source_topic_is_a_clear_error() -> None:
    a = app()
    a.stream("nope").to("out")
    with pytest.raises(TopologyError, match=r"source topic nope does not exist; create it "
                                            r"first, or declare it with app.topic\('nope', "
                                            r"partitions=N\)"):
        a.topology.assign_partitions(a.topology.sub_topologies(), {}, default=4)


def test_a_misspelt_source_topic_names_the_topic_meant() -> None:
    a = app()
    a.stream("reading").to("out")
    with pytest.raises(TopologyError, match=r"source topic reading does not exist \(did you "
                                            r"mean 'readings'\?\); create it first"):
        a.topology.assign_partitions(a.topology.sub_topologies(), {"readings": 4}, default=4)


def test_declared_topics_with_a_partition_count_are_the_ones_the_app_creates() -> None:
    a = app()
    a.topic("lines", key_serde="str", partitions=3)
    a.topic("totals", value_serde="json")
    assert a.topology.topics_to_create() == {"lines": 3}
    a.topic("lines", key_serde="str", partitions=3)  # the same declaration again is fine
    with pytest.raises(TopologyError, match="partitions must be >= 1"):
        a.topic("empty", partitions=0)


def test_a_repartition_topic_takes_the_count_of_the_sub_topology_reading_it() -> None:
    a = app()
    users = a.table("users", store="users")
    a.stream("orders").select_key(lambda k, v: v["user"]).join(users, lambda o, u: u).to("out")
    subs = a.topology.sub_topologies()
    counts = a.topology.assign_partitions(subs, {"orders": 8, "users": 4}, default=5)
    (topic,) = a.topology.repartition_topics
    assert counts == {topic: 4}
    assert {tuple(sorted(s.sources)): s.partitions for s in subs} == {
        ("orders",): 8, tuple(sorted(["users", topic])): 4}


def test_a_sub_topology_reading_only_repartition_topics_takes_its_writers_largest_count() -> None:
    a = app()
    left = a.stream("left").repartition()
    right = a.stream("right").repartition()
    left.merge(right).group_by_key().count(store="both")
    subs = a.topology.sub_topologies()
    counts = a.topology.assign_partitions(subs, {"left": 2, "right": 6}, default=4)
    assert [s.partitions for s in subs] == [2, 6, 6]
    assert set(counts.values()) == {6}
    with pytest.raises(TopologyError, match=r"reads several topics, .*\(left=2, right=6\).*"
                                            r"Call .repartition\(\) on the streams"):
        b = app()
        b.stream("left").merge(b.stream("right")).to("out")
        b.topology.assign_partitions(b.topology.sub_topologies(), {"left": 2, "right": 6}, 4)


def test_store_names_are_unique_and_valid() -> None:
    a = app()
    a.stream("a").group_by_key().count(store="c")
    with pytest.raises(TopologyError, match="declared twice"):
        a.stream("b").group_by_key().count(store="c")
    with pytest.raises(ValueError, match="invalid store name"):
        a.stream("d").group_by_key().count(store="../etc")


def test_windows_cover_the_right_ranges() -> None:
    assert TumblingWindows(1000).windows_for(2500) == [(2000, 3000)]
    assert HoppingWindows(1000, 500).windows_for(2500) == [(2000, 3000), (2500, 3500)]
    with pytest.raises(ValueError, match="advance_ms"):
        HoppingWindows(1000, 2000)


def test_config_errors_name_the_setting() -> None:
    with pytest.raises(ConfigError, match="num_threads must be >= 1"):
        AppConfig("a", num_threads=0)
    with pytest.raises(ConfigError, match="num_threads must be int, not 'two'"):
        AppConfig.from_env({"RELAY_NUM_THREADS": "two"}, application_id="a")
    with pytest.raises(ConfigError, match="application_id is required"):
        AppConfig.from_env({})
    with pytest.raises(ConfigError, match="on_error must be"):
        AppConfig("a", on_error="ignore")
    with pytest.raises(ConfigError, match="unknown settings: colour"):
        AppConfig.from_env({}, application_id="a", colour="blue")
    config = AppConfig.from_env(
        {"RELAY_NUM_THREADS": "3", "RELAY_GROUP_INSTANCE_ID": "node-1", "OTHER": "x"},
        application_id="a",
    )
    assert (config.num_threads, config.group_instance_id) == (3, "node-1")


def test_named_steps_keep_their_topics_and_stores_when_steps_are_added_before_them() -> None:
    """A step added upstream in a later version renumbers every unnamed step after it, and so
    renames its repartition topics and stores: in-flight records and state left behind. A
    name keeps them (Kafka Streams' Grouped.as, Repartitioned.as, StreamJoined.withName)."""
    from streams.dsl.joins import JoinWindows

    def internal(extra: bool, named: bool) -> tuple[list[str], list[str], list[str]]:
        app = App("up", bootstrap_servers="127.0.0.1:1")
        a, b = app.stream("a"), app.stream("b")
        if extra:
            a = a.peek(lambda _k, _v: None)
        keyed = a.select_key(lambda _k, v: v)
        (keyed.join(b.select_key(lambda _k, v: v), lambda x, y: [x, y], JoinWindows(1000),
                    name="pairs" if named else None).to("o"))
        (app.stream("c").group_by(lambda _k, v: v, name="by-value" if named else None)
         .count(store="cnt").to_stream().to("o2"))
        rows = app.table("rows", store="rows")
        (rows.join(app.table("refs", store="refs"), lambda x, y: [x, y],
                   foreign_key=lambda v: v, name="ref" if named else None)
         .group_by(lambda k, v: (v, 1), name="regroup" if named else None)
         .count(store="per-ref"))
        d = app.describe()
        stores = sorted(s for sub in d.sub_topologies for s in sub.stores)
        return sorted(d.changelog_topics), sorted(d.repartition_topics), stores

    assert internal(False, True) == internal(True, True)
    assert internal(False, False) != internal(True, False)
    changelogs, repartitions, stores = internal(True, True)
    assert repartitions == ["up-by-value-repartition", "up-pairs-left-repartition",
                            "up-pairs-right-repartition", "up-ref-response-repartition",
                            "up-ref-subscription-repartition", "up-regroup-repartition"]
    assert {"up-pairs-left-changelog", "up-pairs-right-changelog"} <= set(changelogs)
    assert {"ref-rows", "ref-subscriptions"} <= set(stores)


def test_a_step_name_is_unique_and_fit_for_a_topic_name() -> None:
    app = App("up", bootstrap_servers="127.0.0.1:1")
    s = app.stream("a")
    s.repartition(name="again").to("o")
    with pytest.raises(TopologyError, match="repartition topic up-again-repartition is named "
                                            "twice"):
        s.repartition(name="again")
    with pytest.raises(TopologyError, match="name='by value': a step's name becomes part of "
                                            "topic names"):
        s.group_by(lambda _k, v: v, name="by value")


async def test_an_output_topic_neither_existing_nor_declared_is_said_at_start(
        caplog: pytest.LogCaptureFixture) -> None:
    import logging
    from types import SimpleNamespace

    from streams.runtime.app_topics import warn_of_missing_sinks

    app = App("outs", bootstrap_servers="127.0.0.1:1")
    app.topic("made", partitions=3)
    s = app.stream(app.topic("in", partitions=2))
    s.to("made")
    s.to("there")
    s.to("missing")
    s.group_by(lambda _k, v: v).count(store="c").to_stream().to("there")

    async def list_topics() -> list[str]:
        return ["in", "there"]

    admin = SimpleNamespace(list_topics=list_topics)
    with caplog.at_level(logging.INFO, logger="streams.runtime.app_topics"):
        await warn_of_missing_sinks(app.topology, admin,  # type: ignore[arg-type]
                                    app.topology.sub_topologies())
    [warning] = [r.getMessage() for r in caplog.records if r.name == "streams.runtime.app_topics"]
    assert warning.startswith("output topic missing does not exist and is not declared")
    assert "app.topic('missing', partitions=N)" in warning
