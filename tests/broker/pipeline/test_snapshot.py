"""Snapshots: built with Spark from the changelog or from a DataFrame, loaded by a store that
opens without a checkpoint, and refused when they do not fit. Real broker, local Spark."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipeline.kafka import partition_for
from pipeline.snapshot_builder import SnapshotTarget, build_from_changelog, build_from_dataframe
from statestore.checkpoint import Checkpoint, write_checkpoint
from statestore.serdes import MsgPackSerde, OrderedKeySerde
from statestore.snapshot import (
    MANIFEST_FILE,
    SST_FILE,
    SnapshotError,
    SnapshotRef,
    SnapshotSettings,
    verify_snapshot,
)
from tests.broker.pipeline.conftest import (
    create_changelog,
    open_store,
    restore,
    state,
    write_history,
)

pytestmark = pytest.mark.broker
PARTITIONS = 2


def snapshot_ref(root: Path, app: str, partition: int, bootstrap: str) -> SnapshotRef:
    return SnapshotSettings(root, bootstrap).for_store(app, f"0_{partition}", "counts")


def test_changelog_snapshot_plus_tail_equals_full_replay(
    spark: SparkSession, bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    app = unique("snap")
    create_changelog(bootstrap, app, PARTITIONS)
    writers = [open_store(tmp_path / "writer", app, p) for p in range(PARTITIONS)]
    for partition, store in enumerate(writers):
        write_history(bootstrap, store, 400 + 100 * partition, seed=partition)
    snapshot_positions = [store.position for store in writers]
    # A copy that restored partition 0 up to an earlier point and checkpointed there.
    stale = open_store(tmp_path / "booted", app, 0)
    restore(bootstrap, stale)
    stale.put("stale-only", 1)  # state the snapshot does not have: it must go
    sent = stale.drain_changelog()
    stale.acknowledged(stale.position, len(sent))  # as if the changelog had it
    stale.close()
    write_checkpoint(stale.directory, Checkpoint(stale.changelog_topic or "", 0,
                                                 snapshot_positions[0] - 100))

    manifests = build_from_changelog(spark, bootstrap, SnapshotTarget(app, "counts",
                                                                      tmp_path / "snapshots"))
    assert [(m.partition, m.task, m.offset, m.source) for m in manifests] == [
        (p, f"0_{p}", snapshot_positions[p], "changelog") for p in range(PARTITIONS)]
    for manifest, store in zip(manifests, writers, strict=True):
        # Every live key plus the input position, nothing deleted.
        assert manifest.records == len(dict(store.raw_items())) + 1

    # The changelog moves on after the build: the tail is replayed on top of the snapshot.
    for partition, store in enumerate(writers):
        write_history(bootstrap, store, 120, seed=10 + partition, first_input_offset=1000)
        store.close()

    for partition in range(PARTITIONS):
        replayed = open_store(tmp_path / "replay", app, partition)
        assert restore(bootstrap, replayed) == writers[partition].position
        booted = open_store(tmp_path / "booted", app, partition,
                            snapshot=snapshot_ref(tmp_path / "snapshots", app, partition,
                                                  bootstrap))
        assert booted.position == snapshot_positions[partition]
        tail = restore(bootstrap, booted)
        assert tail == writers[partition].position - snapshot_positions[partition]
        assert state(booted) == state(replayed)
        assert booted.read_input_position()["in:0"] > 1000
        assert booted.position == replayed.position
        booted.commit()
        booted.close()
        # Reopened with its checkpoint, it ignores the older snapshot and keeps its state.
        again = open_store(tmp_path / "booted", app, partition,
                           snapshot=snapshot_ref(tmp_path / "snapshots", app, partition,
                                                 bootstrap))
        assert again.position == replayed.position and state(again) == state(replayed)
        again.close()
        replayed.close()


def test_dataframe_snapshot_seeds_the_changelog(
    spark: SparkSession, bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    app = unique("seed")
    create_changelog(bootstrap, app, PARTITIONS)
    # History with overwrites (ordered by `offset`) and deletions (null values).
    history = [(f"user-{i % 40}", {"clicks": i}, i) for i in range(200)]
    history += [(f"user-{i}", None, 500 + i) for i in range(0, 40, 7)]
    df = spark.createDataFrame(history, "key string, value struct<clicks:int>, offset long")
    target = SnapshotTarget(app, "counts", tmp_path / "snapshots")
    manifests = build_from_dataframe(df, target, partitions=PARTITIONS,
                                     input_offsets={"clicks": {0: 7, 1: 9}})

    expected: dict[str, dict] = {}
    for key, value, _ in sorted(history, key=lambda row: row[2]):
        if value is None:
            expected.pop(key, None)
        else:
            expected[key] = value
    # Every live key, and one input position per task.
    assert sum(m.records for m in manifests) == len(expected) + PARTITIONS
    assert {m.source for m in manifests} == {"dataframe"}

    seen: dict[str, dict] = {}
    for partition in range(PARTITIONS):
        ref = snapshot_ref(tmp_path / "snapshots", app, partition, bootstrap)
        booted = open_store(tmp_path / "booted", app, partition, snapshot=ref)
        items = dict(booted.items())
        seen.update(items)
        assert booted.read_input_position() == {f"clicks:{partition}": 7 + 2 * partition}
        # The changelog now holds the same state: a fresh store replaying it agrees.
        replayed = open_store(tmp_path / "replay", app, partition)
        restore(bootstrap, replayed)
        assert state(replayed) == state(booted)
        assert booted.position == replayed.position > 0
        # A second machine bootstrapping from the same snapshot finds it seeded already.
        other = open_store(tmp_path / "other", app, partition, snapshot=ref)
        assert other.position == booted.position
        assert restore(bootstrap, other) == 0
        assert state(other) == state(booted)
        for store in (booted, replayed, other):
            store.close()
    assert seen == expected
    # Keys sit in the partition the runtime's partitioner gives them (msgpack topic keys).
    for manifest in manifests:
        ref = snapshot_ref(tmp_path / "snapshots", app, manifest.partition, bootstrap)
        store = open_store(tmp_path / "booted", app, manifest.partition, snapshot=ref)
        for key in store:
            assert partition_for(MsgPackSerde().dumps(key), PARTITIONS) == manifest.partition
        store.close()


def corrupt_manifest(field: str, value: object) -> Callable[[Path], None]:
    def change(directory: Path) -> None:
        path = directory / MANIFEST_FILE
        manifest = json.loads(path.read_text())
        manifest[field] = value
        path.write_text(json.dumps(manifest))

    return change


def flip_sst_byte(directory: Path) -> None:
    path = directory / SST_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def garble_manifest(directory: Path) -> None:
    (directory / MANIFEST_FILE).write_text("{not json")


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (corrupt_manifest("app", "another-app"), "is for another store: app='another-app'"),
        (corrupt_manifest("store", "other"), "is for another store: store='other'"),
        (corrupt_manifest("partition", 0), "is for another store: partition=0"),
        (flip_sst_byte, "corrupt or replaced file"),
        (garble_manifest, "corrupt snapshot manifest"),
    ],
    ids=["app", "store", "partition", "checksum", "manifest"],
)
def test_bad_snapshot_is_refused_and_the_store_restores_from_the_changelog(
    spark: SparkSession, bootstrap: str, tmp_path: Path, unique: Callable[[str], str],
    caplog: pytest.LogCaptureFixture, spoil: Callable[[Path], None], message: str,
    built_snapshot: tuple[str, Path],
) -> None:
    app, snapshots = built_snapshot
    spoiled = tmp_path / "spoiled"
    shutil.copytree(snapshots, spoiled)
    ref = snapshot_ref(spoiled, app, 1, bootstrap)
    spoil(ref.directory)
    with pytest.raises(SnapshotError, match=message):
        verify_snapshot(ref.directory, app=app, store="counts", task="0_1", partition=1,
                        changelog=f"{app}-counts-changelog")
    with caplog.at_level(logging.WARNING, logger="statestore.snapshot"):
        store = open_store(tmp_path / "state", app, 1, snapshot=ref)
    assert any(message in r.getMessage() and "restores from its changelog" in r.getMessage()
               for r in caplog.records)
    assert store.position == 0 and list(store.items()) == []
    restore(bootstrap, store)
    replayed = open_store(tmp_path / "replay", app, 1)
    restore(bootstrap, replayed)
    assert state(store) == state(replayed) and len(state(store)[0]) > 0
    store.close()
    replayed.close()


@pytest.fixture(scope="module")
def built_snapshot(
    spark: SparkSession, bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    """One changelog snapshot the refusal tests spoil copies of."""
    import uuid

    app = f"spoil-{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("spoil")
    create_changelog(bootstrap, app, PARTITIONS)
    store = open_store(root / "writer", app, 1)
    write_history(bootstrap, store, 200, seed=5)
    store.close()
    build_from_changelog(spark, bootstrap, SnapshotTarget(app, "counts", root / "snapshots"))
    return app, root / "snapshots"


def test_ordered_keys_sort_like_rocksdb() -> None:
    """Spark sorts binary keys unsigned, byte by byte, which is RocksDB's order: checked on
    keys whose first bytes differ in sign when read as signed bytes."""
    keys = [OrderedKeySerde().dumps(k) for k in (-5, 3, "a", "\u00e9", b"\x7f", b"\x80")]
    assert sorted(keys) == sorted(keys, key=lambda k: list(k))


def changelog_end(bootstrap: str, app: str, partition: int) -> int:
    from pipeline.kafka import offset_bounds, run_sync

    return run_sync(offset_bounds(bootstrap, f"{app}-counts-changelog", [partition]))[partition][1]


def test_dataframe_snapshot_never_seeds_over_other_state(
    spark: SparkSession, bootstrap: str, tmp_path: Path, unique: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = unique("foreign")
    create_changelog(bootstrap, app, 1)
    writer = open_store(tmp_path / "writer", app, 0)
    write_history(bootstrap, writer, 100, seed=4)
    writer.close()
    end = changelog_end(bootstrap, app, 0)
    df = spark.createDataFrame([("a", 1), ("b", 2)], "key string, value long")
    build_from_dataframe(df, SnapshotTarget(app, "counts", tmp_path / "snapshots"), partitions=1)

    ref = SnapshotSettings(tmp_path / "snapshots", bootstrap).for_store(app, "0_0", "counts")
    with caplog.at_level(logging.WARNING, logger="statestore.snapshot"):
        store = open_store(tmp_path / "state", app, 0, snapshot=ref)
    assert any(f"already holds {end} records of other state" in r.getMessage()
               for r in caplog.records)
    assert store.position == 0
    restore(bootstrap, store)
    replayed = open_store(tmp_path / "replay", app, 0)
    restore(bootstrap, replayed)
    assert state(store) == state(replayed)
    assert changelog_end(bootstrap, app, 0) == end  # nothing was written
    store.close()
    replayed.close()


def test_interrupted_seeding_is_seeded_again(
    spark: SparkSession, bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    import asyncio

    from pipeline.kafka import produce
    from statestore.snapshot import SEED_MARKER_KEY, read_manifest, seed_marker

    app = unique("resume")
    create_changelog(bootstrap, app, 1)
    df = spark.createDataFrame([(f"k{i}", i) for i in range(30)], "key string, value long")
    build_from_dataframe(df, SnapshotTarget(app, "counts", tmp_path / "snapshots"), partitions=1)
    ref = SnapshotSettings(tmp_path / "snapshots", bootstrap).for_store(app, "0_0", "counts")
    manifest = read_manifest(ref.directory)
    assert manifest is not None and manifest.records == 30
    # A bootstrap that died after the start marker and a third of the records.
    partial = [(0, SEED_MARKER_KEY, seed_marker(manifest, "start"), None)]
    partial += [(0, OrderedKeySerde().dumps(f"k{i}"), MsgPackSerde().dumps(i), None)
                for i in range(10)]
    asyncio.run(produce(bootstrap, f"{app}-counts-changelog", partial))

    store = open_store(tmp_path / "state", app, 0, snapshot=ref)
    assert dict(store.items()) == {f"k{i}": i for i in range(30)}
    replayed = open_store(tmp_path / "replay", app, 0)
    restore(bootstrap, replayed)
    assert state(replayed) == state(store)
    assert store.position == changelog_end(bootstrap, app, 0) == 1 + 10 + 30 + 1
    store.close()
    replayed.close()
