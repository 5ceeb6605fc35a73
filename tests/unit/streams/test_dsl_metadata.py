"""Punctuation in custom processors, headers, timestamp extractors and output timestamps on
the topology test driver."""

from __future__ import annotations

from typing import Any

from streams import App, TopologyTestDriver, TumblingWindows, Windowed
from streams.dsl.punctuation import PunctuationType


def app() -> App:
    return App("meta", bootstrap_servers="127.0.0.1:1")


class Totals:
    """Sums values per key in its store; every 10 ms of stream time forwards the total, and
    every 100 ms of wall-clock time a tick."""

    fired: list[int] = []
    ticks: list[int] = []

    def init(self, context: Any) -> None:
        self.context = context
        self.store = context.store("totals")
        context.schedule(10, PunctuationType.STREAM_TIME, self.report)
        context.schedule(100, PunctuationType.WALL_CLOCK_TIME, self.tick)

    def process(self, key: Any, value: Any) -> None:
        self.store.put(key, self.store.get(key, 0) + value)

    def report(self, now: int) -> None:
        Totals.fired.append(now)
        self.context.forward("total", sum(v for _, v in self.store.items()))

    def tick(self, now: int) -> None:
        Totals.ticks.append(now)
        self.context.forward("tick", now)


def totals_app() -> App:
    a = app()
    a.stream("numbers").process(Totals, stores=["totals"]).to("out")
    return a


def test_stream_time_punctuation_fires_as_stream_time_advances_and_never_twice() -> None:
    Totals.fired = []
    with TopologyTestDriver(totals_app()) as driver:
        for ts in (0, 5, 12, 35, 38):
            driver.pipe("numbers", "a", 1, timestamp_ms=ts)
        assert Totals.fired == [0, 12, 35]   # 35 skips 20 and 30: one punctuation
        assert [(r.key, r.value, r.timestamp_ms) for r in driver.read_output("out")] == [
            ("total", 1, 0), ("total", 3, 12), ("total", 4, 35)]
        driver.restart(from_changelog=True)  # the next due time (40) comes back
        driver.pipe("numbers", "a", 1, timestamp_ms=39)
        assert Totals.fired == [0, 12, 35]
        driver.pipe("numbers", "a", 1, timestamp_ms=40)
        assert Totals.fired == [0, 12, 35, 40]


def test_wall_clock_punctuation_fires_from_the_loop_without_records() -> None:
    Totals.ticks = []
    with TopologyTestDriver(totals_app()) as driver:
        driver.advance_wall_clock(50)    # sets the processor up: first due at 150
        driver.advance_wall_clock(149)
        assert Totals.ticks == []
        driver.advance_wall_clock(150)
        driver.advance_wall_clock(420)   # two intervals missed: fires once
        driver.advance_wall_clock(449)
        driver.advance_wall_clock(450)
        assert Totals.ticks == [150, 420, 450]
        assert [(r.key, r.timestamp_ms) for r in driver.read_output("out")] == [
            ("tick", 150), ("tick", 420), ("tick", 450)]


class Tagger:
    def init(self, context: Any) -> None:
        self.context = context

    def process(self, key: Any, value: Any) -> None:
        seen = dict(self.context.headers)
        self.context.forward(key, value, headers=[*self.context.headers,
                                                  ("seen", seen.get("trace", b"-"))])


def test_headers_are_read_in_peek_and_process_and_forwarded() -> None:
    a = app()
    peeked: list[Any] = []
    events = a.stream("events").peek(lambda k, v, headers: peeked.append(headers))
    events.map_values(lambda v: v + 1).to("plain")
    events.process(Tagger).to("tagged")
    with TopologyTestDriver(a) as driver:
        driver.pipe("events", "k", 1, headers=[("trace", b"t-1")])
        assert peeked == [(("trace", b"t-1"),)]
        assert [r.headers for r in driver.read_output("plain")] == [(("trace", b"t-1"),)]
        assert [r.headers for r in driver.read_output("tagged")] == [
            (("trace", b"t-1"), ("seen", b"t-1"))]


def test_a_timestamp_extractor_sets_the_time_windows_and_outputs_go_by() -> None:
    a = app()
    (a.stream("events", timestamp=lambda _k, v, _ts: v["at"]).group_by_key()
     .windowed_by(TumblingWindows(100)).count(store="counts").to_stream().to("out"))
    with TopologyTestDriver(a) as driver:
        driver.pipe("events", "a", {"at": 150}, timestamp_ms=5)
        driver.pipe("events", "a", {"at": 20}, timestamp_ms=6)   # its window closed at 100
        driver.pipe("events", "a", {"at": -1}, timestamp_ms=7)   # a bad timestamp
        assert [(r.key, r.value, r.timestamp_ms)
                for r in driver.read_output("out", key_serde="windowed")] == [
            (Windowed("a", 100, 200), 1, 150)]
        assert driver.late_records_dropped == 1
        assert [d.error for d in driver.dead_letters] == [
            "ValueError: timestamp-extractor-0002: the timestamp extractor returned -1; it "
            "must return a timestamp in ms, an int >= 0"]
        assert driver.tasks["0_0"].stream_time_ms == 150


def test_describe_shows_sub_topologies_nodes_stores_and_internal_topics() -> None:
    a = App("orders", bootstrap_servers="127.0.0.1:1")
    users = a.table("users", store="users")
    (a.stream("orders").select_key(lambda _k, o: o["user"])
     .join(users, lambda o, u: o).to("named"))
    assert str(a.describe()) == """\
Topologies:
   Sub-topology: 0
    Source: table-source-0001 (topics: [users])
      --> table-0002
    Source: join-repartition-0005-source (topics: [orders-join-repartition-0005])
      --> join-0006
    Processor: table-0002 (stores: [users])
      <-- table-source-0001
    Processor: join-0006 (stores: [users])
      --> sink-0007
      <-- join-repartition-0005-source
    Sink: sink-0007 (topic: named)
      <-- join-0006

   Sub-topology: 1
    Source: source-0003 (topics: [orders])
      --> select-key-0004
    Processor: select-key-0004 (stores: [])
      --> join-repartition-0005-sink
      <-- source-0003
    Sink: join-repartition-0005-sink (topic: orders-join-repartition-0005)
      <-- select-key-0004

Internal topics:
   orders-join-repartition-0005 (repartition)
   orders-users-changelog (changelog)
"""
    description = a.describe()
    assert description.source_topics == ("orders", "users")
    assert description.sink_topics == ("named",)
