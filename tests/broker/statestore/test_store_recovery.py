"""A store that cannot be trusted is never used as if whole, and a store that cannot be
written says so with its own error.

A truncated SST file, garbage in RocksDB's ``CURRENT`` and a store directory deleted while its
checkpoint stayed each mean a wiped store, a warning naming it, and a full restore from the
changelog. A changelog that ends with writes no input position covers (a writer killed
mid-commit) is restored without them, and the task writes the restored values over them. A
failing disk is a :class:`StoreWriteError`, not a bad record. The broker is used where
restoration is the point."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from statestore.changelog import ChangelogWriter
from statestore.recovery import open_task_store
from statestore.restore import ChangelogReader
from statestore.store import KeyValueStore, StoreSpec, changelog_topic_name, store_directory
from statestore.topics import COMPACTED, TopicSpec, ensure_topics

PARTITION = 0


def task_store(state_dir: Path, app: str) -> KeyValueStore:
    return open_task_store(
        StoreSpec("counts"), store_directory(state_dir, app, f"0_{PARTITION}", "counts"),
        changelog_topic_name(app, "counts"), PARTITION,
    )


def truncate_an_sst_file(directory: Path) -> None:
    sst = max(directory.glob("*.sst"), key=lambda p: p.stat().st_size)
    with open(sst, "r+b") as handle:
        handle.truncate(sst.stat().st_size // 2)


def garble_current(directory: Path) -> None:
    (directory / "CURRENT").write_bytes(b"\x00garbage-that-names-no-manifest\n")


def delete_the_store_directory(directory: Path) -> None:
    for path in sorted(directory.rglob("*"), reverse=True):
        path.unlink()
    directory.rmdir()


DAMAGE = {
    "truncated SST file": truncate_an_sst_file,
    "garbage in CURRENT": garble_current,
    "store directory deleted, checkpoint kept": delete_the_store_directory,
}


def committed_by_hand(store: KeyValueStore, counts: dict[str, int]) -> None:
    """Write and commit as if the changelog had acknowledged every record."""
    for key, count in counts.items():
        store.put(key, count)
    store.write_input_position({"in:0": sum(counts.values())})
    sent = store.drain_changelog()
    store.acknowledged(store.position + len(sent), len(sent))
    store.commit()


def test_a_store_knows_nothing_of_snapshots_or_the_broker() -> None:
    """Stores are passive: deciding what to load, and talking to the broker for it, is the
    recovery layer's."""
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, statestore.store; print(sorted(sys.modules))"],
        capture_output=True, text=True, check=True,
    ).stdout
    for module in ("statestore.snapshot", "statestore.recovery", "aiokafka"):
        assert f"'{module}'" not in loaded


def test_a_full_disk_during_a_commit_is_a_store_write_error(tmp_path: Path) -> None:
    """RocksDB cannot write its flush (the file size limit stands in for a full disk)."""
    directory = store_directory(tmp_path, "app", "0_0", "counts")
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            import os, resource, signal
            from statestore.errors import StoreWriteError
            from statestore.store import KeyValueStore, StoreSpec
            store = KeyValueStore(StoreSpec("counts"), {str(directory)!r}, "t", 0).open()
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
            for i in range(20_000):
                store.put(f"k{{i}}", os.urandom(100).hex())  # incompressible
            sent = store.drain_changelog()
            store.acknowledged(len(sent), len(sent))
            try:
                store.commit()
            except StoreWriteError as exc:
                print("StoreWriteError:", exc)
        """)],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert "StoreWriteError: store counts[0]" in result.stdout, result.stderr[-2000:]
    assert "commit failed" in result.stdout


# -- with the broker: restoration ----------------------------------------------------------


@pytest.fixture
async def app_id(admin: AIOKafkaAdminClient, unique: Callable[[str], str]) -> str:
    app = unique("recover")
    await ensure_topics(admin, [TopicSpec(changelog_topic_name(app, "counts"), 1, COMPACTED)])
    return app


async def write_group(store: KeyValueStore, writer: ChangelogWriter, counts: dict[str, int],
                      position: int | None) -> None:
    """Writes shipped as a task ships them: the changes, then the input position covering
    them (None: the writer died before it wrote the position)."""
    for key, count in counts.items():
        store.put(key, count)
    if position is not None:
        store.write_input_position({"in:0": position})
    await writer.flush([store])


async def restored(state_dir: Path, app: str, bootstrap: str) -> KeyValueStore:
    store = task_store(state_dir, app)
    async with ChangelogReader(bootstrap) as reader:
        await reader.restore([store], show_progress=False, timeout_s=60)
    return store


@pytest.mark.broker
@pytest.mark.parametrize("damage", list(DAMAGE))
async def test_a_damaged_store_restores_exactly_from_its_changelog(
    tmp_path: Path, bootstrap: str, producer: AIOKafkaProducer, app_id: str, damage: str
) -> None:
    store = task_store(tmp_path, app_id)
    writer = ChangelogWriter(producer)
    counts = {f"k{i}": i for i in range(200)}
    await write_group(store, writer, counts, 200)
    store.commit()
    directory = store.directory
    store.close()
    DAMAGE[damage](directory)

    again = await restored(tmp_path, app_id, bootstrap)
    assert dict(again.items()) == counts
    assert again.read_input_position() == {"in:0": 200}
    again.close()


@pytest.mark.broker
async def test_writes_no_input_position_covers_are_not_restored_and_get_written_over(
    tmp_path: Path, bootstrap: str, producer: AIOKafkaProducer, app_id: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer = ChangelogWriter(producer)
    first = task_store(tmp_path / "first", app_id)
    covered = {f"k{i}": 1 for i in range(100)}
    await write_group(first, writer, covered, 100)
    # The writer dies after sending part of its next commit: counts for input it will not
    # have covered with a position when it is processed again.
    await write_group(first, writer, {f"k{i}": 2 for i in range(50, 150)}, None)
    first.abort()
    first.close()

    with caplog.at_level(logging.WARNING, logger="statestore"):
        second = await restored(tmp_path / "second", app_id, bootstrap)
        assert dict(second.items()) == covered
        assert second.read_input_position() == {"in:0": 100}
        # Becoming a running task's store, it writes the restored values over them.
        second.end_bulk_load()
    assert "100 writes no input position covers" in caplog.text
    await writer.flush([second])
    second.commit()
    second.close()

    # Whoever restores the changelog now, to its end, gets the covered state.
    third = await restored(tmp_path / "third", app_id, bootstrap)
    assert dict(third.items()) == covered
    assert third.read_input_position() == {"in:0": 100}
    third.close()


@pytest.mark.broker
async def test_a_standby_applies_a_group_once_its_input_position_arrives(
    tmp_path: Path, bootstrap: str, producer: AIOKafkaProducer, app_id: str
) -> None:
    writer = ChangelogWriter(producer)
    active = task_store(tmp_path / "active", app_id)
    standby = task_store(tmp_path / "standby", app_id)
    async with ChangelogReader(bootstrap) as reader:
        reader.register(standby)
        await write_group(active, writer, {"a": 1, "b": 1}, None)

        async def read_to_end(end: int) -> None:
            # The end the written records make: a fetch kept in flight may have been answered
            # before they were written, and gives the end as it was then.
            for _ in range(100):
                await reader.poll(timeout_ms=100)
                if reader.caught_up(standby) and (reader.progress(standby).end or 0) >= end:
                    return
                await asyncio.sleep(0)
            raise AssertionError("the standby did not read to the changelog's end")

        await read_to_end(2)
        assert list(standby.items()) == []  # read, and held until covered
        await write_group(active, writer, {"c": 1}, 3)
        await read_to_end(4)  # c and the input position
        assert dict(standby.items()) == {"a": 1, "b": 1, "c": 1}
        assert standby.read_input_position() == {"in:0": 3}
    active.abort()
    active.close()
    standby.close()
