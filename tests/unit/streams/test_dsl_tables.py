"""Tables as first-class values on the topology test driver: filter, map_values, to_table,
table-table joins and re-grouped aggregations, tombstones included. Expected outputs are
worked out by hand from Kafka Streams' semantics (see docs/dsl.md)."""

from __future__ import annotations

from typing import Any

import pytest

from streams import App, TopologyTestDriver


def app() -> App:
    return App("tables", bootstrap_servers="127.0.0.1:1")


def test_filter_and_map_values_forward_tombstones_for_rows_that_leave() -> None:
    a = app()
    (a.table("prices", store="prices").filter(lambda _k, v: v > 2)
     .map_values(lambda v: v * 10).to_stream().to("out"))
    a.table("other", store="other").filter_not(lambda _k, v: v > 2).to_stream().to("small")
    with TopologyTestDriver(a) as driver:
        driver.pipe_all("prices", [("a", 5), ("b", 1), ("a", 7), ("a", 0), ("b", None)])
        # "b" never passes: a filter of a stored table sends no tombstone for a row it
        # never held (Kafka Streams' filter gets the old value from its parent).
        assert driver.read_key_values("out") == [("a", 50), ("a", 70), ("a", None)]
        driver.pipe_all("other", [("x", 1), ("x", 3)])
        assert driver.read_key_values("small") == [("x", 1), ("x", None)]


def test_a_filtered_table_is_materialized_for_a_stream_table_join() -> None:
    a = app()
    vip = a.table("users", store="users").filter(lambda _k, u: u["vip"])
    a.stream("orders").join(vip, lambda order, user: f"{user['name']}:{order}").to("out")
    with TopologyTestDriver(a) as driver:
        driver.pipe("users", "u1", {"name": "Ann", "vip": True})
        driver.pipe("users", "u2", {"name": "Bob", "vip": False})
        driver.pipe_all("orders", [("u1", 5), ("u2", 6)])
        driver.pipe("users", "u1", {"name": "Ann", "vip": False})
        driver.pipe("orders", "u1", 7)
        assert driver.read_key_values("out") == [("u1", "Ann:5")]


def test_stream_to_table_keeps_the_latest_value_and_re_keys_through_a_topic() -> None:
    a = app()
    table = a.stream("events").select_key(lambda _k, v: v["user"]).to_table(store="latest")
    table.to_stream().to("out")
    with TopologyTestDriver(a) as driver:
        driver.pipe_all("events", [(1, {"user": "ann", "n": 1}), (2, {"user": "bob", "n": 2}),
                                   (3, {"user": "ann", "n": 3})])
        assert driver.read_key_value_map("out") == {"ann": {"user": "ann", "n": 3},
                                                   "bob": {"user": "bob", "n": 2}}
        assert driver.store("latest")["ann"] == {"user": "ann", "n": 3}
        assert any("to-table-repartition" in t for t in a.topology.repartition_topics)


def joined_app(kind: str) -> App:
    a = app()
    left = a.table("left", store="left")
    right = a.table("right", store="right")
    join = getattr(left, {"inner": "join", "left": "left_join", "outer": "outer_join"}[kind])
    join(right, lambda lv, rv: f"{lv}-{rv}").to_stream().to("out")
    return a


STEPS = [("left", "a", 1, 10), ("right", "a", "x", 20), ("left", "a", 2, 5),
         ("right", "a", None, 30), ("right", "b", "y", 40), ("left", "a", None, 50),
         ("left", "b", 3, 60), ("right", "b", None, 70), ("left", "b", None, 80)]


def run_steps(kind: str) -> list[tuple[Any, Any, int]]:
    with TopologyTestDriver(joined_app(kind)) as driver:
        for topic, key, value, ts in STEPS:
            driver.pipe(topic, key, value, timestamp_ms=ts)
        return [(r.key, r.value, r.timestamp_ms) for r in driver.read_output("out")]


def test_table_table_inner_join_updates_and_deletes() -> None:
    assert run_steps("inner") == [
        ("a", "1-x", 20),     # right arrives: max(10, 20)
        ("a", "2-x", 20),     # left update at 5 joins the right row of 20
        ("a", None, 30),      # right deleted: the result goes
        ("b", "3-y", 60),
        ("b", None, 70),
    ]


def test_table_table_left_join_updates_and_deletes() -> None:
    assert run_steps("left") == [
        ("a", "1-None", 10),
        ("a", "1-x", 20),
        ("a", "2-x", 20),
        ("a", "2-None", 30),
        ("a", None, 50),      # the left row goes: so does its result
        ("b", "3-y", 60),
        ("b", "3-None", 70),
        ("b", None, 80),
    ]


def test_table_table_outer_join_updates_and_deletes() -> None:
    assert run_steps("outer") == [
        ("a", "1-None", 10),
        ("a", "1-x", 20),
        ("a", "2-x", 20),
        ("a", "2-None", 30),
        ("b", "None-y", 40),
        ("a", None, 50),
        ("b", "3-y", 60),
        ("b", "3-None", 70),
        ("b", None, 80),
    ]


def test_table_table_join_is_restored_from_its_changelog() -> None:
    with TopologyTestDriver(joined_app("inner")) as driver:
        driver.pipe("left", "a", 1, timestamp_ms=1)
        driver.restart(from_changelog=True)
        driver.pipe("right", "a", "x", timestamp_ms=2)
        assert driver.read_key_values("out") == [("a", "1-x")]


def regrouped_app() -> App:
    a = app()
    users = a.table("users", store="users")
    by_region = users.group_by(lambda _user, u: (u["region"], u["score"]))
    by_region.count(store="region-counts").to_stream().to("counts")
    by_region.reduce(lambda agg, v: agg + v, lambda agg, v: agg - v,
                     store="region-scores").to_stream().to("scores")
    by_region.aggregate(lambda: [], lambda _k, v, agg: sorted([*agg, v]),
                        lambda _k, v, agg: [x for x in agg if x != v],
                        store="region-lists").to_stream().to("lists")
    return a


def test_a_regrouped_table_moves_a_row_from_its_old_group_to_its_new_one() -> None:
    with TopologyTestDriver(regrouped_app(), partitions=2) as driver:
        driver.pipe("users", "ann", {"region": "eu", "score": 3})
        driver.pipe("users", "bob", {"region": "eu", "score": 4})
        driver.pipe("users", "ann", {"region": "us", "score": 5})   # changes group
        driver.pipe("users", "bob", {"region": "eu", "score": 6})   # same group, new value
        driver.pipe("users", "bob", None)                            # leaves
        assert driver.read_key_values("counts") == [
            ("eu", 1), ("eu", 2), ("eu", 1), ("us", 1), ("eu", 1), ("eu", 0)]
        assert driver.read_key_values("scores") == [
            ("eu", 3), ("eu", 7), ("eu", 4), ("us", 5), ("eu", 6), ("eu", 0)]
        assert driver.read_key_values("lists") == [
            ("eu", [3]), ("eu", [3, 4]), ("eu", [4]), ("us", [5]), ("eu", [6]), ("eu", [])]
        driver.restart(from_changelog=True)
        driver.pipe("users", "ann", None)
        assert driver.read_key_values("counts") == [("us", 0)]
        assert driver.store("region-counts").to_dict() == {"eu": 0, "us": 0}


def test_a_stream_joins_a_global_table_by_a_key_it_chooses_without_co_partitioning() -> None:
    a = app()
    products = a.global_table("products", store="products")
    orders = a.stream("orders")
    orders.join(products, lambda _id, o: o["sku"], lambda o, p: f"{o['n']}x{p}").to("named")
    orders.left_join(products, lambda _id, o: o["sku"], lambda o, p: [o["n"], p]).to("all")
    with TopologyTestDriver(a, partitions={"orders": 3, "products": 2}) as driver:
        driver.pipe("products", "s1", "pen")
        driver.pipe_all("orders", [(1, {"sku": "s1", "n": 2}), (2, {"sku": "s9", "n": 1})])
        driver.pipe("products", "s1", None)
        driver.pipe("orders", 3, {"sku": "s1", "n": 5})
        assert driver.read_key_values("named") == [(1, "2xpen")]
        assert driver.read_key_values("all") == [(1, [2, "pen"]), (2, [1, None]),
                                                 (3, [5, None])]
    assert "products (topic: products)" in str(a.describe())


def test_a_bad_record_of_a_global_tables_topic_is_skipped_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    a = app()
    a.topic("pages", key_serde="str", value_serde="json")
    pages = a.global_table("pages", store="pages")
    a.stream("hits").left_join(pages, lambda _k, v: v, lambda hit, page: [hit, page]).to("out")
    with TopologyTestDriver(a) as driver:
        driver.pipe("pages", "p1", {"title": "home"})
        driver.pipe_raw("pages", b"p1", b"{bad json")       # skipped: p1 keeps its row
        driver.pipe_raw("pages", b"p2", b"{bad json")
        driver.pipe_all("hits", [(1, "p1"), (2, "p2")])
        assert driver.read_key_values("out") == [(1, ["p1", {"title": "home"}]),
                                                 (2, ["p2", None])]
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "streams.dsl.global_tables" and r.levelname == "WARNING"]
    assert len(warnings) == 2 and all(w.startswith(
        "global table pages: record of pages (piped) skipped: SerdeError: not valid JSON")
        for w in warnings)


def fk_app(left: bool) -> App:
    a = app()
    orders, users = a.table("orders", store="orders"), a.table("users", store="users")
    join = orders.left_join if left else orders.join
    join(users, lambda o, u: f"{o['n']}:{u}", foreign_key=lambda o: o["user"]
         ).to_stream().to("out")
    return a


FK_STEPS = [("users", "u1", "Ann"), ("orders", "o1", {"user": "u1", "n": 1}),
            ("orders", "o2", {"user": "u2", "n": 2}), ("users", "u2", "Bob"),
            ("orders", "o1", {"user": "u2", "n": 1}),   # its foreign key changes
            ("users", "u1", "Ann2"),                     # o1 no longer follows u1
            ("users", "u2", None), ("orders", "o2", None)]


@pytest.mark.parametrize("left", [False, True])
def test_a_foreign_key_join_follows_updates_and_deletes_of_both_sides(left: bool) -> None:
    with TopologyTestDriver(fk_app(left), partitions={"orders": 3, "users": 2}) as driver:
        for topic, key, value in FK_STEPS:
            driver.pipe(topic, key, value)
        none_2 = "2:None" if left else None
        # An inner join's new row without its right row writes nothing (no tombstone), as
        # Kafka Streams does.
        assert driver.read_key_values("out") == [
            ("o1", "1:Ann"), *([("o2", none_2)] if left else []), ("o2", "2:Bob"),
            ("o1", "1:Bob"), ("o1", "1:None" if left else None), ("o2", none_2), ("o2", None)]
        driver.restart(from_changelog=True)   # subscriptions and rows come back
        driver.pipe("users", "u2", "Bo")
        driver.pipe("orders", "o3", {"user": "u2", "n": 3})
        assert driver.read_key_values("out") == [("o1", "1:Bo"), ("o3", "3:Bo")]
