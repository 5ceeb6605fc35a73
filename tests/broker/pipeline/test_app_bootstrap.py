"""A running app whose stores have no state yet starts from a snapshot: counts built offline
with Spark (a DataFrame of history, with the input offsets it reflects) continue in the
stream app, without counting the history's input twice. Real broker, local Spark."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from pyspark.sql import SparkSession

from pipeline.kafka import offset_bounds, run_sync
from pipeline.snapshot_builder import SnapshotTarget, build_from_dataframe
from statestore.restore import ChangelogReader
from tests.broker.pipeline.conftest import open_store, state
from tests.broker.streams.harness import (
    counting_app,
    create_topics,
    latest,
    produce,
    read_all,
    running,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.broker
PARTITIONS = 2
USERS = [f"user-{i}" for i in range(6)]


async def test_app_counts_on_from_a_dataframe_snapshot(
    spark: SparkSession, bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    app_id = unique("boot")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: PARTITIONS, sink: PARTITIONS})
    # The history already counts these clicks: the snapshot says so with the input offsets
    # it reflects, and the app must not count them again.
    await produce(bootstrap, source, [(u, "old click") for u in USERS])
    ends = run_sync(offset_bounds(bootstrap, source, range(PARTITIONS)))
    history = spark.createDataFrame([(u, 100 * (i + 1)) for i, u in enumerate(USERS)],
                                    "key string, value long")
    snapshots = tmp_path / "snapshots"
    build_from_dataframe(history, SnapshotTarget(app_id, "counts", snapshots),
                         partitions=PARTITIONS,
                         input_offsets={source: {p: end for p, (_, end) in ends.items()}})

    app = counting_app(app_id, bootstrap, tmp_path / "state", source, sink,
                       snapshot_dir=str(snapshots))
    await produce(bootstrap, source, [(u, "click") for u in USERS])
    expected = {u: 100 * (i + 1) + 1 for i, u in enumerate(USERS)}
    final = run_sync(offset_bounds(bootstrap, source, range(PARTITIONS)))

    async def consumed_all() -> bool:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=app_id,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            for partition, (_, end) in final.items():
                if await consumer.committed(TopicPartition(source, partition)) != end:
                    return False
            return True
        finally:
            await consumer.stop()

    async with running(app):
        await wait_until(consumed_all, timeout_s=90, message="the app to consume its input")
    outputs = await read_all(bootstrap, sink, PARTITIONS)
    # One update per new click, none for the clicks the history already counted.
    assert latest(outputs) == expected and len(outputs) == len(USERS)
    # The changelog was seeded with the snapshot: a replay gives the app's state.
    replayed_counts: dict[str, int] = {}
    for partition in range(PARTITIONS):
        # The app's count store keeps timestamps (its changelog carries them too).
        replayed = open_store(tmp_path / "replay", app_id, partition, value_serde="timestamped")
        async with ChangelogReader(bootstrap) as reader:
            await reader.restore([replayed], show_progress=False, timeout_s=60)
        kept = open_store(tmp_path / "state", app_id, partition, value_serde="timestamped")
        assert state(replayed) == state(kept)
        replayed_counts.update(replayed.items())
        replayed.close()
        kept.close()
    assert replayed_counts == expected
