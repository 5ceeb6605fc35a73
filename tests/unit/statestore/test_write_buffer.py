"""The write buffer: a store's writes since its last commit are read back before they reach
RocksDB, scans merge them with the database, and only a commit after every changelog record
was acknowledged applies them. No broker: acknowledgements are given by hand."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from statestore.buffer import WriteBuffer, merge
from statestore.checkpoint import read_checkpoint
from statestore.errors import StateStoreError
from statestore.store import KeyValueStore, StoreSpec

TOPIC = "app-counts-changelog"


def open_store(directory: Path) -> KeyValueStore:
    return KeyValueStore(StoreSpec("counts"), directory, TOPIC, 0).open()


def acknowledge_all(store: KeyValueStore, next_offset: int) -> int:
    """What the changelog writer does once the broker acknowledged every queued record."""
    sent = store.drain_changelog()
    store.acknowledged(next_offset + len(sent), len(sent))
    return next_offset + len(sent)


def test_reads_see_writes_not_committed_yet(tmp_path: Path) -> None:
    store = open_store(tmp_path / "counts")
    store.put("a", 1)
    store.put("b", 2)
    store.put("a", 3)
    assert store.get("a") == 3 and "b" in store and store.uncommitted == 2
    offset = acknowledge_all(store, 0)
    store.commit()
    assert store.uncommitted == 0 and store.position == offset
    store.delete("b")
    assert store.get("b") is None and "b" not in store
    assert store.get("b", "gone") == "gone"
    store.put("c", None)  # a put of None deletes
    assert list(store.items()) == [("a", 3)]
    store.close()


def test_scans_merge_the_buffer_with_the_database_in_both_directions(tmp_path: Path) -> None:
    rng = random.Random(7)
    store = open_store(tmp_path / "counts")
    model: dict[tuple[str, int], int] = {}
    offset = 0
    for round_ in range(4):
        for _ in range(300):
            key = (rng.choice("abcde"), rng.randrange(40))
            if rng.random() < 0.25:
                store.delete(key)
                model.pop(key, None)
            else:
                store.put(key, round_)
                model[key] = round_
        if round_ < 3:  # the last round stays in the buffer, over three committed ones
            offset = acknowledge_all(store, offset)
            store.commit()
    assert store.uncommitted > 0
    ordered = sorted(model.items())
    assert list(store.items()) == ordered
    assert list(store.range(reverse=True)) == ordered[::-1]
    low, high = ("b", 10), ("d", 5)
    assert list(store.range(low, high)) == [(k, v) for k, v in ordered if low <= k < high]
    assert list(store.range(low, high, reverse=True)) == [
        (k, v) for k, v in reversed(ordered) if low <= k < high
    ]
    assert list(store.prefix(("c",))) == [(k, v) for k, v in ordered if k[0] == "c"]
    # The reserved input position never shows in a scan, buffered or committed.
    store.write_input_position({"in:0": 10})
    assert list(store.items()) == ordered
    assert store.read_input_position() == {"in:0": 10}
    store.close()


def test_abort_drops_the_buffer_and_keeps_the_last_commit(tmp_path: Path) -> None:
    store = open_store(tmp_path / "counts")
    store.put("a", 1)
    offset = acknowledge_all(store, 0)
    store.commit()
    store.put("a", 2)
    store.delete("a")
    store.put("b", 1)
    store.write_input_position({"in:0": 5})
    store.abort()
    assert store.get("a") == 1 and store.get("b") is None
    assert store.read_input_position() == {}
    assert store.drain_changelog() == []
    assert store.position == offset
    store.close()


def test_acknowledgements_of_aborted_records_move_no_checkpoint(tmp_path: Path) -> None:
    """Records sent before an abort may still be acknowledged: the database does not have
    their writes, so the checkpoint must not claim it does (a reader of the changelog, a
    standby say, applies them from there)."""
    store = open_store(tmp_path / "counts")
    store.put("a", 1)
    offset = acknowledge_all(store, 0)
    store.commit()
    store.put("a", 2)
    sent = store.drain_changelog()
    store.abort()
    store.acknowledged(offset + len(sent), len(sent))  # the late acknowledgement
    store.commit()
    assert store.position == offset and store.get("a") == 1
    assert read_checkpoint(store.directory, TOPIC, 0).offset == offset  # type: ignore[union-attr]
    store.close()


def test_a_commit_waits_for_every_changelog_record_to_be_acknowledged(tmp_path: Path) -> None:
    store = open_store(tmp_path / "counts")
    store.put("a", 1)
    with pytest.raises(StateStoreError, match="1 changelog records were not sent yet"):
        store.commit()
    sent = store.drain_changelog()
    with pytest.raises(StateStoreError, match="1 not acknowledged"):
        store.commit()
    store.acknowledged(1, len(sent))
    store.commit()
    assert read_checkpoint(store.directory, TOPIC, 0).offset == 1  # type: ignore[union-attr]
    store.close()


def test_closing_with_unacknowledged_records_says_so_and_keeps_the_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "counts"
    store = open_store(directory)
    store.put("a", 1)
    acknowledge_all(store, 0)
    store.commit()
    store.put("a", 2)
    store.put("b", 3)
    store.drain_changelog()
    store.put("c", 4)  # not even sent
    with caplog.at_level(logging.WARNING, logger="statestore"):
        store.close()
    assert "3 changelog records not sent or not acknowledged" in caplog.text
    assert "counts[0]" in caplog.text
    assert read_checkpoint(directory, TOPIC, 0).offset == 1  # type: ignore[union-attr]
    reopened = open_store(directory)
    assert dict(reopened.items()) == {"a": 1}
    reopened.close()


def test_closing_commits_what_the_changelog_holds(tmp_path: Path) -> None:
    directory = tmp_path / "counts"
    store = open_store(directory)
    store.put("a", 1)
    acknowledge_all(store, 0)
    store.close()
    reopened = open_store(directory)
    assert dict(reopened.items()) == {"a": 1} and reopened.position == 1
    reopened.close()


def test_restoring_over_uncommitted_writes_is_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path / "counts")
    store.put("a", 1)
    with pytest.raises(StateStoreError, match="uncommitted writes"):
        store.apply_restore_batch([], 0)
    store.abort()
    store.close()


def test_merge_puts_buffered_values_over_the_database_and_hides_deletes() -> None:
    database = [(b"a", b"1"), (b"c", b"3"), (b"e", b"5")]
    buffer = WriteBuffer()
    for key, value in [(b"b", b"2"), (b"c", None), (b"e", b"50"), (b"f", b"6")]:
        buffer.put(key, value)
    assert list(merge(iter(database), buffer.scan(None, None))) == [
        (b"a", b"1"), (b"b", b"2"), (b"e", b"50"), (b"f", b"6")]
    assert list(merge(iter(database[::-1]), buffer.scan(None, None, reverse=True), True)) == [
        (b"f", b"6"), (b"e", b"50"), (b"b", b"2"), (b"a", b"1")]
    assert buffer.scan(b"b", b"e") == [(b"b", b"2"), (b"c", None)]
