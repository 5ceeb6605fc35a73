"""``python -m benchmarks.restore --records N --json PATH``: restoration speed.

Fills a changelog with N records (100-byte values; a realistic mix of new keys, overwrites
and deletes), then, on the same broker and in the same run, measures (a) the raw rate at which
aiokafka alone consumes that changelog — the limit for any restore from it — and (b) Relay's
restoration into RocksDB, and checks the restored store holds exactly the last value per key.
Prints both rates and their ratio and writes them to PATH. With ``--snapshot`` it also times
restoring from a Spark-built snapshot plus tail beside a full replay (``snapshot_restore``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import platform
import pstats
import random
import resource
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition
from rich.console import Console
from rich.table import Table

from benchmarks import snapshot_restore
from benchmarks.broker_engine import (
    add_engine_arguments,
    describe,
    engine_label,
    measure_join_round,
    rounds_dict,
    start_broker,
)
from statestore.bulk_send import BoundedSender
from statestore.restore import ChangelogReader
from statestore.serdes import MsgPackSerde, OrderedKeySerde
from statestore.store import KeyValueStore, StoreSpec, changelog_topic_name, store_directory
from statestore.topics import COMPACTED, TopicSpec, ensure_topics

console = Console()


@dataclass
class Run:
    records: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


async def fill(bootstrap: str, topic: str, records: int, keys: int, value_size: int,
               delete_ratio: float, seed: int) -> tuple[dict[bytes, bytes], float, int]:
    """Produce the changelog; returns the expected final state and the produce rate."""
    rng = random.Random(seed)
    key_serde, value_serde = OrderedKeySerde(), MsgPackSerde()
    encoded_keys = [key_serde.dumps(f"key-{i:09d}") for i in range(keys)]
    payload = value_serde.dumps("v" * (value_size - 3))
    expected: dict[bytes, bytes] = {}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=50,
                                max_batch_size=1024 * 1024, max_request_size=8 * 1024 * 1024)
    await producer.start()
    total_bytes = 0
    started = time.perf_counter()
    try:
        sender = BoundedSender(producer, window=50_000)
        for i in range(records):
            key = encoded_keys[rng.randrange(keys)] if i >= keys // 2 else encoded_keys[i]
            if key in expected and rng.random() < delete_ratio:
                value = None
                expected.pop(key)
            else:
                value = payload
                expected[key] = value
            total_bytes += len(key) + (len(value) if value else 0)
            await sender.send(topic, key=key, value=value, partition=0)
        await sender.flush()
    finally:
        await producer.stop()
    return expected, records / (time.perf_counter() - started), total_bytes


async def raw_consume(bootstrap: str, topic: str) -> Run:
    """aiokafka alone: fetch the whole partition with the reader's settings, count records."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_bytes=64 * 2**20,
        max_partition_fetch_bytes=16 * 2**20, fetch_max_wait_ms=100, check_crcs=False)
    await consumer.start()
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    count = 0
    started = time.perf_counter()
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=100, max_records=50_000)
            for records in batches.values():
                count += len(records)
            highwater = consumer.highwater(tp)
            if highwater is not None and count >= highwater:
                break
    finally:
        seconds = time.perf_counter() - started
        await consumer.stop()
    return Run(count, seconds)


async def relay_restore(bootstrap: str, app: str, expected: dict[bytes, bytes] | None,
                        profile: cProfile.Profile | None = None) -> Run:
    state_dir = Path(tempfile.mkdtemp(prefix="relay-restore-bench-"))
    store = KeyValueStore(StoreSpec("bench"), store_directory(state_dir, app, "0_0", "bench"),
                          changelog_topic_name(app, "bench"), 0).open(bulk_load=True)
    try:
        async with ChangelogReader(bootstrap) as reader:
            if profile is not None:
                profile.enable()
            started = time.perf_counter()
            stats = await reader.restore([store], show_progress=False)
            # As a stream thread does it: restored means readable, flushed and checkpointed.
            store.end_bulk_load()
            store.commit()
            seconds = time.perf_counter() - started
            if profile is not None:
                profile.disable()
        if expected is not None:
            restored = dict(store.raw_items())
            if restored != expected:
                missing = len(set(expected) - set(restored))
                extra = len(set(restored) - set(expected))
                raise SystemExit(f"restored store differs: {missing} keys missing, {extra} "
                                 f"extra, {len(restored)} vs {len(expected)} keys")
        return Run(stats.records, seconds)
    finally:
        store.close()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = start_broker(args.engine, args.kafka_nodes)
        bootstrap = broker.bootstrap_servers
    engine: dict[str, Any] = {"broker": describe(args.engine, args.kafka_nodes, args.bootstrap)}
    raw_runs: list[Run] = []
    relay_runs: list[Run] = []
    errors: list[str] = []
    snapshot = profile_text = None
    try:
        engine["join_round"] = rounds_dict(await measure_join_round(bootstrap))
        console.print(engine_label(engine))
        app = f"restore-bench-{uuid.uuid4().hex[:12]}"
        topic = changelog_topic_name(app, "bench")
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        await ensure_topics(admin, [TopicSpec(topic, 1, COMPACTED)])
        await admin.close()
        keys = args.keys or max(1, args.records // 4)
        console.print(f"filling {topic}: {args.records:,} records over {keys:,} keys …")
        expected, fill_rate, total_bytes = await fill(
            bootstrap, topic, args.records, keys, args.value_size, args.delete_ratio, args.seed)
        for attempt in range(args.repeat):
            # One side failing keeps the other's figures (and its own error).
            try:
                raw_runs.append(await raw_consume(bootstrap, topic))
            except Exception as exc:
                errors.append(f"aiokafka alone, run {attempt + 1}: {type(exc).__name__}: {exc}")
            try:
                relay_runs.append(await relay_restore(
                    bootstrap, app, expected if attempt == 0 else None))
            except (Exception, SystemExit) as exc:
                errors.append(f"Relay restore, run {attempt + 1}: {type(exc).__name__}: {exc}")
        if args.profile:
            profile = cProfile.Profile()
            await relay_restore(bootstrap, app, None, profile)
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(12)
            profile_text = out.getvalue()
        # Last, since it appends a tail to the changelog.
        snapshot = (await snapshot_restore.measure(bootstrap, app, expected, args.records)
                    if args.snapshot else None)
    finally:
        if broker is not None:
            broker.stop()

    def summary(runs: list[Run]) -> dict[str, float]:
        rates = [r.rate for r in runs] or [0.0]
        return {"best_records_per_s": max(rates), "median_records_per_s":
                statistics.median(rates),
                "best_seconds": min((r.seconds for r in runs), default=0.0)}

    def ratio(key: str) -> float | None:
        return relay[key] / raw[key] if raw[key] and relay[key] else None

    raw, relay = summary(raw_runs), summary(relay_runs)
    mb = total_bytes / args.records / 1e6
    result = {
        **engine, "errors": errors,
        "records": args.records, "keys": keys, "value_size": args.value_size,
        "delete_ratio": args.delete_ratio, "final_keys": len(expected),
        "changelog_mb": total_bytes / 1e6, "fill_records_per_s": fill_rate,
        "aiokafka_raw": raw, "relay_restore": relay,
        "ratio_best": ratio("best_records_per_s"),
        "ratio_median": ratio("median_records_per_s"),
        "verified": bool(relay_runs) and not any("Relay" in e for e in errors),
        "runs": {"raw": [asdict(r) for r in raw_runs],
                 "relay": [asdict(r) for r in relay_runs]},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        # The machine's 1-minute load before and after: other work skews both rates.
        "load_average": {"before": load_before[0], "after": os.getloadavg()[0],
                         "cpus": os.cpu_count()},
        "versions": {"python": platform.python_version(), "aiokafka": version("aiokafka"),
                     "rocksdict": version("rocksdict")},
        "profile_top": profile_text,
        "snapshot": snapshot,
    }
    title = f"restoring {args.records:,} changelog records ({result['changelog_mb']:.0f} MB)"
    table = Table(title=title)
    for column in ("", "best records/s", "median records/s", "best MB/s"):
        table.add_column(column)
    for name, data in (("aiokafka alone", raw), ("Relay restore", relay)):
        table.add_row(name, f"{data['best_records_per_s']:,.0f}",
                      f"{data['median_records_per_s']:,.0f}",
                      f"{data['best_records_per_s'] * mb:,.1f}")
    console.print(table)
    shown = ("-" if result["ratio_best"] is None or result["ratio_median"] is None else
             f"best {result['ratio_best']:.2f}, median {result['ratio_median']:.2f}")
    console.print(f"{engine_label(result)}; ratio Relay / aiokafka: {shown}; fill "
                  f"{fill_rate:,.0f} records/s; store "
                  f"{'verified' if result['verified'] else 'NOT verified'} "
                  f"({len(expected):,} keys); peak RSS {result['peak_rss_mb']:.0f} MB; "
                  f"load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after "
                  f"on {os.cpu_count()} CPUs")
    for error in errors:
        console.print(f"FAILED: {error}")
    if profile_text:
        console.print(profile_text)
    if snapshot:
        snapshot_restore.print_report(snapshot)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=0, help="distinct keys (default N/4)")
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--delete-ratio", type=float, default=0.1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="profile one extra restore")
    parser.add_argument("--snapshot", action="store_true",
                        help="also restore from a snapshot (built with Spark) plus tail")
    parser.add_argument("--bootstrap", default=None,
                        help="a running broker (default: a fresh one of --engine)")
    add_engine_arguments(parser)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.records < 1 or args.value_size < 4 or not 0 <= args.delete_ratio < 1:
        parser.error("need --records >= 1, --value-size >= 4 and 0 <= --delete-ratio < 1")
    result = asyncio.run(run(args))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        console.print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
