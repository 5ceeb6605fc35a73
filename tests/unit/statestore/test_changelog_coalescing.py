"""Changelog records are coalesced in the store until they are drained: a key written many
times sends its latest value once, and no write crosses an input position, so a state
restored up to any position reflects exactly the input that position names. No broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from statestore.store import INPUT_POSITION_KEY, KeyValueStore, StoreSpec

TOPIC = "app-counts-changelog"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[KeyValueStore]:
    store = KeyValueStore(StoreSpec("counts"), tmp_path / "counts", TOPIC, 0,
                          tracks_input=True).open()
    yield store
    store.abort()
    store.close()


def decoded(store: KeyValueStore, records: list[tuple[bytes, bytes | None]]) -> list[tuple]:
    """Drained records as ``(key, value)``, an input position as ``("@", offsets)``."""
    out: list[tuple] = []
    for key, value in records:
        if key == INPUT_POSITION_KEY:
            out.append(("@", msgpack.unpackb(value or b"")))
        else:
            out.append((store.spec.key_serde.loads(key),
                        None if value is None else store.spec.value_serde.loads(value)))
    return out


def test_a_key_written_many_times_between_drains_sends_only_its_latest_value(
    store: KeyValueStore,
) -> None:
    for n in range(1, 1001):
        store.put("a", n)
        store.put("b", -n)
    store.delete("c")
    store.put("c", 7)
    store.delete("d")
    assert decoded(store, store.drain_changelog()) == [
        ("a", 1000), ("b", -1000), ("c", 7), ("d", None)]
    assert store.unacknowledged == 4


def test_an_input_position_follows_every_write_it_covers_and_precedes_the_later_ones(
    store: KeyValueStore,
) -> None:
    store.put("a", 1)
    store.put("b", 1)
    store.write_input_position({"in:0": 10})
    store.put("a", 2)  # after the position: not covered by it, so not merged into "a" = 1
    assert decoded(store, store.drain_changelog()) == [
        ("a", 1), ("b", 1), ("@", {"in:0": 10}), ("a", 2)]


def test_a_later_input_position_covers_the_writes_of_the_earlier_one(
    store: KeyValueStore,
) -> None:
    store.put("a", 1)
    store.write_input_position({"in:0": 10})
    store.put("a", 2)
    store.put("b", 1)
    store.write_input_position({"in:0": 20})
    store.put("c", 1)
    assert decoded(store, store.drain_changelog()) == [
        ("a", 2), ("b", 1), ("@", {"in:0": 20}), ("c", 1)]


def test_records_put_back_stay_in_front_of_the_writes_made_since(store: KeyValueStore) -> None:
    store.put("a", 1)
    store.write_input_position({"in:0": 10})
    drained = store.drain_changelog()
    store.put("a", 2)
    store.put("b", 5)
    store.requeue_changelog(drained)
    assert store.unacknowledged == 4
    assert decoded(store, store.drain_changelog()) == [
        ("a", 1), ("@", {"in:0": 10}), ("a", 2), ("b", 5)]


def test_the_queued_bytes_count_every_write_until_the_drain(store: KeyValueStore) -> None:
    assert store.changelog_bytes == 0
    store.put("a", 1)
    one = store.changelog_bytes
    assert one > 0
    store.put("a", 2)
    assert store.changelog_bytes == 2 * one  # counted as written, before coalescing
    store.drain_changelog()
    assert store.changelog_bytes == 0


def test_a_store_without_a_changelog_queues_nothing(tmp_path: Path) -> None:
    store = KeyValueStore(StoreSpec("local", changelogged=False), tmp_path / "local", None,
                          0).open()
    try:
        store.put("a", 1)
        store.write_input_position({"in:0": 1})
        assert store.drain_changelog() == [] and store.changelog_bytes == 0
        assert store.get("a") == 1
    finally:
        store.close()
