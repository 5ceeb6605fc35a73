"""A long run of changelog records held until an input position covers them is written in
slices, with the event loop running between them (RocksDB holds the GIL while it writes a
batch: one 800 MB batch stopped a member for 6 s and cost it its session). No broker: a fake
fetcher answers the reader."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import msgpack
import pytest
from aiokafka.structs import TopicPartition

import statestore.restore as restore_module
from statestore.fetch import FetchedPartition
from statestore.restore import ChangelogReader
from statestore.serdes import OrderedKeySerde
from statestore.store import (
    INPUT_POSITION_KEY,
    KeyValueStore,
    StoreSpec,
    changelog_topic_name,
    store_directory,
)

pytestmark = pytest.mark.asyncio
TP = TopicPartition(changelog_topic_name("app", "counts"), 0)
VALUE = msgpack.packb(7)


def key(n: int) -> bytes:
    return OrderedKeySerde().dumps(f"key-{n:05d}")


class ScriptedFetcher:
    """Answers each fetch with the next scripted records (then nothing), at the offsets the
    reader asks from."""

    def __init__(self, script: list[list[tuple[bytes, bytes]]]) -> None:
        self.script = list(script)
        self.end = sum(len(part) for part in script)

    def track(self, topic: str) -> None:
        pass

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def fetch(self, positions: Mapping[TopicPartition, int],
                    sent: asyncio.Event | None = None,
                    max_wait_ms: int | None = None) -> list[FetchedPartition]:
        if sent is not None:
            sent.set()
        offset = positions[TP]
        changes = self.script.pop(0) if self.script else []
        size = sum(len(k) + len(v) for k, v in changes)
        return [FetchedPartition(TP, offset, offset + len(changes), self.end, list(changes),
                                 size=size)]


def open_store(tmp_path: Path) -> KeyValueStore:
    return KeyValueStore(StoreSpec("counts"), store_directory(tmp_path, "app", "0_0", "counts"),
                         TP.topic, 0, tracks_input=True).open(bulk_load=True)


def reader_for(fetcher: ScriptedFetcher) -> ChangelogReader:
    reader = ChangelogReader("127.0.0.1:1", validate=False)
    reader._fetcher = fetcher  # type: ignore[assignment]
    return reader


async def test_a_long_held_run_is_written_in_slices_with_the_loop_running_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 3 fetches of 100 records with no input position, then one that covers them all.
    uncovered = [[(key(f * 100 + n), VALUE) for n in range(100)] for f in range(3)]
    position = (INPUT_POSITION_KEY, msgpack.packb({"in:0": 300}))
    fetcher = ScriptedFetcher([*uncovered, [position]])
    per_record = len(key(0)) + len(VALUE)
    monkeypatch.setattr(restore_module, "APPLY_SLICE_BYTES", 50 * per_record)
    store = open_store(tmp_path)
    reader = reader_for(fetcher)
    writes: list[int] = []
    original = store.apply_restore_batch

    def counting(records: list[tuple[bytes, bytes]], next_offset: int) -> None:
        writes.append(len(records))
        original(records, next_offset)

    store.apply_restore_batch = counting  # type: ignore[method-assign]
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    running = asyncio.create_task(ticker())
    try:
        reader.register(store)
        for _ in range(3):
            await reader.poll(timeout_ms=1000)
        assert store.position == 0 and writes == []  # held: no position covers them yet
        ticks_before = ticks
        await reader.poll(timeout_ms=1000)
    finally:
        running.cancel()
    # The covering fetch has one record (the position): slices are of that fetch's mean
    # record size, so by count here; the loop ran between them.
    assert sum(writes) == 301 and len(writes) >= 3 and max(writes) < 301
    assert ticks - ticks_before >= len(writes) - 1
    assert store.position == 301
    assert store.get("key-00299") == 7 and store.read_input_position() == {"in:0": 300}
    store.close()


async def test_a_store_unregistered_between_slices_keeps_its_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    fetcher = ScriptedFetcher([[(key(n), VALUE) for n in range(100)]])
    monkeypatch.setattr(restore_module, "APPLY_SLICE_BYTES", 1)  # a record per slice
    store = KeyValueStore(StoreSpec("counts"), store_directory(tmp_path, "app", "0_0", "counts"),
                          TP.topic, 0).open(bulk_load=True)
    reader = reader_for(fetcher)
    reader.register(store)
    original = store.apply_restore_batch
    writes = 0

    def unregister_after_two(records: list[tuple[bytes, bytes]], next_offset: int) -> None:
        nonlocal writes
        writes += 1
        original(records, next_offset)
        if writes == 2:
            reader.unregister(store)

    store.apply_restore_batch = unregister_after_two  # type: ignore[method-assign]
    await reader.poll(timeout_ms=1000)
    assert writes == 2  # nothing written after it stopped being read
    assert store.position == 0  # its next reader reads all of it again
    store.close()


async def test_a_restore_ends_when_its_store_is_unregistered_before_it_caught_up(
    tmp_path: Path,
) -> None:
    # A task revoked while restoring is closed, which unregisters its store: the restoration
    # must end, not wait for ever for the end of a changelog it no longer reads (a stop-the-
    # world rolling restart at 800 MB hung its thread for ten minutes so).
    fetcher = ScriptedFetcher([[(key(n), VALUE) for n in range(100)] for _ in range(50)])
    store = KeyValueStore(StoreSpec("counts"), store_directory(tmp_path, "app", "0_0", "counts"),
                          TP.topic, 0).open(bulk_load=True)
    reader = reader_for(fetcher)
    original = store.apply_restore_batch
    batches = 0

    def closed_after_two(records: list[tuple[bytes, bytes]], next_offset: int) -> None:
        nonlocal batches
        batches += 1
        original(records, next_offset)
        if batches == 2:
            reader.unregister(store)

    store.apply_restore_batch = closed_after_two  # type: ignore[method-assign]
    await asyncio.wait_for(reader.restore([store], show_progress=False), timeout=5)
    assert batches == 2 and 0 < store.position < fetcher.end
    store.close()
