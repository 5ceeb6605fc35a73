"""Every DSL operation, windows, joins and serdes, run by the topology test driver: the
runtime's own tasks, processors and RocksDB stores, without a broker."""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from typing import Any

import msgpack
import pytest
from aiokafka.structs import ConsumerRecord

from statestore.errors import StateStoreError
from streams import App, JoinWindows, TopologyTestDriver, TumblingWindows, Windowed
from streams.dsl.topology import TopologyError
from streams.dsl.windows import HoppingWindows


def app(**settings: Any) -> App:
    return App("dsl", bootstrap_servers="127.0.0.1:1", **settings)


class Deduplicate:
    """Forwards the first record of each (key, id) only; remembers ids in its store."""

    def init(self, context: Any) -> None:
        self.context = context
        self.seen = context.store("seen-ids")

    def process(self, key: Any, value: Any) -> None:
        if (key, value["id"]) in self.seen:
            return
        self.seen.put((key, value["id"]), True)
        self.context.forward(key, value["id"])


def test_every_dsl_operation_in_one_app_with_several_sub_topologies() -> None:
    a = app()
    peeked: list[Any] = []
    events = a.stream("events")
    valid = events.filter(lambda k, v: v["kind"] != "bad")
    valid.map_values(lambda v: v["n"]).to("values")
    clicks, others = valid.branch(lambda k, v: v["kind"] == "click", lambda k, v: True)
    clicks.peek(lambda k, v: peeked.append(k)).to("clicks")
    (
        clicks.merge(others)
        .flat_map(lambda k, v: [(k, v), (f"{k}-copy", v)])
        .group_by_key()
        .count(store="counts")
        .to_stream()
        .to("counts")
    )
    (
        valid.map_values(lambda v: v["n"])
        .select_key(lambda k, v: f"kind-{k[0]}")
        .group_by_key()
        .reduce(lambda x, y: x + y, store="kind-totals")
        .to_stream()
        .to("kind-totals")
    )
    valid.filter_not(lambda k, v: v["n"] < 4).to("big")
    users = a.table("users", store="users")
    valid.join(users, lambda v, u: f"{u}:{v['kind']}").to("joined")
    events.filter(lambda k, v: "id" in v).process(Deduplicate, stores=["seen-ids"]).to("dedup")

    with TopologyTestDriver(a, partitions={"events": 2, "users": 2}) as driver:
        assert [s.partitions for s in driver.subs] == [2, 2, 2]
        driver.pipe_all("users", [("alice", "Alice"), ("bob", "Bob")])
        driver.pipe_all("events", [
            ("alice", {"kind": "click", "n": 1}),
            ("bob", {"kind": "view", "n": 2}),
            ("alice", {"kind": "bad", "n": 100}),
            ("carol", {"kind": "click", "n": 3}),
            ("alice", {"kind": "view", "n": 4}),
            ("dave", {"kind": "x", "n": 5, "id": 1}),
            ("dave", {"kind": "x", "n": 5, "id": 1}),
            ("dave", {"kind": "x", "n": 5, "id": 2}),
        ])
        assert sorted(v for _, v in driver.read_key_values("values")) == [1, 2, 3, 4, 5, 5, 5]
        assert sorted(k for k, _ in driver.read_key_values("clicks")) == ["alice", "carol"]
        assert sorted(peeked) == ["alice", "carol"]
        assert driver.read_key_value_map("counts") == {
            "alice": 2, "alice-copy": 2, "bob": 1, "bob-copy": 1, "carol": 1, "carol-copy": 1,
            "dave": 3, "dave-copy": 3,
        }
        assert driver.read_key_value_map("kind-totals") == {
            "kind-a": 5, "kind-b": 2, "kind-c": 3, "kind-d": 15}
        assert sorted(k for k, _ in driver.read_key_values("big")) == ["alice", "dave", "dave",
                                                                       "dave"]
        joined = sorted(v for _, v in driver.read_key_values("joined"))
        assert joined == ["Alice:click", "Alice:view", "Bob:view"]
        assert [v for _, v in driver.read_key_values("dedup")] == [1, 2]
        assert driver.store("counts")["dave-copy"] == 3
        assert driver.store("users").to_dict() == {"alice": "Alice", "bob": "Bob"}
        assert driver.read_output("counts") == []  # read once


def test_tumbling_windows_count_by_record_timestamp_and_drop_late_records() -> None:
    a = app()
    (
        a.stream("ticks").group_by_key()
        .windowed_by(TumblingWindows(1000, grace_ms=500))
        .count(store="ticks").to_stream().to("windows")
    )
    with TopologyTestDriver(a) as driver:
        driver.pipe_all("ticks", [
            ("clock", 0, 1000), ("clock", 0, 1200), ("clock", 0, 2500), ("clock", 0, 4000),
            ("clock", 0, 1500),  # late: [1000, 2000) closed at stream time 2500
            ("clock", 0, 3600),  # in grace: [3000, 4000) is open until 4500
        ])
        windows = driver.read_key_value_map("windows", key_serde="windowed")
        assert windows == {Windowed("clock", 1000, 2000): 2, Windowed("clock", 2000, 3000): 1,
                           Windowed("clock", 3000, 4000): 1, Windowed("clock", 4000, 5000): 1}
        assert driver.late_records_dropped == 1
        assert driver.store("ticks").to_dict() == {
            ("clock", 1000): 2, ("clock", 2000): 1, ("clock", 3000): 1, ("clock", 4000): 1}


def test_hopping_windows_and_purging_as_stream_time_advances() -> None:
    a = app()
    (
        a.stream("ticks").group_by_key()
        .windowed_by(HoppingWindows(1000, 500))
        .reduce(lambda x, y: x + y, store="sums").to_stream().to("sums")
    )
    with TopologyTestDriver(a) as driver:
        driver.pipe("ticks", "k", 1, timestamp_ms=1200)
        driver.pipe("ticks", "k", 2, timestamp_ms=1700)
        assert driver.store("sums").to_dict() == {("k", 500): 1, ("k", 1000): 3, ("k", 1500): 2}
        driver.advance_stream_time(3600)  # retention 1000 ms: windows ending by 2600 go
        assert driver.store("sums").to_dict() == {}
        driver.pipe("ticks", "k", 5, timestamp_ms=1800)
        assert driver.late_records_dropped == 2  # both its windows had closed


def test_windowed_keys_go_to_a_topic_without_a_map() -> None:
    a = app()
    a.topic("per-minute-json", key_serde="json", value_serde="json")
    counts = a.stream("words").group_by_key().windowed_by(TumblingWindows(60_000)).count(
        store="per-minute")
    counts.to_stream().to("per-minute")
    counts.to_stream().to("per-minute-json")
    with TopologyTestDriver(a) as driver:
        driver.pipe("words", "cat", None, timestamp_ms=61_000)
        (raw,) = driver.read_output("per-minute", key_serde="bytes")
        assert msgpack.unpackb(raw.key) == ["cat", 60_000, 120_000]
        (json_record,) = driver.read_output("per-minute-json", key_serde="bytes")
        assert json_record.key == b'["cat",60000,120000]'
        assert driver.dead_letters == []


def test_serdes_declared_once_per_topic() -> None:
    a = app()
    lines = a.topic("lines", key_serde="str", value_serde="json")
    a.topic("lengths", key_serde="str", value_serde="str")
    a.stream(lines).map_values(lambda v: str(len(v["text"]))).to("lengths")
    a.stream("raw", value_serde="bytes").to("lengths", value_serde="bytes")  # per-call wins
    with TopologyTestDriver(a) as driver:
        driver.pipe("lines", "a", {"text": "hello"})
        driver.pipe_raw("raw", None, b"bytes through")
        assert driver.read_output("lengths", key_serde="bytes", value_serde="bytes") == [
            driver_record(b"a", b"5", "lengths", 0),
            driver_record(None, b"bytes through", "lengths", 1),
        ]
    with pytest.raises(TopologyError, match="declared twice, differently"):
        a.topic("lines", key_serde="json")
    with pytest.raises(ValueError, match="unknown serde 'yaml'"):
        a.topic("other", value_serde="yaml")


def driver_record(key: Any, value: Any, topic: str, offset: int) -> Any:
    from streams.testing.driver import TestRecord

    return TestRecord(key, value, 0, topic, 0, offset)


def test_a_re_keyed_stream_is_repartitioned_to_the_joined_table_s_partition_count() -> None:
    a = app()
    users = a.table("users", store="users")
    (
        a.stream("orders")
        .select_key(lambda k, v: v["user"])
        .left_join(users, lambda order, user: (order["amount"], user))
        .to("enriched")
    )
    with TopologyTestDriver(a, partitions={"orders": 8, "users": 4}) as driver:
        assert [s.partitions for s in driver.subs] == [4, 8]  # table first: declared first
        (repartition,) = a.topology.repartition_topics
        assert driver.partitions_of(repartition) == 4
        driver.pipe_all("users", [(f"u{i}", f"User {i}") for i in range(10)])
        driver.pipe_all("orders", [(i, {"user": f"u{i % 12}", "amount": i}) for i in range(24)])
        enriched = driver.read_key_values("enriched")
        assert sorted(v for _, v in enriched) == sorted(
            [i, f"User {i % 12}" if i % 12 < 10 else None] for i in range(24))


def test_a_join_of_topics_with_different_partition_counts_says_what_to_do() -> None:
    a = app()
    users = a.table("users", store="users")
    a.stream("orders").join(users, lambda o, u: (o, u)).to("enriched")
    with pytest.raises(TopologyError, match=r"joins a stream with table users, but the topics "
                                            r"are not co-partitioned \(orders=8, users=4\).*"
                                            r"Call \.repartition\(\)"):
        TopologyTestDriver(a, partitions={"orders": 8, "users": 4})

    fixed = app()
    users = fixed.table("users", store="users")
    fixed.stream("orders").repartition().join(users, lambda o, u: (o, u)).to("enriched")
    with TopologyTestDriver(fixed, partitions={"orders": 8, "users": 4}) as driver:
        driver.pipe("users", "u1", "Ann")
        driver.pipe("orders", "u1", 7)
        assert driver.read_key_values("enriched") == [("u1", [7, "Ann"])]


def test_repartition_with_an_explicit_count() -> None:
    a = app()
    a.stream("in").repartition(partitions=3).group_by_key().count(store="n")
    with TopologyTestDriver(a, partitions=2) as driver:
        assert [s.partitions for s in driver.subs] == [2, 3]
        driver.pipe_all("in", [(k, 1) for k in "abcabca"])
        assert driver.store("n").to_dict() == {"a": 3, "b": 2, "c": 2}


def test_records_without_a_key_where_one_is_needed_are_dead_lettered() -> None:
    a = app()
    a.stream("counted").group_by_key().count(store="counts")
    a.stream("grouped").group_by(lambda k, v: v.get("user")).count(store="per-user")
    a.table("users", store="users")
    with TopologyTestDriver(a) as driver:
        driver.pipe("counted", None, 1)
        driver.pipe("grouped", "x", {"user": None})
        driver.pipe("users", None, "nobody")
        driver.pipe("counted", "k", 1)
        letters = driver.dead_letters
        assert [(d.topic, d.stage) for d in letters] == [
            ("counted", "process"), ("grouped", "process"), ("users", "process")]
        assert all("MissingKeyError" in d.error and "has no key" in d.error for d in letters)
        assert "repartitioning by key" in letters[1].error
        assert driver.store("counts").to_dict() == {"k": 1}
        dlq = driver.read_output(driver.dead_letter_topic)
        assert len(dlq) == 3 and dict(dlq[0].headers)["relay.stage"] == b"process"


def test_bad_records_are_dead_lettered_with_their_origin_or_stop_the_app() -> None:
    a = app()
    a.stream("in").map_values(lambda v: 10 // v).to("out")
    with TopologyTestDriver(a) as driver:
        driver.pipe_raw("in", b"\xa1a", b"\xc1not msgpack")
        driver.pipe("in", "z", 0)
        driver.pipe("in", "y", 2)
        assert driver.read_key_values("out") == [("y", 5)]
        first, second = driver.read_output(driver.dead_letter_topic)
        assert (first.key, first.value) == (b"\xa1a", b"\xc1not msgpack")
        headers = dict(first.headers)
        assert headers["relay.stage"] == b"deserialize" and headers["relay.offset"] == b"0"
        assert headers["relay.topic"] == b"in" and headers["relay.part"] == b"value"
        assert b"ZeroDivisionError" in dict(second.headers)["relay.error"]
        assert "relay.part" not in dict(second.headers)
        # Which part could not be read: the key, here (a str where msgpack was expected).
        driver.pipe_raw("in", b"acct1", b"\x01")
        bad_key = driver.dead_letters[-1]
        assert (bad_key.stage, bad_key.part) == ("deserialize", "key")
    from streams.runtime.task import RecordError

    with TopologyTestDriver(a, on_error="stop") as driver, pytest.raises(
            RecordError, match=r"process failed for in\[0\]@0 in step map-values-0002: "
                                r"ZeroDivisionError"):
        driver.pipe("in", "z", 0)


def test_a_machine_error_is_not_a_bad_record() -> None:
    """A full disk or a failing store stops processing without dead-lettering the record or
    counting it as processed, so a restart processes it."""
    calls = {"n": 0}

    def flaky_disk(value: int) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return value

    a = app()
    a.stream("in").map_values(flaky_disk).group_by_key().count(store="counts")
    with TopologyTestDriver(a) as driver:
        driver.pipe("in", "k", 1)
        with pytest.raises(OSError, match="No space left"):
            driver.pipe("in", "k", 2)
        assert driver.dead_letters == []
        task = driver.tasks["0_0"]
        assert list(task.processed.values()) == [1]  # the failed record is still to do

        task.stores["counts"].close()  # the store fails under the processor
        with pytest.raises(StateStoreError, match=r"store counts .* is not open"):
            driver.pipe("in", "k", 3)
        assert driver.dead_letters == []


def test_a_task_drops_records_it_already_processed() -> None:
    a = app()
    a.stream("in").group_by_key().count(store="counts")
    with TopologyTestDriver(a) as driver:
        driver.pipe_all("in", [("k", 1), ("k", 2), ("k", 3)])
        task = driver.tasks["0_0"]
        # A batch fetched before a rebalance sought the partition back, processed again.
        again = [ConsumerRecord("in", 0, offset, 0, 0, msgpack.packb("k"), msgpack.packb(n),
                                None, 2, 2, ()) for offset, n in ((1, 2), (2, 3))]
        assert [task.process(r) for r in again] == [False, False]
        assert task.records_skipped == 2
        assert driver.store("counts")["k"] == 3


def test_stream_time_survives_a_restart_so_late_records_stay_late(tmp_path: Any) -> None:
    a = app()
    (
        a.stream("ticks").group_by_key().windowed_by(TumblingWindows(1000))
        .count(store="ticks").to_stream().to("windows")
    )
    with TopologyTestDriver(a, state_dir=tmp_path) as driver:
        driver.pipe("ticks", "k", 0, timestamp_ms=500)
        driver.pipe("ticks", "k", 0, timestamp_ms=2500)
        driver.restart()
        assert driver.tasks["0_0"].stream_time_ms == 2500
        # The commit before the restart purged [0, 1000): past retention at stream time 2500.
        assert driver.store("ticks").to_dict() == {("k", 2000): 1}
        driver.pipe("ticks", "k", 0, timestamp_ms=700)  # its window closed at 1000
        assert driver.late_records_dropped == 1
        assert driver.store("ticks").to_dict() == {("k", 2000): 1}
        driver.restart(from_changelog=True)  # the stream time travels with the changelog too
        assert driver.tasks["0_0"].stream_time_ms == 2500
        driver.pipe("ticks", "k", 0, timestamp_ms=800)
        assert driver.store("ticks").to_dict() == {("k", 2000): 1}
        assert driver.read_key_value_map("windows", key_serde="windowed") == {
            Windowed("k", 0, 1000): 1, Windowed("k", 2000, 3000): 1}


def test_state_restored_from_the_changelog_equals_the_state_it_mirrors() -> None:
    a = app()
    a.stream("in").group_by_key().aggregate(list, lambda k, v, acc: [*acc, v], store="lists")
    with TopologyTestDriver(a, partitions=3) as driver:
        driver.pipe_all("in", [(f"k{i % 5}", i) for i in range(40)])
        before = driver.store("lists").to_dict()
        driver.restart(from_changelog=True)
        assert driver.store("lists").to_dict() == before
        positions = {tp.partition: n for t in driver.tasks.values()
                     for tp, n in t.processed.items()}
        assert sum(positions.values()) == 40
        driver.pipe("in", "k0", 99)
        assert driver.store("lists")["k0"][-1] == 99


def test_the_driver_refuses_topics_the_app_does_not_read() -> None:
    a = app()
    a.stream("in").to("out")
    with TopologyTestDriver(a) as driver, pytest.raises(ValueError, match="does not read topic "
                                                                           "'nope'"):
        driver.pipe("nope", "k", 1)


def test_a_closed_driver_says_so_and_keeps_its_outputs_readable() -> None:
    a = app()
    a.stream("in").group_by_key().count(store="counts").to_stream().to("out")
    with TopologyTestDriver(a) as driver:
        driver.pipe("in", "k", 1)
    assert driver.read_key_values("out") == [("k", 1)]
    for call in (lambda: driver.pipe("in", "k", 2), lambda: driver.store("counts"),
                 lambda: driver.advance_stream_time(5), lambda: driver.advance_wall_clock(5),
                 lambda: driver.restart()):
        with pytest.raises(RuntimeError, match=r"on a closed TopologyTestDriver: call it "
                                               r"inside the driver's with-block"):
            call()


def test_the_driver_names_the_outputs_when_asked_for_a_topic_the_app_does_not_write() -> None:
    a = app()
    a.stream("in").filter(lambda _k, v: v > 0).to("out")
    with TopologyTestDriver(a) as driver:
        # An output nothing was written to yet reads empty, as in Kafka Streams' driver...
        assert driver.read_output("out") == []
        driver.pipe("in", "k", 0)
        assert driver.read_key_values("out") == []
        assert driver.read_output(f"{driver.application_id}-dead-letters") == []
        # ...but a misspelt name says so rather than reading empty for ever.
        with pytest.raises(ValueError, match=r"neither reads nor writes topic 'outt'; "
                                             r"it writes \['out'\]"):
            driver.read_output("outt")
        driver.pipe("in", "k", 1)
        assert driver.read_key_values("out") == [("k", 1)]


def test_a_custom_processor_sees_where_its_record_was_read() -> None:
    class Where:
        def init(self, context: Any) -> None:
            self.context = context

        def process(self, key: Any, value: Any) -> None:
            c = self.context
            self.context.forward(key, [c.topic, c.partition, c.offset, c.timestamp_ms])

    app = App("where")
    app.stream("in").process(Where).to("out")
    with TopologyTestDriver(app, partitions={"in": 2}) as driver:
        driver.pipe("in", "a", 1, partition=1, timestamp_ms=5)
        driver.pipe("in", "b", 2, partition=1, timestamp_ms=6)
        driver.pipe("in", "c", 3, partition=0, timestamp_ms=7)
        assert driver.read_key_values("out") == [
            ("a", ["in", 1, 0, 5]), ("b", ["in", 1, 1, 6]), ("c", ["in", 0, 0, 7])]


def test_a_value_where_a_function_belongs_is_refused_when_the_app_is_built() -> None:
    a = app()
    s = a.stream("in")
    table = s.to_table()
    cases = [
        (lambda: s.branch(lambda _k, v: v > 1, "amount > 100"),
         "Stream.branch(): predicates must be a function, not str 'amount > 100'"),
        (lambda: s.filter(None), "Stream.filter(): predicate must be a function, not NoneType"),
        (lambda: s.group_by_key().aggregate(0, lambda _k, _v, n: n, store="s"),
         "GroupedStream.aggregate(): initializer must be a function, not int 0"),
        (lambda: table.join(table, lambda x, _y: x, foreign_key="sku"),
         "Table.join(): foreign_key must be a function, not str 'sku'"),
    ]
    for call, message in cases:
        with pytest.raises(TopologyError, match=re.escape(message)):
            call()
    # None where a function is optional stays the default.
    table.join(table, lambda x, _y: x, foreign_key=None).to_stream().to("out")


def test_a_function_that_cannot_take_its_arguments_is_refused_when_the_app_is_built() -> None:
    # Kafka Streams habits (a predicate of the value alone) and slips: each was one dead
    # letter per record, the whole input lost to the dead-letter topic.
    a = app()
    s = a.stream("in")
    cases = [
        (lambda: s.filter(lambda v: v),
         "Stream.filter(): predicate is called as predicate(key, value), but <lambda> "
         "cannot be: too many positional arguments"),
        (lambda: s.map_values(lambda k, v: v), "Stream.map_values(): fn is called as fn(value)"),
        (lambda: s.group_by_key().aggregate(lambda k: 0, lambda k, v, n: n, store="s"),
         "GroupedStream.aggregate(): initializer is called as initializer(), but"),
        (lambda: s.group_by_key().aggregate(lambda: 0, lambda agg, v: agg, store="s"),
         "aggregator is called as aggregator(key, value, aggregate)"),
        (lambda: s.to(lambda k, v: f"out-{v}"), "TopicNameExtractor, is not supported"),
        (lambda: s.join(a.table("rows", store="rows"), lambda v, r: [v, r], JoinWindows(100)),
         "Stream.join(): a stream-table join takes no JoinWindows"),
        (lambda: s.left_join(a.stream("other"), lambda v: v, JoinWindows(100)),
         "Stream.left_join(): joiner is called as joiner(value, other_value)"),
        (lambda: s.to(42), "a topic is named by a str or app.topic(...), not int 42"),
    ]
    for call, message in cases:
        with pytest.raises(TopologyError, match=re.escape(message)):
            call()
    seen: list[tuple[object, ...]] = []

    def show(*args: object) -> None:  # print's shape: not a request for the headers
        seen.append(args)

    got: list[object] = []
    # Functions that can take their arguments pass, builtins whose signature is unknown too.
    (s.flat_map_values(str.split).map_values(int).peek(show)
     .foreach(lambda _k, _v, headers: got.append(headers)))
    with TopologyTestDriver(a) as driver:
        driver.pipe("in", "k", "7", headers=[("h", b"1")])
    assert seen == [("k", 7)] and got == [(("h", b"1"),)]


def test_a_str_where_a_list_of_values_belongs_is_a_dead_letter_not_one_record_a_char(
) -> None:
    a = app()
    a.stream("in").flat_map_values(lambda v: v.upper()).to("out")
    a.stream("pairs").flat_map(lambda k, v: v).to("out2")
    with TopologyTestDriver(a) as driver:
        driver.pipe("in", "k", "abc")
        driver.pipe("pairs", "k", "ab")
        driver.pipe("pairs", "k", (("x", 1), ("y", 2)))  # a tuple of pairs is a list of pairs
        assert driver.read_key_values("out") == []
        assert driver.read_key_values("out2") == [("x", 1), ("y", 2)]
        first, second = driver.dead_letters
        assert "flat_map_values: the function returned a str ('ABC'), not a list" in first.error
        assert "returned a str ('ab'), not a list of (key, value) pairs" in second.error


class Returns:
    """A faust habit: the result returned (an agent yields it) rather than forwarded."""

    def init(self, context: Any) -> None:
        self.context = context

    def process(self, key: Any, value: Any) -> Any:
        return key, value * 2


class AsksForAnother:
    def init(self, context: Any) -> None:
        self.context = context

    def process(self, key: Any, value: Any) -> None:
        self.context.store("nope").put(key, value)


def test_a_processors_mistakes_are_said_a_store_it_did_not_declare_stops_the_app(
        caplog: pytest.LogCaptureFixture) -> None:
    a = app()
    a.stream("in").process(Returns).to("out")
    a.stream("other").process(AsksForAnother, stores=["seen"]).to("out2")
    with TopologyTestDriver(a) as driver, caplog.at_level(logging.WARNING):
        driver.pipe("in", "k", 1)
        driver.pipe("in", "k", 2)
        assert driver.read_key_values("out") == []
        said = [r.getMessage() for r in caplog.records if "goes nowhere" in r.getMessage()]
        assert said == ["processor processor-0002: process() returned ('k', 2), which goes "
                        "nowhere; send records on with context.forward(key, value)"]
        # Every record would meet it: not a dead letter each, a topology error (exit 4).
        with pytest.raises(TopologyError, match=r"did not declare store 'nope' \(it declares "
                                                r"'seen'\): pass it in process"):
            driver.pipe("other", "k", 1)
        assert driver.dead_letters == []


def test_a_topic_declared_after_it_was_used_with_default_serdes_is_refused() -> None:
    a = app()
    a.stream("late").to("out")
    with pytest.raises(TopologyError, match=r"topic late is declared after a stream, table "
                                            r"or to\(\) of it was made"):
        a.topic("late", key_serde="str", value_serde="json")
    with pytest.raises(TopologyError, match="topic out is declared after"):
        a.topic("out", value_serde="json")
    # What the declaration would not change is no mistake: the stream named its serdes.
    a.stream("named", key_serde="str", value_serde="str").to("elsewhere", value_serde="str")
    a.topic("named", key_serde="str", value_serde="json", partitions=2)
    a.topic("out", partitions=1)


def test_windows_take_whole_milliseconds_and_say_what_they_are() -> None:
    assert repr(TumblingWindows(60_000.0)) == "TumblingWindows(size_ms=60000, grace_ms=0)"
    assert TumblingWindows(60_000.0).size_ms == 60_000
    assert repr(HoppingWindows(10, 5)) == "HoppingWindows(size_ms=10, advance_ms=5, grace_ms=0)"
    with pytest.raises(TypeError, match=r"^TumblingWindows: size_ms must be a whole number of "
                                        r"milli.*, not 1\.5"):
        TumblingWindows(1.5)
    with pytest.raises(TypeError, match="before_ms must be a whole number of milliseconds"):
        JoinWindows("5")  # type: ignore[arg-type]
    # A faust habit: seconds. A float under a second is refused, saying what to write.
    with pytest.raises(TypeError, match=r"size_ms=60.0 is 60 milliseconds.*write 60_000 for "
                                        r"60 s, or timedelta\(seconds=60\)"):
        TumblingWindows(60.0)
    assert TumblingWindows(timedelta(minutes=1), grace_ms=timedelta(seconds=5)) == \
        TumblingWindows(60_000, grace_ms=5_000)


def test_a_dead_letter_names_the_step_whose_function_raised() -> None:
    a = app()
    a.stream("in").filter(lambda _k, v: v["a"] > 1).map_values(lambda v: v["b"]["c"]).to("out")
    with TopologyTestDriver(a) as driver:
        driver.pipe("in", "k", {"x": 2})
        driver.pipe("in", "k", {"a": 2, "b": None})
        driver.pipe_raw("in", b"\xc1", b"\x01")  # not msgpack: no step ran
        first, second, third = driver.dead_letters
        headers = dict(driver.read_output(driver.dead_letter_topic, "bytes", "bytes")[1].headers)
    assert (first.step, first.error) == ("filter-0002", "KeyError: 'a'")
    assert (second.step, second.error) == (
        "map-values-0003", "TypeError: 'NoneType' object is not subscriptable")
    assert headers["relay.step"] == b"map-values-0003"
    assert (third.stage, third.step) == ("deserialize", None)
