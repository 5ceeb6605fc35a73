"""Co-partitioning by key bytes: both sides of a join (and any pair of topics read by one
task) must put a key in the same partition, which they do only when they encode it the same
way. Run by the topology test driver, which partitions as a broker does."""

from __future__ import annotations

import json

import pytest
from aiokafka.partitioner import murmur2

from streams import App, JoinWindows, TopologyTestDriver
from streams.dsl.topology import TopologyError

CUSTOMERS = [f"customer-{i}" for i in range(60)]


def orders_app(**repartition: str) -> App:
    app = App("shop", bootstrap_servers="127.0.0.1:1")
    app.topic("orders", partitions=3)
    app.topic("customers", key_serde="str", partitions=3)
    customers = app.table("customers", store="customers")
    orders = app.stream("orders").select_key(lambda _k, v: v["customer"])
    if repartition:
        orders = orders.repartition(**repartition)
    orders.join(customers, lambda order, customer: {**order, "name": customer["name"]}).to(
        "enriched")
    return app


def pipe_orders(driver: TopologyTestDriver, n: int) -> None:
    for name in CUSTOMERS:
        driver.pipe("customers", name, {"name": name.upper()})
    for i in range(n):
        driver.pipe("orders", i, {"id": i, "customer": CUSTOMERS[i % len(CUSTOMERS)]})


def test_a_rekeyed_stream_joined_with_a_str_keyed_table_joins_every_order() -> None:
    with TopologyTestDriver(orders_app()) as driver:
        pipe_orders(driver, 300)
        joined = driver.read_output("enriched")
    assert len(joined) == 300
    assert {r.key for r in joined} == set(CUSTOMERS)


def test_the_repartition_topic_feeding_a_join_takes_the_tables_key_serde() -> None:
    app = orders_app()
    [topic] = app.topology.repartition_topics
    with TopologyTestDriver(app) as driver:
        pipe_orders(driver, 10)
        records = driver.read_output(topic, key_serde="bytes")
    assert [r.key for r in records] == [CUSTOMERS[i].encode() for i in range(10)]


def test_repartition_with_the_tables_key_serde_is_accepted() -> None:
    with TopologyTestDriver(orders_app(key_serde="str")) as driver:
        pipe_orders(driver, 120)
        assert len(driver.read_output("enriched")) == 120


def test_a_repartition_with_another_key_serde_than_the_joined_table_is_refused() -> None:
    with pytest.raises(TopologyError) as caught:
        TopologyTestDriver(orders_app(key_serde="msgpack"))
    message = str(caught.value)
    assert "\n" not in message
    assert "msgpack" in message and "str" in message and "customers" in message


def test_a_stream_and_a_table_read_with_different_key_serdes_are_refused() -> None:
    app = App("shop", bootstrap_servers="127.0.0.1:1")
    app.topic("customers", key_serde="str", partitions=3)
    app.topic("orders", partitions=3)
    customers = app.table("customers", store="customers")
    app.stream("orders").join(customers, lambda o, c: o).to("enriched")
    expected = "customers with key serde str and orders with key serde msgpack"
    with pytest.raises(TopologyError, match=expected):
        TopologyTestDriver(app)


def test_group_by_chooses_the_repartition_topics_serdes() -> None:
    app = App("shop", bootstrap_servers="127.0.0.1:1")
    app.topic("orders", partitions=3)
    (app.stream("orders").group_by(lambda _k, v: v["customer"], key_serde="str",
                                   value_serde="json")
        .count(store="orders-per-customer").to_stream().to("counts", key_serde="str"))
    [topic] = app.topology.repartition_topics
    with TopologyTestDriver(app) as driver:
        driver.pipe("orders", 1, {"customer": "ann"})
        [record] = driver.read_output(topic, key_serde="bytes", value_serde="bytes")
        assert record.key == b"ann" and json.loads(record.value) == {"customer": "ann"}
        assert driver.read_key_value_map("counts") == {"ann": 1}


@pytest.mark.parametrize("partitions", [3, 4, 7])
def test_the_driver_partitions_by_murmur2_of_the_serialized_key(partitions: int) -> None:
    app = App("shop", bootstrap_servers="127.0.0.1:1")
    app.topic("customers", key_serde="str", partitions=partitions)
    app.table("customers", store="customers")
    with TopologyTestDriver(app) as driver:
        for name in CUSTOMERS:
            driver.pipe("customers", name, {"name": name})
        records = driver.read_output("customers", key_serde="bytes")
    assert records and all(
        r.partition == (murmur2(r.key) & 0x7FFFFFFF) % partitions for r in records)


def str_keyed_app(name: str) -> App:
    app = App(name, bootstrap_servers="127.0.0.1:1")
    for topic in ("users", "clicks", "orders", "products", "scores"):
        app.topic(topic, key_serde="str", value_serde="json", partitions=4)
    return app


def test_a_rekeyed_stream_joined_with_a_table_read_from_a_str_keyed_stream_joins_all() -> None:
    app = str_keyed_app("clicks")
    users = app.stream("users").to_table(store="users")
    (app.stream("clicks").select_key(lambda _k, v: v["user"])
        .join(users, lambda click, user: {**click, **user}).to("out"))
    with TopologyTestDriver(app) as driver:
        for i in range(8):
            driver.pipe("users", f"u{i}", {"name": f"n{i}"})
        for i in range(8):
            driver.pipe("clicks", "x", {"user": f"u{i}"})
        assert sorted(driver.read_key_values("out")) == [
            (f"u{i}", {"user": f"u{i}", "name": f"n{i}"}) for i in range(8)]
        assert driver.dead_letters == []


def test_a_foreign_key_join_of_a_table_read_from_a_str_keyed_stream_answers_it() -> None:
    app = str_keyed_app("fk")
    products = app.table("products", store="products")
    orders = app.stream("orders").to_table(store="orders-table")
    orders.join(products, lambda o, p: [o, p], foreign_key=lambda o: o["sku"]
                ).to_stream().to("out")
    with TopologyTestDriver(app) as driver:
        for i in range(6):
            driver.pipe("products", f"s{i}", {"t": i})
        for i in range(6):
            driver.pipe("orders", f"o{i}", {"sku": f"s{5 - i}"})
        assert sorted(driver.read_key_values("out")) == [
            (f"o{i}", [{"sku": f"s{5 - i}"}, {"t": 5 - i}]) for i in range(6)]


def test_tables_derived_from_str_keyed_topics_stay_partitioned_by_their_keys() -> None:
    # A table-table join, a suppression and a stream-stream join keep the key serde of what
    # they came from, so a re-keyed stream joined with them is repartitioned alike.
    app = str_keyed_app("derived")
    users = app.table("users", store="users")
    scores = app.table("scores", store="scores")
    profiles = users.join(scores, lambda u, s: {**u, **s}).suppress(time_limit_ms=0)
    (app.stream("clicks").select_key(lambda _k, v: v["user"])
        .join(profiles, lambda click, profile: profile["score"]).to("out"))
    with TopologyTestDriver(app) as driver:
        for i in range(8):
            driver.pipe("users", f"u{i}", {"name": f"n{i}"})
            driver.pipe("scores", f"u{i}", {"score": i})
        for i in range(8):
            driver.pipe("clicks", "x", {"user": f"u{i}"})
        assert sorted(driver.read_key_values("out")) == [(f"u{i}", i) for i in range(8)]


def test_a_count_of_a_stream_stream_join_is_partitioned_as_its_str_keyed_inputs() -> None:
    app = str_keyed_app("pairs")
    clicks, orders = app.stream("clicks"), app.stream("orders")
    pairs = clicks.join(orders, lambda c, o: 1, JoinWindows(60_000)).group_by_key().count(
        store="pairs")
    (app.stream("scores").select_key(lambda _k, v: v["user"])
        .join(pairs, lambda _score, n: n).to("out"))
    with TopologyTestDriver(app) as driver:
        for i in range(8):
            driver.pipe("clicks", f"u{i}", {}, timestamp_ms=1_000)
            driver.pipe("orders", f"u{i}", {}, timestamp_ms=2_000)
        for i in range(8):
            driver.pipe("scores", "x", {"user": f"u{i}"}, timestamp_ms=3_000)
        assert sorted(driver.read_key_values("out")) == [(f"u{i}", 1) for i in range(8)]
