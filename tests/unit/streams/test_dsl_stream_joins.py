"""Stream-stream joins on the topology test driver: inner, left and outer, with left and
outer results emitted once their window closes (KIP-633). Expected outputs are worked out by
hand (see docs/dsl.md)."""

from __future__ import annotations

from typing import Any

import pytest

from streams import App, TopologyTestDriver
from streams.dsl.joins import JoinWindows
from streams.dsl.topology import TopologyError


def joined(kind: str) -> App:
    a = App("joins", bootstrap_servers="127.0.0.1:1")
    clicks, views = a.stream("clicks"), a.stream("views")
    join = getattr(clicks, {"inner": "join", "left": "left_join", "outer": "outer_join"}[kind])
    join(views, lambda c, v: f"{c}+{v}", JoinWindows(10, 10, grace_ms=5)).to("out")
    return a


STEPS = [("clicks", "a", "l1", 0), ("views", "a", "r1", 5), ("clicks", "a", "l2", 20),
         ("views", "a", "r2", 25), ("views", "b", "r3", 26), ("clicks", "c", "l3", 30)]


def run(driver: TopologyTestDriver, steps: list[tuple[str, str, str, int]]) -> None:
    for topic, key, value, ts in steps:
        driver.pipe(topic, key, value, timestamp_ms=ts)


def out(driver: TopologyTestDriver) -> list[tuple[Any, Any, int]]:
    return [(r.key, r.value, r.timestamp_ms) for r in driver.read_output("out")]


def test_inner_join_pairs_records_within_the_window_with_the_later_timestamp() -> None:
    with TopologyTestDriver(joined("inner")) as driver:
        run(driver, STEPS)
        assert out(driver) == [("a", "l1+r1", 5), ("a", "l2+r2", 25)]


def test_left_join_emits_an_unmatched_record_once_its_window_closed() -> None:
    with TopologyTestDriver(joined("left")) as driver:
        run(driver, STEPS)
        assert out(driver) == [("a", "l1+r1", 5), ("a", "l2+r2", 25)]
        driver.restart(from_changelog=True)   # the waiting record survives
        run(driver, [("clicks", "d", "l4", 46)])   # 30 + 10 + 5 < 46: c's window closed
        assert out(driver) == [("c", "l3+None", 30)]
        run(driver, [("clicks", "e", "l5", 20)])   # closed on arrival: at once
        assert out(driver) == [("e", "l5+None", 20)]


def test_outer_join_emits_unmatched_records_of_both_sides_in_time_order() -> None:
    with TopologyTestDriver(joined("outer")) as driver:
        run(driver, [*STEPS, ("clicks", "d", "l4", 46)])
        assert out(driver) == [("a", "l1+r1", 5), ("a", "l2+r2", 25), ("b", "None+r3", 26),
                               ("c", "l3+None", 30)]


def test_a_late_partner_in_grace_joins_instead_of_a_spurious_left_result() -> None:
    with TopologyTestDriver(joined("left")) as driver:
        run(driver, [("clicks", "a", "l1", 0), ("views", "z", "x", 14),
                     ("views", "a", "r1", 8)])  # 8 is within [0 - 10, 0 + 10]
        run(driver, [("views", "z", "y", 40)])
        assert out(driver) == [("a", "l1+r1", 8)]


def test_join_windows_are_purged_past_retention() -> None:
    with TopologyTestDriver(joined("inner")) as driver:
        run(driver, [("clicks", "a", "l1", 0), ("clicks", "b", "l2", 100)])
        driver.commit()
        left_store = next(s for s in driver.topology.stores if s.endswith("-left"))
        assert [k[0] for k in driver.store(left_store)] == ["b"]


def test_re_keyed_streams_are_repartitioned_and_counts_must_agree() -> None:
    a = App("joins", bootstrap_servers="127.0.0.1:1")
    left = a.stream("clicks").select_key(lambda _k, v: v["user"])
    left.join(a.stream("views"), lambda c, v: (c["n"], v), JoinWindows(5)).to("out")
    with TopologyTestDriver(a, partitions={"clicks": 3, "views": 2}) as driver:
        driver.pipe("views", "ann", "home", timestamp_ms=1)
        driver.pipe("clicks", 7, {"user": "ann", "n": 1}, timestamp_ms=2)
        assert driver.read_key_values("out") == [("ann", [1, "home"])]
    b = App("joins", bootstrap_servers="127.0.0.1:1")
    b.stream("clicks").join(b.stream("views"), lambda c, v: c, JoinWindows(5)).to("out")
    with pytest.raises(TopologyError, match="co-partitioned"):
        TopologyTestDriver(b, partitions={"clicks": 3, "views": 2})


def test_a_stream_join_needs_join_windows() -> None:
    a = App("joins", bootstrap_servers="127.0.0.1:1")
    with pytest.raises(TopologyError, match="JoinWindows"):
        a.stream("clicks").join(a.stream("views"), lambda c, v: c)


def test_records_of_merged_topics_with_one_offset_are_buffered_apart() -> None:
    a = App("joins", bootstrap_servers="127.0.0.1:1")
    left = a.stream("web").merge(a.stream("app"))
    left.join(a.stream("views"), lambda c, v: f"{c}+{v}", JoinWindows(10)).to("out")
    with TopologyTestDriver(a) as driver:
        driver.pipe("web", "k", "w", timestamp_ms=1)   # offset 0 of web
        driver.pipe("app", "k", "a", timestamp_ms=1)   # offset 0 of app
        driver.pipe("views", "k", "v", timestamp_ms=2)
        assert sorted(driver.read_key_values("out")) == [("k", "a+v"), ("k", "w+v")]


# Before the restart: z's pair moves every time of the join to 200,000. After it: a's records
# at 0 and 5 are far behind each side's time (their segment expired: not buffered, nothing
# fetched) and behind the join's, so an uninterrupted run never pairs them.
BEFORE_RESTART = [("clicks", "z", "lz", 200_000), ("views", "z", "rz", 200_000)]
AFTER_RESTART = [("clicks", "a", "la", 0), ("views", "a", "ra", 5)]
THROUGH_A_RESTART = {
    "inner": [("z", "lz+rz", 200_000)],
    # 0 + 10 is behind the join's stream time: each unmatched record comes out at once.
    "left": [("z", "lz+rz", 200_000), ("a", "la+None", 0)],
    "outer": [("z", "lz+rz", 200_000), ("a", "la+None", 0), ("a", "None+ra", 5)],
}


@pytest.mark.parametrize("kind", ["inner", "left", "outer"])
@pytest.mark.parametrize("restart", [None, "local state", "changelog"])
def test_the_join_keeps_its_times_through_a_restart(kind: str, restart: str | None) -> None:
    with TopologyTestDriver(joined(kind)) as driver:
        run(driver, BEFORE_RESTART)
        if restart is not None:
            driver.restart(from_changelog=restart == "changelog")
        run(driver, AFTER_RESTART)
        assert out(driver) == THROUGH_A_RESTART[kind]


def asymmetric_outer_join() -> App:
    a = App("joins", bootstrap_servers="127.0.0.1:1")
    a.stream("clicks").outer_join(a.stream("views"), lambda c, v: f"{c}+{v}",
                                  JoinWindows(10, 2)).to("out")
    return a


@pytest.mark.parametrize("restart", [None, "local state", "changelog"])
def test_the_outer_store_look_keeps_its_min_time_through_a_restart(restart: str | None) -> None:
    """A right record looks for closed records only once the min time + its own wait (10)
    is behind the join's time, though a left record waits 2: the min time decides when
    ``la`` comes out, so it must survive the restart."""
    with TopologyTestDriver(asymmetric_outer_join()) as driver:
        run(driver, [("clicks", "x", "lx", 105), ("clicks", "a", "la", 104)])
        if restart is not None:
            driver.restart(from_changelog=restart == "changelog")
        # 104 + 10 >= 107: the right record does not look, and joins lx in [105, 117].
        run(driver, [("views", "x", "rx", 107)])
        assert out(driver) == [("x", "lx+rx", 107)]
        # 104 + 2 < 120: the left record looks; la closed, rx (107 + 10) still open.
        run(driver, [("clicks", "y", "ly", 120)])
        assert out(driver) == [("a", "la+None", 104)]


@pytest.mark.parametrize("kind", ["inner", "left", "outer"])
def test_state_written_before_the_join_kept_its_times_rebuilds_them_from_its_stores(
        kind: str) -> None:
    """Such state's input position has no time of the join's: each side's is the largest
    timestamp its store holds (here z's, 200,000), as Kafka Streams' window stores rebuild
    theirs, and the output is the uninterrupted run's."""
    with TopologyTestDriver(joined(kind)) as driver:
        run(driver, BEFORE_RESTART)
        driver.commit()
        for task in driver.tasks.values():
            for store in task.stores.values():
                position = store.read_input_position()
                store.write_input_position(
                    {k: v for k, v in position.items() if "-join-" not in k})
        driver.restart(from_changelog=True)
        run(driver, AFTER_RESTART)
        assert out(driver) == THROUGH_A_RESTART[kind]
