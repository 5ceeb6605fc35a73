"""A store opened for restoration (``bulk_load``) takes restore batches, then, after
``end_bulk_load``, serves reads and writes like any store, keeping its directory locked and
its data; however it was last opened, the next open uses the options asked for."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from statestore.errors import StoreLockedError
from statestore.serdes import OrderedKeySerde
from statestore.store import KeyValueStore, StoreSpec

KEYS = OrderedKeySerde()


def open_store(directory: Path, bulk_load: bool) -> KeyValueStore:
    return KeyValueStore(StoreSpec("counts"), directory, "app-counts-changelog", 0).open(
        bulk_load=bulk_load)


def memtable_factory(directory: Path) -> str:
    """The memtable factory the database was last opened with, from its OPTIONS file."""
    latest = max(directory.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    for line in latest.read_text().splitlines():
        if line.strip().startswith("memtable_factory="):
            return line.strip().split("=", 1)[1]
    raise AssertionError(f"no memtable_factory in {latest}")


def restore_batches(seed: int) -> tuple[list[list[tuple[bytes, bytes | None]]], dict]:
    rng = random.Random(seed)
    model: dict[bytes, bytes] = {}
    batches = []
    for _ in range(5):
        batch: list[tuple[bytes, bytes | None]] = []
        for i in range(2000):
            key = KEYS.dumps(f"k{rng.randrange(500)}")
            value = None if rng.random() < 0.2 else f"v{i}".encode()
            batch.append((key, value))
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        batches.append(batch)
    return batches, model


def test_a_bulk_loaded_store_serves_reads_and_writes_after_the_load(tmp_path: Path) -> None:
    directory = tmp_path / "counts"
    store = open_store(directory, bulk_load=True)
    assert store.bulk_loading
    batches, model = restore_batches(seed=3)
    offset = 0
    for batch in batches:
        offset += len(batch)
        store.apply_restore_batch(batch, offset)
    store.end_bulk_load()
    assert not store.bulk_loading
    assert "SkipList" in memtable_factory(directory)
    assert dict(store.raw_items()) == model
    assert store.position == offset
    # Still locked by this store while it switched memtables.
    with pytest.raises(StoreLockedError):
        open_store(directory, bulk_load=False)
    store.put("new", 1)
    assert store.get("new") == 1
    assert len(store.drain_changelog()) == 1  # as if sent and acknowledged
    store.acknowledged(offset + 1)
    store.commit()
    store.close()

    reopened = open_store(directory, bulk_load=False)
    assert reopened.position == offset + 1
    assert reopened.get("new") == 1
    assert len(dict(reopened.raw_items())) == len(model) + 1
    reopened.close()


def test_a_store_closed_while_bulk_loading_reopens_with_the_default_memtable(
    tmp_path: Path,
) -> None:
    """A task revoked mid-restore closes its store in bulk mode; the next open for a running
    task must not inherit the bulk memtable from the database's saved options."""
    directory = tmp_path / "counts"
    store = open_store(directory, bulk_load=True)
    store.apply_restore_batch([(KEYS.dumps("a"), b"1")], 1)
    store.commit()
    store.close()
    assert "Vector" in memtable_factory(directory)

    store = open_store(directory, bulk_load=False)
    assert "SkipList" in memtable_factory(directory)
    assert dict(store.raw_items()) == {KEYS.dumps("a"): b"1"}
    store.close()


def test_end_bulk_load_is_a_no_op_for_a_store_opened_for_reads(tmp_path: Path) -> None:
    store = open_store(tmp_path / "counts", bulk_load=False)
    store.put("a", 1)
    store.end_bulk_load()
    assert store.get("a") == 1
    store.close()
