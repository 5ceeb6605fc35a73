"""The scaling benchmark's app for faust-streaming, equivalent to :mod:`benchmarks.scaling_app`:
an agent over the same input topic keeps, per key, a running count and the last payload in a
table, and for every record sends an output naming its partition, process and time.

Each worker also publishes, once a second, its consumer generation and the changelog records
its tables applied during recovery, so the benchmark counts rebalances and replayed records
the way it does for Relay (whose members publish the same on their status topic).
Settings come from BENCH_* variables; run it with
``python -m faust -A benchmarks.scaling_faust_app worker --without-web``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

import faust
import msgpack
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

PID = os.getpid()
BOOTSTRAP = os.environ.get("BENCH_BOOTSTRAP", "127.0.0.1:9092")
APP_ID = os.environ.get("BENCH_APP_ID", "scaling-faust")
PARTITIONS = int(os.environ.get("BENCH_PARTITIONS", "4"))
#: ``rocksdb://`` uses rocksdict when python-rocksdb is absent (faust-streaming ≥ 0.10).
STORE = os.environ.get("BENCH_FAUST_STORE", "rocksdb://")


async def _log_ends(self: AIOKafkaConsumerThread, partitions: list[Any]) -> dict[Any, int]:
    """The end of each partition's log, for faust's recovery.

    Workaround for the embedded broker (Tansu): faust takes a changelog's end from
    ListOffsets(latest), which Tansu answers with the last batch's base offset + 1 instead of
    the log end. Recovery then stops short of the last batch, and a worker whose RocksDB
    already holds a later offset crashes with ConsistencyError ("The persisted offset for
    changelog topic partition … is higher than the last offset in that topic (highwater)").
    The high watermark of a fetch is right, so fetch once from just before that answer.
    """
    approximate = await self._ensure_consumer().end_offsets(partitions)
    probe = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False)
    await probe.start()
    ends: dict[Any, int] = {}
    try:
        by_tp = {TopicPartition(tp.topic, tp.partition): tp for tp in partitions}
        probe.assign(list(by_tp))
        for tp in by_tp:
            probe.seek(tp, max(0, approximate[by_tp[tp]] - 1))
        deadline = time.monotonic() + 10
        while len(ends) < len(by_tp) and time.monotonic() < deadline:
            await probe.getmany(timeout_ms=200)
            for tp, original in by_tp.items():
                highwater = probe.highwater(tp)
                if highwater is not None:
                    ends[original] = max(highwater, approximate[original])
    finally:
        await probe.stop()
    return {tp: ends.get(tp, approximate[tp]) for tp in partitions}


AIOKafkaConsumerThread._highwaters = _log_ends  # type: ignore[method-assign]


class CountingTable(faust.Table):
    """A table that counts the changelog records it applies (recovery of actives and
    standbys), which faust does not report."""

    applied_from_changelog = 0

    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        events = list(batch)
        CountingTable.applied_from_changelog += len(events)
        super().apply_changelog_batch(events)


app = faust.App(
    APP_ID,
    broker=f"kafka://{BOOTSTRAP}",
    store=STORE,
    datadir=os.environ.get("BENCH_DATA_DIR", ".faust-data"),
    topic_partitions=PARTITIONS,
    topic_replication_factor=1,
    consumer_auto_offset_reset="earliest",
    broker_session_timeout=float(os.environ.get("BENCH_SESSION_TIMEOUT_S", "6")),
    broker_heartbeat_interval=1.0,
    broker_commit_interval=0.5,
    table_standby_replicas=int(os.environ.get("BENCH_STANDBYS", "0")),
    web_enabled=False,
)
source = app.topic(os.environ.get("BENCH_INPUT", "scaling-in"), key_type=bytes,
                   value_type=bytes, key_serializer="raw", value_serializer="raw",
                   partitions=PARTITIONS)
sink = app.topic(os.environ.get("BENCH_OUTPUT", "scaling-out"), key_serializer="raw",
                 value_serializer="raw", partitions=1)
status = app.topic(os.environ.get("BENCH_STATUS", "scaling-faust-status"),
                   key_serializer="raw", value_serializer="raw", partitions=1)
state = app.tables.add(CountingTable(
    app, name="state", beacon=app.tables.beacon, partitions=PARTITIONS, key_type=str))


@app.agent(source)
async def track(stream: faust.StreamT) -> None:
    async for event in stream.events():
        key: str = msgpack.unpackb(event.key, raw=False)
        value = msgpack.unpackb(event.value, raw=False)
        previous = state.get(key)
        count = (previous["n"] if previous else 0) + 1
        state[key] = {"n": count, "blob": value["blob"]}
        partition = event.message.partition
        await sink.send(key=event.key, partition=0, value=msgpack.packb(
            {"n": count, "task": f"0_{partition}", "pid": PID, "t": time.time(),
             "seq": value.get("seq")}))


@app.timer(interval=1.0)
async def publish_status() -> None:
    assigned = sorted(tp.partition for tp in app.consumer.assignment()
                      if tp.topic == source.get_topic_name())
    await status.send(key=str(PID).encode(), partition=0, value=msgpack.packb(
        {"pid": PID, "generation": app.consumer_generation_id, "assigned": assigned,
         "restored_records": CountingTable.applied_from_changelog,
         "updated_ms": int(time.time() * 1000)}))
