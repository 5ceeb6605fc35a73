"""Restoring from a snapshot plus the changelog's tail, beside replaying the whole changelog.

Called by ``python -m benchmarks.restore --snapshot`` once the changelog is filled: builds a
snapshot of it with Spark (timed on its own: session start and build), appends a tail of
changes (1% of the records by default), then restores the same store twice into empty
directories, by full replay and by snapshot + tail, checks both hold exactly the expected
state, and reports both times and the speedup.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from rich.console import Console
from rich.table import Table

from statestore.recovery import bootstrap_from_snapshot
from statestore.restore import ChangelogReader
from statestore.serdes import MsgPackSerde, OrderedKeySerde
from statestore.snapshot import SnapshotSettings
from statestore.store import KeyValueStore, StoreSpec, changelog_topic_name, store_directory

console = Console()
STORE, TASK = "bench", "0_0"


async def append_tail(bootstrap: str, topic: str, expected: dict[bytes, bytes], records: int,
                      seed: int) -> None:
    """Overwrite, delete and add keys after the snapshot; ``expected`` follows along."""
    rng = random.Random(seed)
    existing = sorted(expected)
    key_serde, payload = OrderedKeySerde(), MsgPackSerde().dumps("tail" * 20)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20,
                                max_batch_size=1024 * 1024)
    await producer.start()
    try:
        pending = []
        for i in range(records):
            roll = rng.random()
            if roll < 0.1 and existing:
                key, value = rng.choice(existing), None
                expected.pop(key, None)
            else:
                key = rng.choice(existing) if roll < 0.8 and existing else key_serde.dumps(
                    f"tail-{i:09d}")
                value = payload
                expected[key] = value
            pending.append(await producer.send(topic, key=key, value=value, partition=0))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def build_snapshot(bootstrap: str, app: str, out_dir: Path, master: str) -> dict[str, float]:
    from pyspark.sql import SparkSession

    from pipeline.snapshot_builder import SnapshotTarget, build_from_changelog
    from pipeline.spark import spark_session

    started = time.perf_counter()
    own_session = SparkSession.getActiveSession() is None
    spark = spark_session(master, "relay-snapshot-bench")
    session_seconds = time.perf_counter() - started
    try:
        built = time.perf_counter()
        manifests = build_from_changelog(spark, bootstrap, SnapshotTarget(app, STORE, out_dir))
        build_seconds = time.perf_counter() - built
    finally:
        if own_session:
            spark.stop()
    (manifest,) = manifests
    return {"spark_start_seconds": session_seconds, "build_seconds": build_seconds,
            "snapshot_offset": manifest.offset, "snapshot_records": manifest.records}


async def restore_into_empty_store(bootstrap: str, app: str, snapshot_root: Path | None,
                                   expected: dict[bytes, bytes]) -> dict[str, float]:
    """Open an empty store (bootstrapping from the snapshot if given) and restore it; time
    both, and check the state."""
    state_dir = Path(tempfile.mkdtemp(prefix="relay-snapshot-bench-"))
    snapshot = None if snapshot_root is None else SnapshotSettings(
        snapshot_root, bootstrap).for_store(app, TASK, STORE)
    started = time.perf_counter()
    store = KeyValueStore(StoreSpec(STORE), store_directory(state_dir, app, TASK, STORE),
                          changelog_topic_name(app, STORE), 0).open(bulk_load=True)
    if snapshot is not None:
        bootstrap_from_snapshot(store, snapshot)
    opened = time.perf_counter()
    try:
        async with ChangelogReader(bootstrap) as reader:
            stats = await reader.restore([store], show_progress=False)
        store.end_bulk_load()
        store.commit()
        seconds = time.perf_counter() - started
        restored = dict(store.raw_items())
        if restored != expected:
            raise SystemExit(f"{'snapshot' if snapshot else 'replay'} restore differs from the "
                             f"expected state: {len(restored)} vs {len(expected)} keys")
    finally:
        store.close()
    return {"seconds": seconds, "open_seconds": opened - started,
            "replayed_records": stats.records}


async def measure(bootstrap: str, app: str, expected: dict[bytes, bytes], records: int, *,
                  tail_ratio: float = 0.01, master: str = "local[2]", seed: int = 11
                  ) -> dict[str, Any]:
    """The snapshot figures for the changelog of ``app``'s store ``bench`` (``expected`` is
    its state now; it is updated with the tail)."""
    expected = dict(expected)
    root = Path(tempfile.mkdtemp(prefix="relay-snapshots-"))
    console.print(f"building a snapshot of {records:,} changelog records with Spark ({master}) …")
    build = build_snapshot(bootstrap, app, root, master)
    tail = max(1, int(records * tail_ratio))
    await append_tail(bootstrap, changelog_topic_name(app, STORE), expected, tail, seed)
    replay = await restore_into_empty_store(bootstrap, app, None, expected)
    snapshot = await restore_into_empty_store(bootstrap, app, root, expected)
    return {
        **build, "tail_records": tail, "final_keys": len(expected),
        "replay_seconds": replay["seconds"], "replay_records": replay["replayed_records"],
        "snapshot_restore_seconds": snapshot["seconds"],
        "snapshot_load_seconds": snapshot["open_seconds"],
        "snapshot_tail_records": snapshot["replayed_records"],
        "speedup": replay["seconds"] / snapshot["seconds"] if snapshot["seconds"] else 0.0,
        "verified": True,
    }


def print_report(result: dict[str, Any]) -> None:
    table = Table(title=f"restoring from a snapshot + {result['tail_records']:,}-record tail "
                        f"vs replaying {result['replay_records']:,} records")
    for column in ("", "seconds", "records replayed"):
        table.add_column(column, justify="right")
    table.add_row("full replay", f"{result['replay_seconds']:.2f}",
                  f"{result['replay_records']:,}")
    table.add_row("snapshot + tail", f"{result['snapshot_restore_seconds']:.2f}",
                  f"{result['snapshot_tail_records']:,}")
    console.print(table)
    console.print(
        f"speedup {result['speedup']:.1f}x (snapshot load {result['snapshot_load_seconds']:.2f}s);"
        f" snapshot build {result['build_seconds']:.1f}s with Spark (+ "
        f"{result['spark_start_seconds']:.1f}s session start), {result['snapshot_records']:,} "
        f"keys; both stores verified ({result['final_keys']:,} keys)"
    )
