"""Where the differential tests (tests/broker/differential) found Relay's DSL writing other records
than Kafka Streams: each difference, fixed, pinned here with the topology test driver."""

from __future__ import annotations

from pathlib import Path

from streams import (
    App,
    JoinWindows,
    SessionWindows,
    TopologyTestDriver,
    TumblingWindows,
    Windowed,
)


def app() -> App:
    return App("parity", bootstrap_servers="127.0.0.1:1")


def test_grouped_aggregations_skip_tombstones_and_windowed_ones_take_them() -> None:
    a = app()
    grouped = a.stream("events").group_by_key()
    grouped.count(store="counts").to_stream().to("counts")
    grouped.reduce(lambda x, y: x + y, store="sums").to_stream().to("sums")
    grouped.aggregate(lambda: 0, lambda _k, v, n: n + v, store="totals").to_stream().to("totals")
    windowed = a.stream("clicks").group_by_key().windowed_by(TumblingWindows(10))
    windowed.count(store="per-window").to_stream().to("per-window")
    with TopologyTestDriver(a) as driver:
        for value in (1, None, 2):
            driver.pipe("events", "k", value, timestamp_ms=1)
            driver.pipe("clicks", "k", value, timestamp_ms=1)
        assert driver.read_key_values("counts") == [("k", 1), ("k", 2)]
        assert driver.read_key_values("sums") == [("k", 1), ("k", 3)]
        assert driver.read_key_values("totals") == [("k", 1), ("k", 3)]
        assert [v for _, v in driver.read_key_values("per-window", key_serde="windowed")] == [
            1, 2, 3]
        assert driver.dead_letters == []


def test_a_stream_table_join_drops_tombstones_inner_and_left() -> None:
    a = app()
    users = a.table("users", store="users")
    a.stream("clicks").join(users, lambda v, u: (v, u)).to("inner")
    a.stream("views").left_join(users, lambda v, u: (v, u)).to("left")
    with TopologyTestDriver(a) as driver:
        driver.pipe("users", "u", "Ursula")
        for topic in ("clicks", "views"):
            driver.pipe(topic, "u", None)
            driver.pipe(topic, "u", 1)
        assert driver.read_key_values("inner") == [("u", [1, "Ursula"])]
        assert driver.read_key_values("left") == [("u", [1, "Ursula"])]


def test_a_left_join_after_a_key_change_answers_records_whose_new_key_is_none() -> None:
    a = app()
    users = a.table("users", store="users")
    a.stream("clicks").select_key(lambda _k, v: v.get("user")).left_join(
        users, lambda v, u: [v["n"], u]).to("joined")
    with TopologyTestDriver(a) as driver:
        driver.pipe("users", "u", "Ursula")
        driver.pipe("clicks", None, {"user": "u", "n": 1})
        driver.pipe("clicks", None, {"n": 2})
        assert driver.read_key_values("joined") == [("u", [1, "Ursula"]), (None, [2, None])]
        assert driver.dead_letters == []


def test_windows_close_by_the_time_of_records_reaching_the_aggregation(tmp_path: Path) -> None:
    a = app()
    (
        a.stream("ticks").filter(lambda _k, v: v != "skip").group_by_key()
        .windowed_by(TumblingWindows(5)).count(store="ticks").to_stream().to("windows")
    )
    with TopologyTestDriver(a, state_dir=tmp_path) as driver:
        driver.pipe("ticks", "k", "skip", timestamp_ms=50)  # filtered: closes no window
        driver.pipe("ticks", "k", "a", timestamp_ms=2)
        driver.pipe("ticks", "k", "b", timestamp_ms=20)
        driver.restart(from_changelog=True)  # the aggregation's own time is restored
        driver.pipe("ticks", "k", "c", timestamp_ms=3)  # [0, 5) closed at 20
        driver.pipe("ticks", "k", "d", timestamp_ms=21)
        assert driver.read_key_values("windows", key_serde="windowed") == [
            (Windowed("k", 0, 5), 1), (Windowed("k", 20, 25), 1), (Windowed("k", 20, 25), 2)]
        assert driver.late_records_dropped == 1


def test_a_record_without_a_key_is_dropped_where_one_is_needed_and_the_rest_goes_on() -> None:
    a = app()
    pairs = a.stream("pairs").flat_map(lambda k, v: [(k, v), (k, v + 1)])
    pairs.to("all")
    pairs.group_by_key().count(store="counts").to_stream().to("counts")
    with TopologyTestDriver(a) as driver:
        driver.pipe("pairs", None, 1)
        driver.pipe("pairs", "k", 5)
        # Both outputs of the keyless record reach the topic that needs no key; the input
        # record is dead-lettered once, for the step that needed one.
        assert driver.read_key_values("all") == [(None, 1), (None, 2), ("k", 5), ("k", 6)]
        assert driver.read_key_values("counts") == [("k", 1), ("k", 2)]
        assert [d.stage for d in driver.dead_letters] == ["process"]
        assert "has no key" in driver.dead_letters[0].error


def test_records_a_stream_join_skips_still_advance_its_stream_time() -> None:
    a = app()
    a.stream("left").left_join(a.stream("right"), lambda v, o: [v, o],
                               JoinWindows(0, 5)).to("joined")
    with TopologyTestDriver(a) as driver:
        driver.pipe("left", "k", None, timestamp_ms=10)  # skipped, but stream time is 10
        driver.pipe("left", "k", 1, timestamp_ms=0)  # its window closed at 5: emitted at once
        assert [(r.key, r.value, r.timestamp_ms) for r in driver.read_output("joined")] == [
            ("k", [1, None], 0)]


def test_a_stream_left_join_after_a_key_change_answers_records_whose_new_key_is_none() -> None:
    a = app()
    clicks = a.stream("clicks").select_key(lambda _k, v: v.get("user"))
    clicks.left_join(a.stream("views"), lambda v, o: [v["n"], o],
                     JoinWindows(5)).to("joined")
    with TopologyTestDriver(a) as driver:
        driver.pipe("clicks", "c", {"n": 2}, timestamp_ms=1)
        # Kafka Streams (KIP-962) takes it through the repartition topic, then joins it
        # with nothing at once.
        assert driver.read_key_values("joined") == [(None, [2, None])]
        assert driver.dead_letters == []


def test_a_filter_of_a_stored_table_sends_no_tombstone_for_a_row_it_never_held() -> None:
    a = app()
    a.stream("prices").to_table(store="prices").filter(lambda _k, v: v > 2).to_stream().to(
        "expensive")
    with TopologyTestDriver(a) as driver:
        driver.pipe_all("prices", [("a", None), ("b", 1), ("b", 5), ("b", 0), ("b", None)])
        assert driver.read_key_values("expensive") == [("b", 5), ("b", None)]


def test_a_new_row_of_a_foreign_key_inner_join_without_its_right_row_writes_nothing() -> None:
    a = app()
    users = a.table("users", store="users")
    orders = a.table("orders", store="orders")
    orders.join(users, lambda o, u: [o["n"], u], foreign_key=lambda o: o["user"]).to_stream(
    ).to("enriched")
    with TopologyTestDriver(a) as driver:
        driver.pipe("orders", "o1", {"user": "u", "n": 1})  # no user yet: no result, no delete
        driver.pipe("users", "u", "Ursula")
        driver.pipe("orders", "o1", {"user": "v", "n": 2})  # an update: its result goes
        assert driver.read_key_values("enriched") == [("o1", [1, "Ursula"]), ("o1", None)]


def _outputs(driver: TopologyTestDriver, topic: str) -> list[tuple[object, object, int]]:
    return [(r.key, r.value, r.timestamp_ms) for r in driver.read_output(topic)]


def test_an_unmatched_record_whose_window_end_is_past_is_emitted_at_once_within_grace() -> None:
    a = app()
    a.stream("left").left_join(a.stream("right"), lambda v, o: [v, o],
                               JoinWindows(0, 5, grace_ms=3)).to("joined")
    with TopologyTestDriver(a) as driver:
        driver.pipe("left", "k", 1, timestamp_ms=6)  # waits until stream time 15
        # Its window ended at 5, before the stream time 6: Kafka Streams emits it at once,
        # the grace period notwithstanding.
        driver.pipe("left", "k", 2, timestamp_ms=0)
        assert _outputs(driver, "joined") == [("k", [2, None], 0)]
        driver.pipe("right", "x", 9, timestamp_ms=14)  # 6 + 5 + 3 is not behind 14
        assert _outputs(driver, "joined") == []
        driver.pipe("right", "x", 9, timestamp_ms=15)
        assert _outputs(driver, "joined") == [("k", [1, None], 6)]


def test_closed_unmatched_records_wait_for_the_arriving_sides_window_past_the_min_time() -> None:
    a = app()
    a.stream("left").outer_join(a.stream("right"), lambda v, o: [v, o],
                                JoinWindows(0, 10)).to("joined")
    with TopologyTestDriver(a) as driver:
        driver.pipe("right", "a", 1, timestamp_ms=0)  # its window closes past 0
        # Kafka Streams looks for closed records only when its smallest time (0) plus the
        # arriving side's after (10 for a left record) is behind the stream time (5): not yet.
        driver.pipe("left", "b", 2, timestamp_ms=5)
        assert _outputs(driver, "joined") == []
        # A right record looks ahead 0: 0 + 0 < 6, so it looks, and "a" has closed.
        driver.pipe("right", "c", 3, timestamp_ms=6)
        assert _outputs(driver, "joined") == [("a", [None, 1], 0)]


def test_closed_unmatched_records_come_out_in_kafka_streams_store_order() -> None:
    a = app()
    a.stream("left").outer_join(a.stream("right"), lambda v, o: [v, o],
                                JoinWindows(5)).to("joined")
    with TopologyTestDriver(a) as driver:
        driver.pipe("left", -1, "l-1", timestamp_ms=0)
        driver.pipe("left", 2, "l2", timestamp_ms=0)
        driver.pipe("right", 3, "r3", timestamp_ms=0)
        driver.pipe("right", 4, "r4", timestamp_ms=20)
        # By time, then a right record before a left one, then by the key's long bytes:
        # a negative key after the others.
        assert _outputs(driver, "joined") == [
            (3, [None, "r3"], 0), (2, ["l2", None], 0), (-1, ["l-1", None], 0)]


def _filtered_enrichment(regrouped: bool) -> App:
    a = app()
    users = a.table("users", store="users")
    orders = a.table("orders", store="orders")
    kept = orders.left_join(users, lambda o, u: [o["n"], u],
                            foreign_key=lambda o: o["user"]).filter(lambda _k, v: v[1] is not None)
    kept.to_stream().to("kept")
    if regrouped:
        kept.group_by(lambda k, v: (v[1], k)).count(store="per-user").to_stream().to("per-user")
    return a


def test_a_filter_of_a_foreign_key_join_re_grouped_downstream_keeps_its_rows() -> None:
    for regrouped in (False, True):
        with TopologyTestDriver(_filtered_enrichment(regrouped)) as driver:
            driver.pipe("users", "u", "Ursula")
            driver.pipe("orders", "o1", {"user": "x", "n": 1})  # no user x: filtered out
            driver.pipe("orders", "o2", {"user": "u", "n": 2})
            # A re-grouping makes Kafka Streams materialize the join's result and send old
            # values down: the filter then knows o1 was never in it. Without, it does not.
            never_held = [] if regrouped else [("o1", None)]
            assert driver.read_key_values("kept") == [*never_held, ("o2", [2, "Ursula"])]
            if regrouped:
                assert driver.read_key_values("per-user") == [("Ursula", 1)]


def test_a_table_joined_twice_is_read_with_its_update_by_the_join_reached_through_the_other(
) -> None:
    a = app()
    left, right = a.table("left", store="left"), a.table("right", store="right")
    add = lambda x, y: x + y  # noqa: E731
    left.join(right, add).join(right, add).to_stream().to("joined")
    with TopologyTestDriver(a) as driver:
        driver.pipe("left", 1, 5, timestamp_ms=1)
        driver.pipe("right", 1, 7, timestamp_ms=2)
        driver.pipe("right", 1, 8, timestamp_ms=3)
        # Each update of "right" reaches the second join twice: through the first join (whose
        # result the second joins with "right" as its store already holds it, in Kafka
        # Streams), then directly.
        assert _outputs(driver, "joined") == [(1, 19, 2), (1, 19, 2), (1, 21, 3), (1, 21, 3)]


def test_an_update_of_a_foreign_key_inner_join_row_keeping_its_missing_key_writes_nothing(
) -> None:
    a = app()
    users = a.table("users", store="users")
    orders = a.table("orders", store="orders")
    orders.join(users, lambda o, u: [o["n"], u], foreign_key=lambda o: o["user"]).to_stream(
    ).to("enriched")
    with TopologyTestDriver(a) as driver:
        driver.pipe("orders", "o1", {"user": "x", "n": 1})  # no user x: no result
        driver.pipe("orders", "o1", {"user": "x", "n": 2})  # same key: still none, no delete
        assert driver.read_key_values("enriched") == []
        # Another foreign key: Kafka Streams cannot tell whether the old one joined, and
        # deletes the result (PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE).
        driver.pipe("orders", "o1", {"user": "y", "n": 3})
        assert driver.read_key_values("enriched") == [("o1", None)]


def test_each_side_of_a_stream_join_expires_its_records_by_its_own_time() -> None:
    for first, expected in (
            # The left store's own time is 5: it answers from 5 - 5 + 1 = 1 on.
            (("left", 1, "x", 5), [(0, ["b", "r"], 5)]),
            # The join's time is 10, but the left store's is 1: both are still there.
            (("right", 3, "s", 10), [(0, ["a", "r"], 5), (0, ["b", "r"], 5)])):
        a = app()
        a.stream("left").join(a.stream("right"), lambda v, o: [v, o],
                              JoinWindows(0, 5)).to("joined")
        with TopologyTestDriver(a) as driver:
            topic, key, value, timestamp = first
            if topic == "right":
                driver.pipe(topic, key, value, timestamp_ms=timestamp)
            driver.pipe("left", 0, "a", timestamp_ms=0)
            driver.pipe("left", 0, "b", timestamp_ms=1)
            if topic == "left":
                driver.pipe(topic, key, value, timestamp_ms=timestamp)
            driver.pipe("right", 0, "r", timestamp_ms=5)
            assert _outputs(driver, "joined") == expected


def test_a_table_join_sends_a_tombstone_for_a_row_never_held_when_the_other_side_has_one(
) -> None:
    a = app()
    left, right = a.table("left", store="left"), a.table("right", store="right")
    left.join(right, lambda x, y: [x, y]).to_stream().to("inner-joined")
    left.left_join(right, lambda x, y: [x, y]).to_stream().to("left-joined")
    with TopologyTestDriver(a) as driver:
        driver.pipe("left", 1, "a")
        driver.pipe("right", 1, None)  # "right" never held 1; "left" does
        driver.pipe("right", 2, "b")
        driver.pipe("left", 2, None)  # "left" never held 2; "right" does
        driver.pipe("left", 3, None)  # neither holds 3: nothing
        assert driver.read_key_values("inner-joined") == [(1, None), (2, None)]
        assert driver.read_key_values("left-joined") == [
            (1, ["a", None]), (1, ["a", None]), (2, None)]


def test_a_late_record_does_not_merge_a_session_the_segmented_store_no_longer_answers() -> None:
    """Gap 20, no grace: Kafka Streams' session store keeps 20 + 0 ms and answers
    ``findSessions`` with the sessions ending at or after its time - 20 + 1.

    - t=0: no session; [0,0]=1.
    - t=21: looks for sessions ending from max(21 - 20, 0 - 20 + 1) = 1: [0,0] ends at 0,
      before; so [21,21]=1, not merged (as without the store's limit: 0 < 21 - 20).
    - t=34: sessions ending from max(14, 21 - 20 + 1) = 14: [21,21]; merged, [21,34]=2.
    - t=1, late but accepted: sessions ending from max(1 - 20, 34 - 20 + 1) = 15, starting
      by 1 + 20 = 21: [21,34] only. [0,0], within the gap of 1 but ending before 15, is not
      answered: [1,34]=3 (its end 34 is not behind the close time 34 - 20 - 0 = 14), where
      merging [0,0] too would give [0,34]=4. [0,0] stays as it was.
    """
    a = app()
    a.stream("clicks").group_by_key().windowed_by(SessionWindows(20)).count(
        store="sessions").to_stream().to("sessions")
    with TopologyTestDriver(a) as driver:
        for timestamp in (0, 21, 34, 1):
            driver.pipe("clicks", "k", "x", timestamp_ms=timestamp)
        assert [(r.key, r.value, r.timestamp_ms)
                for r in driver.read_output("sessions", key_serde="windowed")] == [
            (Windowed("k", 0, 0), 1, 0),
            (Windowed("k", 21, 21), 1, 21),
            (Windowed("k", 21, 21), None, 21), (Windowed("k", 21, 34), 2, 34),
            (Windowed("k", 21, 34), None, 34), (Windowed("k", 1, 34), 3, 34)]
        assert driver.late_records_dropped == 0


def test_a_keyless_record_crossing_a_stream_joins_repartition_topic_advances_its_time() -> None:
    """A left join (before 0, after 5, no grace) whose right side changed its key; the
    right record's new key is None. Kafka Streams' repartition topics filter nothing, so it
    reaches the join, which counts its time in the shared stream time and then skips it.

    - left 0=0 at 0: no right record; its window ends at 0 + 5, not behind the stream time
      0: it waits in the outer store (min time 0).
    - left 0=None at 0: skipped (no value); the stream time stays 0.
    - right None at 9, through the repartition topic: the stream time is 9; skipped.
    - left 0=0 at 6: no right record; 6 + 5 is not behind 9, so it waits too. It is not at
      the stream time (9), so the join does not look for closed records: nothing. (Had the
      keyless record not reached the join, the stream time would be 6, the join would look,
      0 + 5 < 6, and emit 0=[0, None] at 0.)
    - left 1=1 at 11, at the stream time: 0 + 5 < 11, it looks; 0 + 5 < 11 closed the first
      record, 6 + 5 does not close the second: 0=[0, None] at 0.
    """
    a = app()
    right = a.stream("right").select_key(lambda _k, v: v)
    a.stream("left").left_join(right, lambda v, o: [v, o], JoinWindows(0, 5)).to("joined")
    with TopologyTestDriver(a) as driver:
        driver.pipe("left", 0, 0, timestamp_ms=0)
        driver.pipe("left", 0, None, timestamp_ms=0)
        driver.pipe("right", None, None, timestamp_ms=9)
        driver.pipe("left", 0, 0, timestamp_ms=6)
        assert _outputs(driver, "joined") == []
        driver.pipe("left", 1, 1, timestamp_ms=11)
        assert _outputs(driver, "joined") == [(0, [0, None], 0)]
        # The keyless record is dead-lettered once the join has taken its time.
        assert [d.stage for d in driver.dead_letters] == ["process"]
        assert "has no key" in driver.dead_letters[0].error
