"""Records a task drops (late for a closed window, or dead-lettered) and records whose key
belongs to another partition: counted per task, exposed on /metrics and in the status the web
view reads, logged once; and the test driver's interleaved partition order, which shows how
a backlog processed at uneven speeds makes records late."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

import msgpack
import pytest
from aiokafka.structs import ConsumerRecord, TopicPartition

from streams import App, TopologyTestDriver, TumblingWindows
from streams.runtime.task import MISROUTE_SAMPLE, partition_of
from tests.conftest import wait_until
from tests.unit.streams.fakes import SOURCE, assign, rig

MINUTE = 60_000


def windowed_orders_app() -> App:
    """The issue's app: orders re-keyed by customer, counted in 1-minute windows, 10 s
    grace."""
    app = App("shop", bootstrap_servers="127.0.0.1:1")
    app.topic("orders", partitions=3)
    (app.stream("orders").group_by(lambda _k, v: v["customer"])
        .windowed_by(TumblingWindows(MINUTE, grace_ms=10_000))
        .count(store="orders-per-minute").to_stream().to("counts"))
    return app


def pipe_backlog(driver: TopologyTestDriver, n: int = 600) -> None:
    """``n`` orders with timestamps over three minutes, produced at once."""
    spread = random.Random(7)
    for i in range(n):
        driver.pipe("orders", i, {"customer": f"c{spread.randrange(20)}"},
                    timestamp_ms=i * 3 * MINUTE // n)


def counted(driver: TopologyTestDriver) -> int:
    return sum(driver.read_key_value_map("counts", key_serde="windowed").values())


def test_records_reach_tasks_in_piped_order_by_default_and_none_are_late() -> None:
    with TopologyTestDriver(windowed_orders_app()) as driver:
        pipe_backlog(driver)
        assert driver.late_records_dropped == 0
        assert counted(driver) == 600


def test_interleaved_partitions_make_records_late_as_a_broker_can() -> None:
    with TopologyTestDriver(windowed_orders_app(), partition_order="interleaved",
                            seed=3) as driver:
        pipe_backlog(driver)
        dropped = driver.late_records_dropped
        assert dropped > 0
        assert counted(driver) == 600 - dropped
        [task] = [t for t in driver.tasks.values() if t.context.dropped.get("late")][:1]
        assert task.context.dropped["late"] > 0


def test_interleaving_is_repeatable_with_a_seed() -> None:
    def drops(seed: int) -> int:
        with TopologyTestDriver(windowed_orders_app(), partition_order="interleaved",
                                seed=seed) as driver:
            pipe_backlog(driver)
            return driver.late_records_dropped

    assert drops(5) == drops(5)


def test_a_wrong_partition_order_is_refused() -> None:
    with pytest.raises(ValueError, match="partition_order"):
        TopologyTestDriver(windowed_orders_app(), partition_order="random")


def test_the_first_late_record_of_a_window_is_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streams.dsl.processors"), \
            TopologyTestDriver(windowed_orders_app()) as driver:
        driver.pipe("orders", 1, {"customer": "ann"}, timestamp_ms=5 * MINUTE)
        for _ in range(3):  # three late records for the window [0, 1 min)
            driver.pipe("orders", 1, {"customer": "ann"}, timestamp_ms=1_000)
        driver.pipe("orders", 1, {"customer": "ann"}, timestamp_ms=MINUTE + 1_000)
        assert driver.late_records_dropped == 4
    lines = [r.getMessage() for r in caplog.records if "dropped as late" in r.getMessage()]
    assert len(lines) == 2
    assert "window [0, 60000)" in lines[0] and "orders-per-minute" in lines[0]
    assert "window [60000, 120000)" in lines[1]


def windowed_subs() -> list:
    app = App("unit", bootstrap_servers="127.0.0.1:1")
    (app.stream(SOURCE).group_by_key().windowed_by(TumblingWindows(MINUTE))
        .count(store="per-minute").to_stream().to("out"))
    subs = app.topology.sub_topologies()
    app.topology.assign_partitions(subs, {SOURCE: 4}, 4)
    return subs


def raw(partition: int, offset: int, key: bytes, timestamp: int) -> ConsumerRecord:
    value = msgpack.packb(1)
    return ConsumerRecord(SOURCE, partition, offset, timestamp, 0, key, value, None, len(key),
                          len(value), [])


def keys_of_partition(partition: int, n: int) -> list[bytes]:
    keys = (msgpack.packb(f"k{i}") for i in range(10_000))
    return [k for k in keys if partition_of(k, 4) == partition][:n]


@pytest.mark.asyncio
async def test_drops_and_misrouted_keys_are_on_metrics_and_in_the_status(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    r = rig(tmp_path, subs=windowed_subs(), commit_interval_ms=60_000)
    run = asyncio.create_task(r.thread.run([SOURCE]))

    def value(name: str, **labels: str) -> float | None:
        return r.thread.metrics.registry.get_sample_value(
            name, {"thread": r.thread.identity.label, **labels})

    try:
        await assign(r, ("0_0", "0_1"))
        [home] = keys_of_partition(0, 1)
        [stranger] = keys_of_partition(1, 1)  # belongs to partition 1, sent to 0
        with caplog.at_level(logging.WARNING):
            r.consumer.feed({TopicPartition(SOURCE, 0): [
                raw(0, 0, stranger, 5 * MINUTE),
                *(raw(0, 1 + i, home, 5 * MINUTE) for i in range(MISROUTE_SAMPLE)),
                raw(0, 1 + MISROUTE_SAMPLE, home, 1_000),  # late: window [0, 1 min) closed
                raw(0, 2 + MISROUTE_SAMPLE, b"\xc1", 5 * MINUTE),  # undecodable
            ]})
            await wait_until(lambda: value("relay_records_processed_total", task="0_0")
                             == MISROUTE_SAMPLE + 2, timeout_s=5, message="processed")
        await r.thread.committer.commit()
        assert value("relay_dropped_records_total", task="0_0", reason="late") == 1
        assert value("relay_dropped_records_total", task="0_0", reason="deserialize") == 1
        assert value("relay_misrouted_records_total", task="0_0") == 1
        assert value("relay_misrouted_records_total", task="0_1") is None
        status = r.thread.reporter.status_record()
        assert status["dropped"] == {"0_0": {"late": 1}}
        assert status["misrouted"] == {"0_0": 1}
        warnings = [m.getMessage() for m in caplog.records if "murmur2" in m.getMessage()]
        assert len(warnings) == 1 and "0_0" in warnings[0]
        # Counted once: a second commit adds nothing.
        await r.thread.committer.commit()
        assert value("relay_dropped_records_total", task="0_0", reason="late") == 1
        assert value("relay_skipped_records_total", task="0_0") is None
        # Fetched again (a seek back): passed over, and counted as skipped.
        r.consumer.feed({TopicPartition(SOURCE, 0): [
            raw(0, i, home, 5 * MINUTE) for i in range(1, 4)]})
        task = r.thread.registry.active["0_0"]
        await wait_until(lambda: task.records_skipped == 3, timeout_s=5, message="skipped")
        await r.thread.committer.commit()
        assert value("relay_skipped_records_total", task="0_0") == 3
        assert value("relay_records_processed_total", task="0_0") == MISROUTE_SAMPLE + 2
    finally:
        r.thread.stop()
        await asyncio.wait_for(run, 15)
