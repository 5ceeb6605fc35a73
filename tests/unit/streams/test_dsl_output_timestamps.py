"""Output timestamps as Kafka Streams stamps them (4.4, caching off), computed by hand:

- an aggregation's update (count, reduce, aggregate; windowed or not; a re-grouped table's,
  subtracting or adding) carries the larger of its record's timestamp and the one stored with
  the aggregate it updates (KStreamAggregate, KStreamReduce, KStreamWindowAggregate,
  KTableAggregate, KTableReduce), kept through a restore;
- a table-table join's result the larger of its two rows' timestamps, the row of an
  aggregated table carrying its aggregate's;
- a foreign-key join's answer to a left update the larger of the update's timestamp and the
  right row's (SubscriptionJoinProcessor), an inner join's tombstone for a deleted left row
  too (DELETE_KEY_AND_PROPAGATE); its answer to a right update that update's
  (ForeignTableJoinProcessor); a left join's tombstone for a deleted left row the delete's.
"""

from __future__ import annotations

from typing import Any

from streams import App, HoppingWindows, TopologyTestDriver, TumblingWindows, Windowed


def app() -> App:
    return App("stamps", bootstrap_servers="127.0.0.1:1")


def stamped(driver: TopologyTestDriver, topic: str, key_serde: str | None = None
            ) -> list[tuple[Any, Any, int]]:
    return [(r.key, r.value, r.timestamp_ms) for r in driver.read_output(topic, key_serde)]


def test_an_aggregation_stamps_its_update_with_the_largest_timestamp_aggregated() -> None:
    a = app()
    grouped = a.stream("events").group_by_key()
    grouped.count(store="counts").to_stream().to("counts")
    grouped.reduce(lambda x, y: x + y, store="sums").to_stream().to("sums")
    grouped.aggregate(lambda: 0, lambda _k, v, n: n + v, store="totals").to_stream().to("totals")
    with TopologyTestDriver(a) as driver:
        for key, ts in [("a", 10), ("a", 5), ("b", 3), ("a", 12), ("a", 7)]:
            driver.pipe("events", key, 1, timestamp_ms=ts)
        expected_times = [("a", 10), ("a", 10), ("b", 3), ("a", 12), ("a", 12)]
        assert stamped(driver, "counts") == [
            (k, n, ts) for (k, ts), n in zip(expected_times, [1, 2, 1, 3, 4], strict=True)]
        assert [r[2] for r in stamped(driver, "sums")] == [ts for _, ts in expected_times]
        assert [r[2] for r in stamped(driver, "totals")] == [ts for _, ts in expected_times]


def test_a_windowed_aggregation_stamps_each_window_with_its_largest_timestamp() -> None:
    a = app()
    a.stream("events").group_by_key().windowed_by(TumblingWindows(10, grace_ms=50)).count(
        store="tumbling").to_stream().to("tumbling")
    a.stream("clicks").group_by_key().windowed_by(HoppingWindows(10, 5, grace_ms=50)).count(
        store="hopping").to_stream().to("hopping")
    with TopologyTestDriver(a) as driver:
        for ts in (9, 3, 14):
            driver.pipe("events", "a", 1, timestamp_ms=ts)
            driver.pipe("clicks", "a", 1, timestamp_ms=ts)
        W = Windowed
        assert stamped(driver, "tumbling", "windowed") == [
            (W("a", 0, 10), 1, 9), (W("a", 0, 10), 2, 9), (W("a", 10, 20), 1, 14)]
        # 9 is in [0, 10) and [5, 15); 3 in [0, 10) (and [-5, 5), which does not exist);
        # 14 in [5, 15) and [10, 20).
        assert stamped(driver, "hopping", "windowed") == [
            (W("a", 0, 10), 1, 9), (W("a", 5, 15), 1, 9),
            (W("a", 0, 10), 2, 9),
            (W("a", 5, 15), 2, 14), (W("a", 10, 20), 1, 14)]


def test_a_regrouped_table_stamps_subtractions_and_additions_with_the_groups_time() -> None:
    a = app()
    (a.table("rows", store="rows").group_by(lambda _k, v: (v % 2, v))
     .count(store="per-parity").to_stream().to("counts"))
    (a.table("items", store="items").group_by(lambda _k, v: (v % 2, v))
     .reduce(lambda s, v: s + v, lambda s, v: s - v, store="sums").to_stream().to("sums"))
    with TopologyTestDriver(a) as driver:
        for topic in ("rows", "items"):
            driver.pipe(topic, "x", 1, timestamp_ms=10)   # group 1 from 10
            driver.pipe(topic, "y", 3, timestamp_ms=4)    # group 1 keeps 10
            driver.pipe(topic, "x", 2, timestamp_ms=6)    # out of 1 (at 10), into 0 (at 6)
            driver.pipe(topic, "y", None, timestamp_ms=3)  # out of 1 (at 10)
        assert stamped(driver, "counts") == [
            (1, 1, 10), (1, 2, 10), (1, 1, 10), (0, 1, 6), (1, 0, 10)]
        # A sum of 0 is a value: the group stays.
        assert stamped(driver, "sums") == [
            (1, 1, 10), (1, 4, 10), (1, 3, 10), (0, 2, 6), (1, 0, 10)]


def test_a_table_join_of_an_aggregated_table_takes_the_aggregates_timestamp() -> None:
    a = app()
    counts = a.stream("events").group_by_key().count(store="counts")
    names = a.table("names", store="names")
    counts.join(names, lambda n, name: [name, n]).to_stream().to("joined")
    with TopologyTestDriver(a) as driver:
        driver.pipe("events", "a", 1, timestamp_ms=10)
        driver.pipe("events", "a", 1, timestamp_ms=5)   # the count's row stays at 10
        driver.pipe("names", "a", "Ann", timestamp_ms=7)
        driver.pipe("names", "a", "Anna", timestamp_ms=12)
        assert stamped(driver, "joined") == [
            ("a", ["Ann", 2], 10), ("a", ["Anna", 2], 12)]


def enrichment(left: bool) -> App:
    a = app()
    customers = a.table("customers", store="customers")
    orders = a.table("orders", store="orders")
    join = orders.left_join if left else orders.join
    join(customers, lambda order, customer: [order, customer],
         foreign_key=lambda order: order["customer"]).to_stream().to("enriched")
    return a


def test_a_foreign_key_join_stamps_a_left_update_with_the_newer_of_the_two_rows() -> None:
    with TopologyTestDriver(enrichment(left=False)) as driver:
        driver.pipe("customers", "c1", "Cleo", timestamp_ms=20)
        driver.pipe("orders", "o1", {"customer": "c1"}, timestamp_ms=5)   # right row newer
        driver.pipe("orders", "o2", {"customer": "c1"}, timestamp_ms=30)  # left row newer
        assert stamped(driver, "enriched") == [
            ("o1", [{"customer": "c1"}, "Cleo"], 20),
            ("o2", [{"customer": "c1"}, "Cleo"], 30)]


def test_a_foreign_key_join_stamps_a_right_update_with_its_own_timestamp() -> None:
    with TopologyTestDriver(enrichment(left=False)) as driver:
        driver.pipe("orders", "o1", {"customer": "c1"}, timestamp_ms=10)
        driver.pipe("customers", "c1", "Cleo", timestamp_ms=3)   # older than the order
        assert stamped(driver, "enriched") == [("o1", [{"customer": "c1"}, "Cleo"], 3)]


def test_a_deleted_left_row_of_a_foreign_key_join_is_stamped_as_kafka_streams_does() -> None:
    for left, tombstone_time in ((False, 20), (True, 4)):
        with TopologyTestDriver(enrichment(left=left)) as driver:
            driver.pipe("customers", "c1", "Cleo", timestamp_ms=20)
            driver.pipe("orders", "o1", {"customer": "c1"}, timestamp_ms=2)
            driver.pipe("orders", "o1", None, timestamp_ms=4)
            # Inner: the tombstone comes from the right row's side, with its time too;
            # left: it is answered without a right row, at the delete's time.
            assert stamped(driver, "enriched") == [
                ("o1", [{"customer": "c1"}, "Cleo"], 20), ("o1", None, tombstone_time)]


def test_an_aggregates_timestamp_survives_a_restore_from_its_changelog() -> None:
    a = app()
    a.stream("events").group_by_key().count(store="counts").to_stream().to("counts")
    with TopologyTestDriver(a) as driver:
        driver.pipe("events", "a", 1, timestamp_ms=10)
        driver.restart(from_changelog=True)
        driver.pipe("events", "a", 1, timestamp_ms=2)
        assert stamped(driver, "counts") == [("a", 1, 10), ("a", 2, 10)]
        assert driver.store("counts")["a"] == 2  # store views see the value alone


def test_a_count_restored_from_a_changelog_written_before_timestamps_goes_on() -> None:
    a = app()
    a.stream("events").group_by_key().count(store="counts").to_stream().to("counts")
    with TopologyTestDriver(a) as driver:
        # A plain value, as the store and its changelog held before they kept timestamps.
        (task,) = driver.tasks.values()
        task.stores["counts"].put("a", 5)
        driver.restart(from_changelog=True)
        assert driver.store("counts")["a"] == 5
        driver.pipe("events", "a", 1, timestamp_ms=3)
        # No timestamp stored (-1, as Kafka Streams reads a converted plain value): the
        # record's.
        assert stamped(driver, "counts") == [("a", 6, 3)]
