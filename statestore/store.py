"""The key-value store: one RocksDB database per (task, store name), every write mirrored to the
store's changelog topic.

Writes go to RocksDB at once and are queued as changelog records; the task drains the queue
into its producer (see :mod:`statestore.changelog`) and, once the broker acknowledged them,
moves the store's changelog position forward. ``commit`` flushes RocksDB and writes that
position to the checkpoint file, which restoration resumes from.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from rocksdict import (
    MemtableFactory,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from statestore.checkpoint import Checkpoint, read_checkpoint, remove_checkpoint, write_checkpoint
from statestore.errors import StateStoreError, StoreLockedError
from statestore.serdes import MsgPackSerde, OrderedKeySerde, Serde, serde_from_name
from statestore.snapshot import SnapshotRef, load_snapshot, plan_bootstrap

log = logging.getLogger(__name__)

ChangelogRecord = tuple[bytes, bytes | None]

#: A reserved key (outside every key encoding's range) where a task records which input
#: offsets its store's state reflects; it travels through the changelog with the data, so a
#: restored store knows where its input must resume. Scans never show it.
INPUT_POSITION_KEY = b"\xff\xffrelay.input-position"
RESERVED_PREFIX = b"\xff\xff"


@dataclass(frozen=True)
class StoreSpec:
    """What a store is: its name, how keys and values are encoded, whether it is changelogged."""

    name: str
    key_serde: Serde = field(default_factory=OrderedKeySerde)
    value_serde: Serde = field(default_factory=MsgPackSerde)
    changelogged: bool = True

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"invalid store name {self.name!r}: use letters, digits, - and _")
        object.__setattr__(self, "key_serde", serde_from_name(self.key_serde))
        object.__setattr__(self, "value_serde", serde_from_name(self.value_serde))


def store_directory(state_dir: Path, application_id: str, task_id: str, store: str) -> Path:
    return Path(state_dir) / application_id / task_id / store


def changelog_topic_name(application_id: str, store: str) -> str:
    return f"{application_id}-{store}-changelog"


class KeyValueStore:
    """A changelogged RocksDB store for one task. Not thread-safe: one task owns it."""

    def __init__(
        self,
        spec: StoreSpec,
        directory: Path,
        changelog_topic: str | None,
        partition: int,
        snapshot: SnapshotRef | None = None,
    ) -> None:
        self.spec = spec
        # A snapshot this store bootstraps from when it has no (or an older) checkpoint.
        self.snapshot = snapshot
        self.directory = Path(directory)
        self.changelog_topic = changelog_topic if spec.changelogged else None
        self.partition = partition
        self._db: Rdict | None = None
        self._lock_fd: int | None = None
        self._pending: list[ChangelogRecord] = []
        # The next changelog offset the state on disk reflects (restored or acknowledged).
        self.position = 0
        #: Opened for restoration only (see ``open``); ``end_bulk_load`` makes it readable.
        self.bulk_loading = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_open(self) -> bool:
        return self._db is not None

    # -- lifecycle -------------------------------------------------------------------------

    def open(self, *, bulk_load: bool = False) -> KeyValueStore:
        """Lock the directory, drop state that no checkpoint vouches for, open RocksDB.

        After ``open`` the store's ``position`` is where restoration must resume. With
        ``bulk_load`` the store is tuned for being written by restoration and not read: call
        ``end_bulk_load`` before it serves reads (a task about to run).
        """
        if self._db is not None:
            return self
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        self._acquire_lock()
        try:
            checkpoint = None
            if self.changelog_topic is not None:
                checkpoint = read_checkpoint(self.directory, self.changelog_topic, self.partition)
                if checkpoint is None and self.directory.exists():
                    shutil.rmtree(self.directory)
            bootstrap = None
            if self.snapshot is not None:
                bootstrap = plan_bootstrap(self, self.snapshot, checkpoint)
                if bootstrap is not None:
                    # The snapshot replaces whatever older state is on disk.
                    shutil.rmtree(self.directory, ignore_errors=True)
                    checkpoint = None
            self.position = checkpoint.offset if checkpoint else 0
            self._db = _open_db(self.directory, bulk_load)
            self.bulk_loading = bulk_load
            if bootstrap is not None:
                load_snapshot(self, bootstrap)
        except BaseException:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._release_lock()
            raise
        return self

    def _acquire_lock(self) -> None:
        lock_path = self.directory.parent / f"{self.directory.name}.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreLockedError(
                f"store directory {self.directory} is held by another live process "
                f"(pid {holder}); stop it, or give this instance its own state_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def end_bulk_load(self) -> None:
        """Make a store opened with ``bulk_load`` fit for reads: flush the bulk memtable and
        reopen RocksDB with the default one. The directory stays locked throughout."""
        if not self.bulk_loading:
            return
        db = self._require_open()
        db.flush()
        db.close()
        self._db = None
        self.bulk_loading = False
        try:
            self._db = _open_db(self.directory, bulk_load=False)
        except BaseException:
            self._release_lock()
            raise

    def close(self) -> None:
        """Flush and close. Queued changelog records not yet sent are the caller's to send."""
        if self._db is None:
            return
        self._db.flush()
        self._db.close()
        self._db = None
        self._release_lock()

    def wipe(self) -> None:
        """Delete the store's data and checkpoint (it must be closed)."""
        if self._db is not None:
            raise StateStoreError(f"close store {self.name} before wiping it")
        remove_checkpoint(self.directory)
        shutil.rmtree(self.directory, ignore_errors=True)
        self.position = 0

    def commit(self) -> None:
        """Flush RocksDB and record the changelog position it reflects.

        Call only after the changelog records written so far were acknowledged, so that the
        checkpoint never claims more than the changelog holds.
        """
        db = self._require_open()
        if self._pending:
            raise StateStoreError(
                f"store {self.name}: {len(self._pending)} changelog records were not sent yet"
            )
        db.flush()
        if self.changelog_topic is not None:
            write_checkpoint(
                self.directory, Checkpoint(self.changelog_topic, self.partition, self.position)
            )

    def _require_open(self) -> Rdict:
        if self._db is None:
            raise StateStoreError(f"store {self.name} at {self.directory} is not open")
        return self._db

    # -- reads and writes ------------------------------------------------------------------

    def get(self, key: Any, default: Any = None) -> Any:
        raw = self._require_open().get(self.spec.key_serde.dumps(key))
        return default if raw is None else self.spec.value_serde.loads(raw)

    def __contains__(self, key: Any) -> bool:
        return self._require_open().get(self.spec.key_serde.dumps(key)) is not None

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            self.delete(key)
            return
        raw_key = self.spec.key_serde.dumps(key)
        raw_value = self.spec.value_serde.dumps(value)
        self._require_open().put(raw_key, raw_value)
        if self.changelog_topic is not None:
            self._pending.append((raw_key, raw_value))

    def delete(self, key: Any) -> None:
        raw_key = self.spec.key_serde.dumps(key)
        self._require_open().delete(raw_key)
        if self.changelog_topic is not None:
            self._pending.append((raw_key, None))

    def write_input_position(self, offsets: dict[str, int]) -> None:
        """Record the next input offset per ``"topic:partition"`` this state reflects."""
        raw = msgpack.packb(offsets)
        self._require_open().put(INPUT_POSITION_KEY, raw)
        if self.changelog_topic is not None:
            self._pending.append((INPUT_POSITION_KEY, raw))

    def read_input_position(self) -> dict[str, int]:
        raw = self._require_open().get(INPUT_POSITION_KEY)
        if raw is None:
            return {}
        try:
            value = msgpack.unpackb(raw, raw=False)
        except Exception:
            log.warning("store %s: unreadable input position; ignoring it", self.name)
            return {}
        return {str(k): int(v) for k, v in value.items()} if isinstance(value, dict) else {}

    def range(
        self, start: Any = None, end: Any = None, *, reverse: bool = False
    ) -> Iterator[tuple[Any, Any]]:
        """Entries with ``start <= key < end`` in key order (either bound may be None)."""
        lower = None if start is None else self.spec.key_serde.dumps(start)
        upper = None if end is None else self.spec.key_serde.dumps(end)
        return self._scan(lower, upper, reverse)

    def prefix(self, prefix: Any) -> Iterator[tuple[Any, Any]]:
        """Entries whose key starts with ``prefix`` (a str, bytes or leading tuple elements)."""
        key_serde = self.spec.key_serde
        if isinstance(key_serde, OrderedKeySerde):
            lower = key_serde.prefix(prefix)
        elif isinstance(prefix, bytes):
            lower = prefix
        else:
            raise StateStoreError(
                f"store {self.name}: prefix scans need the ordered key serde or a bytes prefix"
            )
        return self._scan(lower, _prefix_upper_bound(lower), False)

    def items(self) -> Iterator[tuple[Any, Any]]:
        return self._scan(None, None, False)

    def keys(self) -> Iterator[Any]:
        return (key for key, _ in self.items())

    def __iter__(self) -> Iterator[Any]:
        return self.keys()

    def raw_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Encoded entries as stored, for snapshots and comparisons."""
        db = self._require_open()
        iterator = db.iter()
        iterator.seek_to_first()
        while iterator.valid():
            key = iterator.key()
            if not key.startswith(RESERVED_PREFIX):
                yield key, iterator.value()
            iterator.next()

    def approximate_count(self) -> int:
        return int(self._require_open().property_int_value("rocksdb.estimate-num-keys") or 0)

    def _scan(
        self, lower: bytes | None, upper: bytes | None, reverse: bool
    ) -> Iterator[tuple[Any, Any]]:
        iterator = self._require_open().iter()
        if reverse:
            if upper is None:
                iterator.seek_to_last()
            else:
                iterator.seek_for_prev(upper)
                if iterator.valid() and iterator.key() >= upper:
                    iterator.prev()
        elif lower is None:
            iterator.seek_to_first()
        else:
            iterator.seek(lower)
        loads_key = self.spec.key_serde.loads
        loads_value = self.spec.value_serde.loads
        while iterator.valid():
            key = iterator.key()
            if (upper is not None and key >= upper) or (lower is not None and key < lower):
                return
            if not key.startswith(RESERVED_PREFIX):
                yield loads_key(key), loads_value(iterator.value())
            if reverse:
                iterator.prev()
            else:
                iterator.next()

    # -- changelog side --------------------------------------------------------------------

    def drain_changelog(self) -> list[ChangelogRecord]:
        """Hand over the changelog records queued since the last drain, oldest first."""
        pending, self._pending = self._pending, []
        return pending

    def requeue_changelog(self, records: list[ChangelogRecord]) -> None:
        """Put records drained but never handed to the producer back in front of the queue."""
        if records:
            self._pending[:0] = records

    def acknowledged(self, next_offset: int) -> None:
        """The changelog holds this store's writes up to ``next_offset`` (exclusive)."""
        self.position = max(self.position, next_offset)

    def apply_restore_batch(self, records: list[ChangelogRecord], next_offset: int) -> None:
        """Apply changelog records (already encoded) in one WriteBatch; tombstones delete."""
        db = self._require_open()
        batch = WriteBatch(raw_mode=True)
        put, delete = batch.put, batch.delete
        for key, value in records:
            if value is None:
                delete(key)
            else:
                put(key, value)
        # No write-ahead log: the changelog is the log. A crash before the next checkpoint
        # (written after a flush) replays from the previous one.
        db.write(batch, _NO_WAL)
        self.position = next_offset

    def ingest_sst(self, sst_path: Path, next_offset: int) -> None:
        """Bulk-load a sorted SST file (a snapshot) and move the position to ``next_offset``."""
        self._require_open().ingest_external_file([str(sst_path)])
        self.position = next_offset


def _open_db(directory: Path, bulk_load: bool) -> Rdict:
    options = _db_options(bulk_load)
    # Named for the default column family too: else rocksdict opens an existing database
    # with the options it was last opened with (a bulk-load memtable included).
    return Rdict(str(directory), options, column_families={"default": options})


def _db_options(bulk_load: bool) -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    # Bigger memtables: restoring writes in large batches.
    options.set_write_buffer_size(64 * 1024 * 1024)
    if bulk_load:
        # Restoration only writes. A vector memtable appends each record and sorts once, when
        # it is flushed in RocksDB's own background threads, off the Python thread; the
        # default skiplist pays an ordered insert per record under the GIL (1.3 s of a 1M
        # record restore). Its reads sort on every lookup, hence ``end_bulk_load``.
        options.set_memtable_factory(MemtableFactory.vector())
        options.set_allow_concurrent_memtable_write(False)
    return options


_NO_WAL = WriteOptions()
_NO_WAL.disable_wal = True


def _prefix_upper_bound(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with ``prefix``."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])
