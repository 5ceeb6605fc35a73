"""The timestamped value format: values with the timestamp of the record that set them, plain
values written before (and their changelogs) still read, with timestamp -1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from statestore.errors import StateStoreError
from statestore.serdes import (
    TIMESTAMPED_TAG,
    UNKNOWN_TIMESTAMP,
    SerdeError,
    TimestampedSerde,
    serde_from_name,
)
from statestore.store import INPUT_POSITION_KEY, KeyValueStore, StoreSpec

SERDE = TimestampedSerde()


def test_a_timestamped_value_round_trips_and_reads_plain_where_the_value_alone_is_wanted(
) -> None:
    for value, timestamp in [(3, 10), ({"a": [1, None]}, 1_700_000_000_000), ("x", -1),
                             (None, 0), ([1, 2], 2**63 - 1)]:
        raw = SERDE.dumps_timestamped(value, timestamp)
        assert raw[0] == TIMESTAMPED_TAG
        assert SERDE.loads_timestamped(raw) == [timestamp, value]
        assert SERDE.loads(raw) == value


def test_a_plain_value_written_before_reads_with_an_unknown_timestamp() -> None:
    for value in (5, [7, 8], {"k": "v"}, "s", None, b"\xc1"):
        raw = msgpack.packb(value, use_bin_type=True)
        assert raw[0] != TIMESTAMPED_TAG  # msgpack never starts a value with it
        assert SERDE.loads_timestamped(raw) == [UNKNOWN_TIMESTAMP, value]
        assert SERDE.loads(raw) == value
        assert SERDE.dumps(value) == raw  # written without a timestamp: plain msgpack


def test_a_broken_timestamped_value_is_a_serde_error() -> None:
    for raw in (bytes([TIMESTAMPED_TAG]), bytes([TIMESTAMPED_TAG]) + msgpack.packb([1]),
                bytes([TIMESTAMPED_TAG]) + msgpack.packb(["t", 1]),
                bytes([TIMESTAMPED_TAG]) + b"\xc1"):
        with pytest.raises(SerdeError, match="timestamped value"):
            SERDE.loads(raw)
    with pytest.raises(SerdeError, match="timestamp"):
        SERDE.dumps_timestamped(1, 2**64)
    with pytest.raises(SerdeError, match="msgpack cannot encode"):
        SERDE.dumps_timestamped(object(), 1)


def test_the_serde_has_a_name() -> None:
    assert isinstance(serde_from_name("timestamped"), TimestampedSerde)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[KeyValueStore]:
    opened = KeyValueStore(StoreSpec("s", value_serde=SERDE), tmp_path / "s", "app-s-changelog",
                           0).open()
    yield opened
    opened.close()


def test_a_store_keeps_timestamps_and_its_plain_reads_see_values(store: KeyValueStore) -> None:
    store.put_timestamped("a", 1, 10)
    store.put("b", 2)  # plain: no timestamp
    assert list(store.get_timestamped("a")) == [10, 1]
    assert list(store.get_timestamped("b")) == [UNKNOWN_TIMESTAMP, 2]
    assert store.get_timestamped("c") is None
    assert store.get("a") == 1 and list(store.items()) == [("a", 1), ("b", 2)]
    records = store.drain_changelog()
    store.acknowledged(len(records), records=len(records))
    store.commit()
    assert store.get_committed("a") == 1 and list(store.range_committed()) == [("a", 1), ("b", 2)]
    store.put_timestamped("a", None, 11)
    assert store.get_timestamped("a") is None


def test_a_value_read_back_before_the_commit_is_the_one_last_put(store: KeyValueStore) -> None:
    store.put_timestamped("a", 1, 10)
    assert list(store.get_timestamped("a")) == [10, 1]  # answered from what was put
    store.put("a", 2)  # written another way since: read from the buffer
    assert list(store.get_timestamped("a")) == [UNKNOWN_TIMESTAMP, 2]
    store.put_timestamped("a", [3], 11)  # a mutable value is decoded on every read
    assert list(store.get_timestamped("a")) == [11, [3]]
    store.put_timestamped("a", 4, 12)
    store.delete("a")
    assert store.get_timestamped("a") is None
    store.put_timestamped("b", 5, 13)
    store.abort()
    assert store.get_timestamped("b") is None


def restored(tmp_path: Path, records: list[tuple[bytes, bytes | None]]) -> KeyValueStore:
    copy = KeyValueStore(StoreSpec("s", value_serde=SERDE), tmp_path / "copy", "app-s-changelog",
                         0).open()
    copy.apply_restore_batch(records, len(records))
    return copy


def test_a_store_restored_from_its_changelog_has_the_same_timestamps(
        store: KeyValueStore, tmp_path: Path) -> None:
    store.put_timestamped("a", 1, 10)
    store.put_timestamped("b", {"n": 2}, 3)
    copy = restored(tmp_path, store.drain_changelog())
    try:
        assert list(copy.get_timestamped("a")) == [10, 1]
        assert list(copy.get_timestamped("b")) == [3, {"n": 2}]
    finally:
        copy.close()


def test_a_store_restored_from_a_changelog_written_before_timestamps_reads_it(
        tmp_path: Path) -> None:
    keys = StoreSpec("s").key_serde
    old = [(keys.dumps("a"), msgpack.packb(4)), (keys.dumps("b"), msgpack.packb([1, 2]))]
    copy = restored(tmp_path, old)
    try:
        assert list(copy.get_timestamped("a")) == [UNKNOWN_TIMESTAMP, 4]
        assert copy.get("b") == [1, 2]
        copy.put_timestamped("a", 5, 7)  # then written in the new format
        assert list(copy.get_timestamped("a")) == [7, 5]
    finally:
        copy.close()


def test_a_plain_store_refuses_timestamped_reads_and_writes_with_a_clear_error(
        tmp_path: Path) -> None:
    plain = KeyValueStore(StoreSpec("p"), tmp_path / "p", None, 0).open()
    try:
        plain.put("a", 1)
        with pytest.raises(StateStoreError, match="carry no timestamps"):
            plain.get_timestamped("a")
        with pytest.raises(StateStoreError, match="carry no timestamps"):
            plain.put_timestamped("a", 1, 2)
    finally:
        plain.close()


class CountingSerde(TimestampedSerde):
    """Counts the timestamped values it encodes."""

    def __init__(self) -> None:
        super().__init__()
        self.encoded = 0

    def dumps_timestamped(self, value: object, timestamp: int) -> bytes:
        self.encoded += 1
        return super().dumps_timestamped(value, timestamp)


def counting_store(tmp_path: Path) -> tuple[KeyValueStore, CountingSerde]:
    serde = CountingSerde()
    return KeyValueStore(StoreSpec("c", value_serde=serde), tmp_path / "c", "app-c-changelog",
                         0).open(), serde


def test_a_count_rewritten_before_the_commit_is_encoded_once_and_ships_its_last_value(
        tmp_path: Path) -> None:
    store, serde = counting_store(tmp_path)
    try:
        for n in range(1, 101):
            store.put_timestamped("a", n, 1_000 + n)
            assert list(store.get_timestamped("a")) == [1_000 + n, n]
        store.put_timestamped("b", 7, 5)
        assert serde.encoded == 0
        store.write_input_position({"in:0": 101})
        records = store.drain_changelog()
        assert serde.encoded == 2
        keys = store.spec.key_serde
        assert records[:2] == [(keys.dumps("a"), SERDE.dumps_timestamped(100, 1_100)),
                               (keys.dumps("b"), SERDE.dumps_timestamped(7, 5))]
        assert records[2][0] == INPUT_POSITION_KEY  # the position covers both, so comes after
        store.acknowledged(len(records), records=len(records))
        store.commit()
        assert store.get_committed("a") == 100
    finally:
        store.close()
    reopened, _ = counting_store(tmp_path)
    try:
        assert list(reopened.get_timestamped("a")) == [1_100, 100]
    finally:
        reopened.close()


def test_the_changelog_buffer_counts_the_bytes_a_count_takes_encoded(tmp_path: Path) -> None:
    store, _ = counting_store(tmp_path)
    values = [0, 127, 128, -32, -33, -128, -129, 255, 256, 65535, 65536, -32768, -32769,
              2**32 - 1, 2**32, -(2**31), -(2**31) - 1, 2**64 - 1, -(2**63)]
    try:
        for i, value in enumerate(values):
            store.put_timestamped(f"k{i}", value, 3)
        keys = store.spec.key_serde
        assert store.changelog_bytes == sum(
            len(keys.dumps(f"k{i}")) + len(SERDE.dumps_timestamped(value, 3))
            for i, value in enumerate(values))
        assert [SERDE.loads_timestamped(raw) for _, raw in store.drain_changelog()] == [
            [3, value] for value in values]
    finally:
        store.close()


def test_a_count_msgpack_cannot_encode_is_refused_when_put(store: KeyValueStore) -> None:
    with pytest.raises(SerdeError, match="msgpack cannot encode"):
        store.put_timestamped("a", 2**64, 1)
    with pytest.raises(SerdeError, match="timestamp"):
        store.put_timestamped("a", 1, 2**63)
    assert store.get_timestamped("a") is None and store.drain_changelog() == []


def test_a_write_of_another_kind_after_a_count_wins_everywhere(store: KeyValueStore) -> None:
    store.put_timestamped("a", 1, 10)
    store.put("a", "plain")
    store.put_timestamped("b", 2, 10)
    store.delete("b")
    store.put_timestamped("c", 3, 10)
    store.put_timestamped("c", [4], 11)
    store.put_timestamped("d", 5, 12)  # only counts
    assert list(store.items()) == [("a", "plain"), ("c", [4]), ("d", 5)]
    assert store.get("d") == 5 and "b" not in store
    assert store.uncommitted == 4
    keys = store.spec.key_serde
    assert dict(store.drain_changelog()) == {
        keys.dumps("a"): SERDE.dumps("plain"), keys.dumps("b"): None,
        keys.dumps("c"): SERDE.dumps_timestamped([4], 11),
        keys.dumps("d"): SERDE.dumps_timestamped(5, 12)}
    store.put_timestamped("e", 6, 13)
    store.abort()
    assert store.get_timestamped("e") is None and store.unacknowledged == 0


class _CountingReads:
    """Wraps a store's database, counting its point reads."""

    def __init__(self, db: object) -> None:
        self._db = db
        self.reads = 0

    def get(self, key: bytes) -> object:
        self.reads += 1
        return self._db.get(key)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._db, name)


def committed(store: KeyValueStore) -> None:
    records = store.drain_changelog()
    store.acknowledged(store.position + len(records), records=len(records))
    store.commit()


def test_a_committed_count_is_read_again_without_the_database(tmp_path: Path) -> None:
    store, _ = counting_store(tmp_path)
    try:
        store.put_timestamped("a", 1, 10)
        store.put_timestamped("b", "text", 11)  # not a number: read back from the database
        committed(store)
        reads = _CountingReads(store._db)
        store._db = reads  # type: ignore[assignment]
        assert list(store.get_timestamped("a")) == [10, 1] and reads.reads == 0
        assert list(store.get_timestamped("b")) == [11, "text"] and reads.reads == 1
        store.put_timestamped("a", 2, 12)
        store.abort()  # the database still holds 1
        assert list(store.get_timestamped("a")) == [10, 1] and reads.reads == 1
    finally:
        store._db = reads._db  # type: ignore[assignment]
        store.close()


def test_a_committed_count_written_otherwise_since_is_not_read_from_memory(
        tmp_path: Path) -> None:
    store, _ = counting_store(tmp_path)
    keys = store.spec.key_serde
    try:
        for key in "abcd":
            store.put_timestamped(key, 1, 10)
        committed(store)
        store.put("a", 7)  # plain, committed
        store.delete("b")
        store.put_timestamped("c", [3], 11)
        committed(store)
        assert list(store.get_timestamped("a")) == [UNKNOWN_TIMESTAMP, 7]
        assert store.get_timestamped("b") is None
        assert list(store.get_timestamped("c")) == [11, [3]]
        # Restoration writes the database directly (a standby, a learner): nothing held
        # in memory outlives it.
        store.apply_restore_batch([(keys.dumps("d"), SERDE.dumps_timestamped(9, 20))],
                                  store.position + 1)
        assert list(store.get_timestamped("d")) == [20, 9]
    finally:
        store.close()
