"""The throughput benchmark's app for faust-streaming, equivalent to Relay's counting app
(:mod:`benchmarks.throughput_apps`): an agent over the prefilled input keeps a count per key
in a RocksDB table (through rocksdict) with its changelog, commits every
``BENCH_COMMIT_MS``, and sends every updated count on with the input's key. Run it with
``python -m faust -A benchmarks.throughput_faust_app worker --without-web``; settings come
from BENCH_* variables."""

from __future__ import annotations

import faust
import msgpack

from benchmarks.throughput_progress import Progress, settings

S = settings()
PARTITIONS = int(S.get("partitions", "4"))
progress = Progress().start()

app = faust.App(
    S.get("group", "throughput-faust"),
    broker=f"kafka://{S.get('bootstrap', '127.0.0.1:9092')}",
    store="rocksdb://",
    datadir=S.get("state_dir", ".faust-data"),
    topic_partitions=PARTITIONS,
    topic_replication_factor=1,
    consumer_auto_offset_reset="earliest",
    broker_commit_interval=int(S.get("commit_ms", "1000")) / 1000,
    web_enabled=False,
)
source = app.topic(S.get("input", "throughput-in"), key_type=bytes, value_type=bytes,
                   key_serializer="raw", value_serializer="raw", partitions=PARTITIONS)
sink = app.topic(S.get("output", "throughput-out"), key_serializer="raw",
                 value_serializer="raw", partitions=PARTITIONS)
counts = app.Table("counts", key_type=str, value_type=int, default=int,
                   partitions=PARTITIONS)


@app.agent(source)
async def count(stream: faust.StreamT) -> None:
    async for event in stream.events():
        key: str = msgpack.unpackb(event.key)
        counts[key] += 1
        await sink.send(key=event.key, value=msgpack.packb(counts[key]))
        progress.hit()
