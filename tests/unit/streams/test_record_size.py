"""Records over the producer's limit, in the topology test driver: a bad record too large to
dead-letter as it is goes there truncated with its sizes; a valid record whose output,
repartition record or changelog record would be too large is a bad record where it is made,
never a send that fails at every restart."""

from __future__ import annotations

import msgpack

from statestore.record_size import MAX_RECORD_BYTES, TRUNCATED_BYTES
from streams import App
from streams.testing import TopologyTestDriver

BIG = "x" * (MAX_RECORD_BYTES + 1)


def headers_of(record) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    return dict(record.headers)


def test_a_garbage_value_too_large_to_dead_letter_goes_there_truncated() -> None:
    app = App("sizes")
    app.stream("in").group_by_key().count(store="counts").to_stream().to("out")
    garbage = b"\xc1" * 5_000_000
    with TopologyTestDriver(app) as driver:
        driver.pipe_raw("in", msgpack.packb("k"), garbage)
        driver.pipe("in", "k", 1)
        (dead,) = driver.read_output("sizes-dead-letters", key_serde="bytes", value_serde="bytes")
        assert dead.value == garbage[:TRUNCATED_BYTES]
        headers = headers_of(dead)
        assert headers["relay.truncated"] == b"true"
        assert headers["relay.value.size"] == b"5000000"
        assert headers["relay.key.size"] == str(len(msgpack.packb("k"))).encode()
        assert headers["relay.stage"] == b"deserialize"
        assert driver.read_key_values("out") == [("k", 1)]


def test_a_small_bad_record_is_dead_lettered_whole_without_size_headers() -> None:
    app = App("sizes")
    app.stream("in").to("out")
    with TopologyTestDriver(app) as driver:
        driver.pipe_raw("in", None, b"\xc1")
        (dead,) = driver.read_output("sizes-dead-letters", key_serde="bytes", value_serde="bytes")
        assert dead.value == b"\xc1" and "relay.truncated" not in headers_of(dead)


def test_a_valid_value_too_large_for_a_repartition_topic_is_a_bad_record() -> None:
    app = App("sizes")
    (app.stream("in").select_key(lambda _k, v: v[:1]).group_by_key()
     .reduce(lambda a, v: a + v[:1], store="firsts").to_stream().to("out"))
    with TopologyTestDriver(app) as driver:
        driver.pipe("in", "k", BIG)
        driver.pipe("in", "k", "xy")
        (dead,) = driver.dead_letters
        assert dead.stage == "process" and "RecordTooLargeError" in dead.error
        assert "repartition" in dead.error
        assert driver.read_key_values("out") == [("x", "xy")]


def test_a_valid_value_too_large_for_a_sink_or_a_changelog_is_a_bad_record() -> None:
    app = App("sizes")
    app.stream("in").to("out")
    users = app.table("users", store="users")
    app.stream("orders").join(users, lambda o, u: [o, u]).to("named")
    with TopologyTestDriver(app) as driver:
        driver.pipe("in", "k", BIG)
        driver.pipe("users", "u1", BIG)          # its changelog record would be too large
        driver.pipe("users", "u1", "Ann")
        driver.pipe("orders", "u1", 7)
        assert [d.topic for d in driver.dead_letters] == ["in", "users"]
        assert all("RecordTooLargeError" in d.error for d in driver.dead_letters)
        assert driver.read_key_values("out") == []
        assert driver.read_key_values("named") == [("u1", [7, "Ann"])]
        assert driver.store("users")["u1"] == "Ann"
