"""Session and sliding windows, final results and rate-limited updates on the topology test
driver. Expected outputs are worked out by hand from Kafka Streams' algorithms (see
docs/dsl.md)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from streams import App, TopologyTestDriver, TumblingWindows, Windowed
from streams.dsl.sessions import SessionWindows
from streams.dsl.sliding import SlidingWindows
from streams.dsl.topology import TopologyError


def app() -> App:
    return App("windows", bootstrap_servers="127.0.0.1:1")


def outputs(driver: TopologyTestDriver, topic: str) -> list[tuple[Any, Any, int]]:
    return [(r.key, r.value, r.timestamp_ms)
            for r in driver.read_output(topic, key_serde="windowed")]


def session_app() -> App:
    a = app()
    counts = (a.stream("clicks").group_by_key()
              .windowed_by(SessionWindows(inactivity_gap_ms=10, grace_ms=20))
              .count(store="sessions"))
    counts.to_stream().to("updates")
    counts.suppress(until_window_closes=True).to_stream().to("final")
    return a


def W(key: str, start: int, end: int) -> Windowed:
    return Windowed(key, start, end)


def test_sessions_merge_and_retract_the_merged_sessions_then_emit_one_final_result(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with TopologyTestDriver(session_app()) as driver:
        for ts in (0, 5, 22, 14):  # 14 bridges [0, 5] and [22, 22]
            driver.pipe("clicks", "a", {}, timestamp_ms=ts)
        assert outputs(driver, "updates") == [
            (W("a", 0, 0), 1, 0),
            (W("a", 0, 0), None, 0), (W("a", 0, 5), 2, 5),
            (W("a", 22, 22), 1, 22),
            (W("a", 0, 5), None, 5), (W("a", 22, 22), None, 22), (W("a", 0, 22), 4, 22),
        ]
        assert outputs(driver, "final") == []
        # The suppression buffer and the sessions come back from their changelogs.
        driver.restart(from_changelog=True)
        driver.pipe("clicks", "b", {}, timestamp_ms=100)  # closes a's session (22 + 10 + 20)
        assert outputs(driver, "final") == [(W("a", 0, 22), 4, 22)]
        with caplog.at_level(logging.WARNING, logger="streams.dsl.processors"):
            driver.pipe("clicks", "a", {}, timestamp_ms=35)   # [35, 35] ends before 100 - 30
        assert driver.late_records_dropped == 1
        # A session holds both its ends.
        assert "dropped as late for session [35, 35] of store sessions" in caplog.text
        # The rule a session closes by: its end, the inactivity gap, then the grace.
        assert "past the session's end plus its inactivity gap (10 ms) and grace (20 ms)" \
            in caplog.text
        driver.pipe("clicks", "b", {}, timestamp_ms=131)
        assert outputs(driver, "final") == [(W("b", 100, 100), 1, 100)]
        assert outputs(driver, "updates") == [(W("b", 100, 100), 1, 100),
                                              (W("b", 131, 131), 1, 131)]


def test_expired_sessions_are_purged_from_the_store_once_nothing_can_merge_them() -> None:
    with TopologyTestDriver(session_app()) as driver:
        driver.pipe("clicks", "a", {}, timestamp_ms=0)
        driver.pipe("clicks", "a", {}, timestamp_ms=11)
        driver.pipe("clicks", "b", {}, timestamp_ms=40)
        # The store answers sessions ending from 40 - (gap + grace) + 1 = 11 on, as Kafka
        # Streams' does: [0, 0] is purged, [11, 11] kept, and a record at 15 merges it.
        driver.commit()
        assert [k for k, _ in driver.store("sessions").items()] == [
            ("a", 11, 11), ("b", 40, 40)]
        driver.pipe("clicks", "a", {}, timestamp_ms=15)
        assert outputs(driver, "updates")[-1] == (W("a", 11, 15), 2, 15)
        driver.pipe("clicks", "b", {}, timestamp_ms=100)
        driver.commit()
        assert [k for k, _ in driver.store("sessions").items()] == [("b", 100, 100)]


def test_a_session_aggregate_needs_a_merger() -> None:
    grouped = app().stream("s").group_by_key().windowed_by(SessionWindows(10))
    with pytest.raises(TopologyError, match="merger"):
        grouped.aggregate(lambda: 0, lambda _k, _v, n: n + 1, store="x")


def test_sliding_windows_follow_kip_450(caplog: pytest.LogCaptureFixture) -> None:
    a = app()
    (a.stream("events").group_by_key()
     .windowed_by(SlidingWindows(time_difference_ms=10, grace_ms=20))
     .count(store="sliding").to_stream().to("out"))
    with TopologyTestDriver(a) as driver:
        driver.pipe("events", "b", 1, timestamp_ms=3)   # early: the [0, 10] window
        driver.pipe("events", "b", 1, timestamp_ms=1)
        assert outputs(driver, "out") == [
            (W("b", 0, 10), 1, 3), (W("b", 2, 12), 1, 3), (W("b", 0, 10), 2, 3)]
        for ts in (20, 25, 40, 28):
            driver.pipe("events", "a", 1, timestamp_ms=ts)
        assert outputs(driver, "out") == [
            (W("a", 10, 20), 1, 20),
            (W("a", 21, 31), 1, 25), (W("a", 15, 25), 2, 25),
            (W("a", 30, 40), 1, 40),
            (W("a", 21, 31), 2, 28), (W("a", 26, 36), 1, 28), (W("a", 18, 28), 3, 28),
        ]
        with caplog.at_level(logging.WARNING, logger="streams.dsl.processors"):
            driver.pipe("events", "a", 1, timestamp_ms=9)  # 9 + 1 + 10 <= 40 - 20: late
            driver.pipe("events", "c", 1, timestamp_ms=4)  # before d: the first window's
        assert driver.late_records_dropped == 2
        # The windows it falls in, both ends held: no [-6, 4).
        assert "dropped as late for window [0, 10] of store sliding" in caplog.text


def test_final_results_of_tumbling_windows_wait_for_the_grace_period() -> None:
    a = app()
    (a.stream("events").group_by_key().windowed_by(TumblingWindows(10, grace_ms=5))
     .count(store="counts").suppress(until_window_closes=True).to_stream().to("final"))
    with TopologyTestDriver(a) as driver:
        for key, ts in [("a", 1), ("a", 9), ("b", 12), ("a", 14), ("a", 3)]:
            driver.pipe("events", key, 1, timestamp_ms=ts)
        assert outputs(driver, "final") == []          # [0, 10) closes at 15
        driver.pipe("events", "b", 1, timestamp_ms=15)
        # Stamped with the largest timestamp among the window's records (9), not the last's.
        assert outputs(driver, "final") == [(W("a", 0, 10), 3, 9)]
        driver.pipe("events", "b", 1, timestamp_ms=40)
        assert outputs(driver, "final") == [(W("a", 10, 20), 1, 14), (W("b", 10, 20), 2, 15)]


def test_suppress_rate_limits_a_table_by_time_and_size() -> None:
    a = app()
    (a.table("prices", store="prices").suppress(time_limit_ms=10, max_records=2)
     .to_stream().to("out"))
    with TopologyTestDriver(a) as driver:
        driver.pipe("prices", "x", 1, timestamp_ms=0)
        driver.pipe("prices", "x", 2, timestamp_ms=4)    # x keeps its place (time 0)
        driver.pipe("prices", "y", 5, timestamp_ms=6)
        assert driver.read_key_values("out") == []
        driver.pipe("prices", "z", 7, timestamp_ms=7)    # three keys: the oldest goes early
        assert driver.read_key_values("out") == [("x", 2)]
        driver.pipe("prices", "y", None, timestamp_ms=16)  # y waited 10 since 6: emitted
        assert [(r.key, r.value, r.timestamp_ms) for r in driver.read_output("out")] == [
            ("y", None, 16)]
        driver.pipe("prices", "x", 9, timestamp_ms=30)
        assert driver.read_key_values("out") == [("z", 7)]


def test_suppress_needs_a_windowed_table_to_wait_for_windows() -> None:
    table = app().table("t", store="t")
    with pytest.raises(TopologyError, match="windowed table"):
        table.suppress(until_window_closes=True)
    with pytest.raises(TopologyError, match="needs"):
        table.suppress()


def test_windowed_keys_sent_to_a_str_keyed_topic_are_refused_when_the_app_is_built() -> None:
    a = app()
    a.topic("per-minute", key_serde="str")
    counts = (a.stream("clicks").group_by_key().windowed_by(TumblingWindows(60_000))
              .count(store="per-minute"))
    for windowed in (counts.to_stream(), counts.filter(lambda _k, n: n > 1).to_stream(),
                     counts.suppress(until_window_closes=True).to_stream().map_values(str)):
        with pytest.raises(TopologyError, match=r"to\('per-minute'\): the keys here are "
                                                r"Windowed .* \.map\(lambda w, v"):
            windowed.to("per-minute")
        with pytest.raises(TopologyError, match="the BytesSerde cannot write"):
            windowed.to("elsewhere", key_serde="bytes")
    # Plain keys again, or a serde that writes windows: accepted, and written as promised.
    counts.to_stream().map(lambda w, n: (f"{w.key}@{w.start}", n)).to("per-minute")
    counts.to_stream().to("windows-json", key_serde="json")
    with TopologyTestDriver(a) as driver:
        driver.pipe("clicks", "ann", 1, timestamp_ms=61_000)
        assert driver.read_key_values("per-minute") == [("ann@60000", 1)]
        assert driver.read_key_values("windows-json") == [(["ann", 60_000, 120_000], 1)]
        assert driver.dead_letters == []


def test_a_windowed_table_filtered_or_mapped_into_a_store_keeps_every_window() -> None:
    a = app()
    counts = (a.stream("clicks").group_by_key().windowed_by(TumblingWindows(60_000))
              .count(store="per-minute"))
    counts.filter(lambda _k, n: n > 1).to_stream().to("busy")
    counts.map_values(lambda n: n * 10, store="tens").to_stream().to("tens")
    counts.filter(lambda _k, n: n > 1, store="busy-store")
    with TopologyTestDriver(a) as driver:
        for ts in (61_000, 62_000, 130_000):
            driver.pipe("clicks", "ann", 1, timestamp_ms=ts)
        assert driver.dead_letters == []
        # The filter's parent is stored, so a window that never passed gives no tombstone.
        assert outputs(driver, "busy") == [(W("ann", 60_000, 120_000), 2, 62_000)]
        assert [v for _, v, _ in outputs(driver, "tens")] == [10, 20, 10]
        assert driver.store("tens").to_dict() == {("ann", 60_000, 120_000): 20,
                                                  ("ann", 120_000, 180_000): 10}
        assert driver.store("busy-store").to_dict() == {("ann", 60_000, 120_000): 2}


def test_a_retention_keeps_past_windows_for_queries() -> None:
    """By default a window leaves its store once its size and grace have passed (as in Kafka
    Streams); retention_ms keeps it longer (Materialized.withRetention), for queries of past
    windows, as a faust table's windows stay."""
    def counts(retention_ms: int | None) -> dict[object, int]:
        a = app()
        (a.stream("events").group_by_key().windowed_by(TumblingWindows(10, grace_ms=5))
         .count(store="counts", retention_ms=retention_ms).to_stream().to("out"))
        with TopologyTestDriver(a) as driver:
            for ts in (1, 12, 25, 100):
                driver.pipe("events", "a", 1, timestamp_ms=ts)
            driver.commit()
            return dict(driver.store("counts").items())

    assert set(counts(None)) == {("a", 100)}
    assert set(counts(100)) == {("a", 0), ("a", 10), ("a", 20), ("a", 100)}
    with pytest.raises(TopologyError, match=r"retention_ms=12: windows are kept at least their "
                                            r"size plus grace \(15 ms here\)"):
        counts(12)
    a = app()
    with pytest.raises(TopologyError, match="applies to tumbling and hopping windows"):
        (a.stream("events").group_by_key().windowed_by(SlidingWindows(10))
         .count(store="s", retention_ms=1_000))
