"""The key-value store: one RocksDB database per (task, store name), every write mirrored to the
store's changelog topic.

A store is passive: it opens, reads, writes, commits and closes; what state it should start
from (a checkpoint, a snapshot, a full restore) is decided by :mod:`statestore.recovery`.

Writes go to a write buffer (:mod:`statestore.buffer`) that reads see, and are queued as
changelog records, the latest per key: a key written many times between two drains sends one
record, as Kafka Streams' record cache and Quix's transactions do. The task drains the queue
into its producer (see :mod:`streams.runtime.record_collector`), which reports each acknowledgement
back. ``commit``, called once
every queued record was acknowledged, applies the buffer to RocksDB in one WriteBatch, flushes
and writes the changelog position the database now reflects to the checkpoint file. So the
database never holds a write its changelog might not have: after a crash the store is at its
last commit, and the changelog (read from the checkpoint) brings it forward.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
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

from statestore.buffer import WriteBuffer, merge
from statestore.checkpoint import (
    Checkpoint,
    checkpoint_path,
    read_checkpoint,
    remove_checkpoint,
    write_checkpoint,
)
from statestore.errors import (
    StateStoreError,
    StoreCorruptError,
    StoreIOError,
    StoreLockedError,
    StoreReadError,
    StoreWriteError,
)
from statestore.record_size import MAX_RECORD_BYTES, check_record_size
from statestore.serdes import (
    MsgPackSerde,
    OrderedKeySerde,
    Serde,
    TimestampedSerde,
    serde_from_name,
)

log = logging.getLogger(__name__)

ChangelogRecord = tuple[bytes, bytes | None]

#: A reserved key (outside every key encoding's range) where a task records which input
#: offsets its store's state reflects; it travels through the changelog with the data, so a
#: restored store knows where its input must resume. Scans never show it.
INPUT_POSITION_KEY = b"\xff\xffrelay.input-position"
RESERVED_PREFIX = b"\xff\xff"
#: Key types whose encoding cannot change while the object lives: a key object ``get`` just
#: encoded is not encoded again by the ``put`` after it.
_IMMUTABLE_KEY_TYPES = (str, bytes, int)
#: Values put_timestamped may hand back as they were put (no caller can change them).
_IMMUTABLE_VALUE_TYPES = (int, float, str, bytes, bool)
#: Values a store keeps decoded past their commit (small and of bounded size).
_CACHED_VALUE_TYPES = (int, float, bool)
#: The most committed values a store keeps decoded; past it, it forgets them all.
MAX_CACHED_VALUES = 50_000
#: What a lookup of a key the write buffer does not hold returns (None is a buffered delete).
_ABSENT = object()
#: Bounds of what a deferred timestamped write may hold: msgpack encodes every int in them,
#: and a timestamp is an int64.
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
#: The bytes of a timestamped value before its value: the tag, the pair's header and the
#: timestamp as an int64.
_DEFERRED_HEADER_BYTES = 11


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
    """A changelogged RocksDB store for one task. Not thread-safe: one task owns it.

    ``tracks_input``: a task's store, whose changelog records count only once the input
    position written after them covers them (see ``write_input_position``): restoration
    applies its changelog up to the last input position it read and holds what follows.
    """

    def __init__(
        self,
        spec: StoreSpec,
        directory: Path,
        changelog_topic: str | None,
        partition: int,
        *,
        tracks_input: bool = False,
    ) -> None:
        self.spec = spec
        self.directory = Path(directory)
        self.changelog_topic = changelog_topic if spec.changelogged else None
        self.partition = partition
        self.tracks_input = tracks_input
        self._db: Rdict | None = None
        self._lock_fd: int | None = None
        self._buffer = WriteBuffer()
        # Per key, the encoded value put_timestamped last buffered and its [timestamp, value]
        # when the value is immutable: get_timestamped answers from it, undecoded, while the
        # buffer still holds that very value (a count read again before the commit).
        self._decoded: dict[bytes, tuple[bytes, tuple[int, Any]]] = {}
        # Timestamped writes of int values (counts), per key, not encoded yet: a key counted
        # many times between two commits is encoded once, when the buffer or the changelog
        # is next read as bytes (``_encode_deferred``). An int and an int64 timestamp always
        # encode, within a bounded size, so deferring them moves no error away from the
        # record that made it.
        self._deferred: dict[bytes, tuple[int, int]] = {}
        # Committed timestamped numbers, decoded, per key: a key aggregated in every commit
        # interval (a count over a busy input, every task processing every interval) is not
        # read back from RocksDB and decoded each time. Exactly what the database holds:
        # every other write of a key drops its entry, restoration drops them all.
        self._cached: dict[bytes, tuple[int, Any]] = {}
        self._defers = isinstance(spec.value_serde, TimestampedSerde)
        # Changelog records not drained yet, the latest per key. ``_covered``: written before
        # the last input position (which ends it); ``_pending``: written after it. Coalescing
        # never moves a write across an input position: a restored state then reflects
        # exactly the input that position names.
        self._covered: dict[bytes, bytes | None] = {}
        self._pending: dict[bytes, bytes | None] = {}
        #: Bytes of the changelog records queued since the last drain (before coalescing).
        self.changelog_bytes = 0
        # Changelog records handed to the producer and not acknowledged yet.
        self._unacked = 0
        # Records handed over before an abort: their acknowledgements move nothing (the
        # database does not have their writes; a reader of the changelog applies them).
        self._stale_acks = 0
        # The changelog offset after the last acknowledged record of this store.
        self._acked_to = 0
        # Keys whose last changelog records no input position covers: a writer stopped
        # between writing them and writing the position (see ``end_bulk_load``).
        self._uncovered: set[bytes] = set()
        #: The next changelog offset the database reflects (restored or committed).
        self.position = 0
        #: Whether ``open`` found a checkpoint vouching for the state on disk.
        self.has_checkpoint = False
        #: Opened for restoration only (see ``open``); ``end_bulk_load`` makes it readable.
        self.bulk_loading = False
        # The last key ``get`` encoded, and its encoding.
        self._last_key: Any = None
        self._last_raw_key = b""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_open(self) -> bool:
        return self._db is not None

    def __repr__(self) -> str:
        return f"store {self.name}[{self.partition}] at {self.directory}"

    # -- lifecycle -------------------------------------------------------------------------

    def open(self, *, bulk_load: bool = False) -> KeyValueStore:
        """Lock the directory, drop state that no checkpoint vouches for, open RocksDB.

        After ``open`` the store's ``position`` is where restoration must resume. A checkpoint
        whose database is missing means a full restore (with a warning); a database RocksDB
        cannot open as it is raises :class:`StoreCorruptError` (the recovery layer wipes it);
        a failing disk raises :class:`StoreIOError`. With ``bulk_load`` the store is tuned for
        being written by restoration and not read: call ``end_bulk_load`` before it serves
        reads (a task about to run).
        """
        if self._db is not None:
            return self
        try:
            self.directory.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreIOError(f"cannot create the directory of {self!r}: {exc}") from exc
        self._acquire_lock()
        try:
            checkpoint = None
            if self.changelog_topic is not None:
                checkpoint = read_checkpoint(self.directory, self.changelog_topic, self.partition)
                if checkpoint is not None and not (self.directory / "CURRENT").is_file():
                    log.warning(
                        "%r: checkpoint %s has no database beside it (deleted or never "
                        "written): restoring the store in full", self,
                        checkpoint_path(self.directory),
                    )
                    remove_checkpoint(self.directory)
                    checkpoint = None
                if checkpoint is None and self.directory.exists():
                    shutil.rmtree(self.directory)
            self.position = checkpoint.offset if checkpoint else 0
            self._acked_to = self.position
            self.has_checkpoint = checkpoint is not None
            self._db = _open_db(self.directory, bulk_load, self)
            self.bulk_loading = bulk_load
        except BaseException:
            self._release_lock()
            raise
        return self

    def _acquire_lock(self) -> None:
        lock_path = self.directory.parent / f"{self.directory.name}.lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreIOError(f"cannot lock {self!r} ({lock_path}): {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreLockedError(
                f"store directory {self.directory} is held by another live process "
                f"(pid {holder}); stop it, or give this instance its own state_dir"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise StoreIOError(f"cannot lock {self!r} ({lock_path}): {exc}") from exc
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def end_bulk_load(self) -> None:
        """Make the store a running task's: a store opened with ``bulk_load`` is flushed and
        reopened with the default memtable (the directory stays locked throughout), and keys
        whose last changelog records no input position covers are written again with the
        values the store holds, so that no later reader applies those records as if their
        input had been processed."""
        self._forget_cached()
        if self.bulk_loading:
            db = self._require_open()
            try:
                db.flush()
            except Exception as exc:
                raise StoreWriteError(f"{self!r}: flush failed: {exc}") from exc
            db.close()
            self._db = None
            self.bulk_loading = False
            try:
                self._db = _open_db(self.directory, False, self)
            except BaseException:
                self._release_lock()
                raise
        if self._uncovered:
            self._supersede_uncovered()

    def mark_uncovered(self, keys: set[bytes]) -> None:
        """Restoration read changelog records for ``keys`` after the last input position and
        did not apply them: the writer stopped before it covered them."""
        self._uncovered |= keys

    def _supersede_uncovered(self) -> None:
        self._forget_cached()
        db = self._require_open()
        keys, self._uncovered = sorted(self._uncovered), set()
        for key in keys:
            value = self._db_get(db, key)
            self._buffer.put(key, value)
            self._queue(key, value)
        position = self._db_get(db, INPUT_POSITION_KEY)
        if position is not None:
            self._queue_position(position)
        log.warning(
            "%r: its changelog ends with %d writes no input position covers (a writer "
            "stopped mid-commit); they were not applied, and the restored values are written "
            "over them", self, len(keys),
        )

    def close(self) -> None:
        """Commit what the changelog holds, then close.

        A store closed with changelog records not sent or not acknowledged says so and drops
        its uncommitted writes: its checkpoint stays at its last commit, never past what the
        changelog holds. The input they came from was not committed either, and is processed
        again.
        """
        if self._db is None:
            return
        try:
            unconfirmed = self.unacknowledged
            if unconfirmed:
                log.warning(
                    "%r closes with %d changelog records not sent or not acknowledged: its %d "
                    "uncommitted writes are dropped and its checkpoint stays at offset %d",
                    self, unconfirmed, len(self._buffer), self.position,
                )
                self.abort()
            self.commit()
        except Exception:
            log.exception("%r: commit on close failed; it restores from its last checkpoint "
                          "when next opened", self)
        finally:
            self.abort()
            self._uncovered.clear()
            self._forget_cached()
            self._db.close()
            self._db = None
            self._release_lock()

    def abort(self, reported: bool = False) -> None:
        """Drop the writes since the last commit and the changelog records not acknowledged
        yet; the database and its position stay at the last commit. ``reported``: no
        acknowledgement of a changelog record handed so far is still to come (each had its
        delivery report, or its writer's transaction was aborted), so none is discounted."""
        self._buffer.clear()
        self._decoded.clear()
        self._deferred.clear()
        self._covered.clear()
        self._pending.clear()
        self.changelog_bytes = 0
        self._stale_acks = 0 if reported else self._stale_acks + self._unacked
        self._unacked = 0
        self._acked_to = self.position

    @property
    def uncommitted(self) -> int:
        """Writes buffered since the last commit."""
        self._encode_deferred()
        return len(self._buffer)

    def wipe(self) -> None:
        """Delete the store's data and checkpoint (it must be closed)."""
        if self._db is not None:
            raise StateStoreError(f"close store {self.name} before wiping it")
        remove_checkpoint(self.directory)
        shutil.rmtree(self.directory, ignore_errors=True)
        self.position = 0
        self._acked_to = 0
        self.has_checkpoint = False

    def clear(self) -> None:
        """Delete everything the open store holds (its data and its input position) and its
        checkpoint: its changelog is then read again from the start."""
        db = self._require_open()
        self.abort()
        self._uncovered.clear()
        self._forget_cached()
        try:
            batch = WriteBatch(raw_mode=True)
            iterator = db.iter()
            iterator.seek_to_first()
            while iterator.valid():
                batch.delete(iterator.key())
                iterator.next()
            iterator.status()
            db.write(batch, _NO_WAL)
        except Exception as exc:
            raise StoreWriteError(f"{self!r}: clearing failed: {exc}") from exc
        remove_checkpoint(self.directory)
        self.position = 0
        self._acked_to = 0
        self.has_checkpoint = False

    def commit(self) -> None:
        """Apply the buffered writes to RocksDB, flush, and record the changelog position the
        database reflects in the checkpoint file.

        Refused while changelog records are unsent or unacknowledged: the checkpoint never
        claims more than the changelog holds. A failing disk raises
        :class:`StoreWriteError`.
        """
        db = self._require_open()
        self._encode_deferred()
        if self._covered or self._pending or self._unacked:
            raise StateStoreError(
                f"{self!r}: {len(self._covered) + len(self._pending)} changelog records were "
                f"not sent yet and "
                f"{self._unacked} not acknowledged; commit after the changelog has them"
            )
        try:
            if self._buffer:
                batch = WriteBatch(raw_mode=True)
                for key, value in self._buffer.items():
                    if value is None:
                        batch.delete(key)
                    else:
                        batch.put(key, value)
                # No write-ahead log: the changelog is the log, and the flush below makes the
                # batch durable before the checkpoint says so.
                db.write(batch, _NO_WAL)
                self._cache_committed()
                self._buffer.clear()
                self._decoded.clear()
            db.flush()
            self.position = max(self.position, self._acked_to)
            if self.changelog_topic is not None:
                write_checkpoint(
                    self.directory,
                    Checkpoint(self.changelog_topic, self.partition, self.position),
                )
        except Exception as exc:
            raise StoreWriteError(f"{self!r}: commit failed: {exc}") from exc

    def _require_open(self) -> Rdict:
        if self._db is None:
            raise StateStoreError(f"store {self.name} at {self.directory} is not open")
        return self._db

    def _db_get(self, db: Rdict, key: bytes) -> bytes | None:
        try:
            return db.get(key)
        except Exception as exc:
            raise StoreReadError(f"{self!r}: read failed: {exc}") from exc

    def _raw_get(self, key: bytes) -> bytes | None:
        db = self._require_open()
        if self._deferred:
            self._encode_deferred()
        buffered = self._buffer.entries.get(key, _ABSENT)
        if buffered is not _ABSENT:
            return buffered  # type: ignore[return-value]
        return self._db_get(db, key)

    def _queue(self, key: bytes, value: bytes | None) -> None:
        if self.changelog_topic is not None:
            self._pending[key] = value
            self.changelog_bytes += len(key) + (0 if value is None else len(value))

    def _queue_position(self, raw: bytes) -> None:
        """Queue an input position: it covers every write queued before it."""
        if self.changelog_topic is None:
            return
        self._encode_deferred()
        covered = self._covered
        covered.pop(INPUT_POSITION_KEY, None)
        if self._pending:
            covered.update(self._pending)
            self._pending = {}
        covered[INPUT_POSITION_KEY] = raw
        self.changelog_bytes += len(INPUT_POSITION_KEY) + len(raw)

    # -- reads and writes ------------------------------------------------------------------

    def get(self, key: Any, default: Any = None) -> Any:
        raw_key = self.spec.key_serde.dumps(key)
        # Kept for a put of the same key object right after (read-modify-write).
        self._last_key, self._last_raw_key = key, raw_key
        raw = self._raw_get(raw_key)
        return default if raw is None else self.spec.value_serde.loads(raw)

    def _encoded_key(self, key: Any) -> bytes:
        if key is self._last_key and type(key) in _IMMUTABLE_KEY_TYPES:
            return self._last_raw_key
        return self.spec.key_serde.dumps(key)

    def __contains__(self, key: Any) -> bool:
        return self._raw_get(self.spec.key_serde.dumps(key)) is not None

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            self.delete(key)
            return
        self._put_raw(self._encoded_key(key), self.spec.value_serde.dumps(value))

    def _put_raw(self, raw_key: bytes, raw_value: bytes) -> None:
        self._require_open()
        if self._deferred:
            self._deferred.pop(raw_key, None)
        if self._cached:
            self._cached.pop(raw_key, None)
        if self.changelog_topic is not None:
            size = len(raw_key) + len(raw_value)
            if size > MAX_RECORD_BYTES:
                # Refused here, while the record that made it can still be a bad record,
                # rather than by the producer when the changelog is shipped.
                check_record_size(self.changelog_topic, raw_key, raw_value)
            self._pending[raw_key] = raw_value
            self.changelog_bytes += size
        self._buffer.entries[raw_key] = raw_value

    def get_timestamped(self, key: Any) -> Sequence[Any] | None:
        """The ``(timestamp, value)`` pair of a store whose values carry timestamps (its value
        serde is a :class:`~statestore.serdes.TimestampedSerde`), or None; a value written
        without one has :data:`~statestore.serdes.UNKNOWN_TIMESTAMP`."""
        raw_key = self.spec.key_serde.dumps(key)
        self._last_key, self._last_raw_key = key, raw_key
        deferred = self._deferred.get(raw_key)
        if deferred is not None:
            return deferred
        # _raw_get and _db_get inlined: an aggregation's per-record read.
        raw = self._buffer.entries.get(raw_key, _ABSENT)
        if raw is not _ABSENT:
            decoded = self._decoded.get(raw_key)
            if decoded is not None and decoded[0] is raw:
                return decoded[1]
        else:
            cached = self._cached.get(raw_key)
            if cached is not None:
                return cached
            db = self._db
            if db is None:
                db = self._require_open()
            try:
                raw = db.get(raw_key)
            except Exception as exc:
                raise StoreReadError(f"{self!r}: read failed: {exc}") from exc
        return None if raw is None else self._loads_timestamped(raw)  # type: ignore[arg-type]

    def put_timestamped(self, key: Any, value: Any, timestamp: int) -> None:
        """Write ``value`` with ``timestamp`` (None deletes); the changelog carries both, so
        a restored store has the same timestamps."""
        if value is None:
            self.delete(key)
            return
        # _encoded_key and _put_raw inlined: an aggregation's per-record write.
        if key is self._last_key and type(key) in _IMMUTABLE_KEY_TYPES:
            raw_key = self._last_raw_key
        else:
            raw_key = self.spec.key_serde.dumps(key)
        if (type(value) is int and type(timestamp) is int and self._defers
                and _INT64_MIN <= value <= _UINT64_MAX
                and _INT64_MIN <= timestamp <= _INT64_MAX):
            if self._db is None:
                self._require_open()
            if self.changelog_topic is None:
                self._deferred[raw_key] = (timestamp, value)
                return
            # The encoded size exactly (the tag, the pair's header, the timestamp, then the
            # int as msgpack packs it): the changelog buffer's bound counts real bytes.
            size = len(raw_key) + _DEFERRED_HEADER_BYTES + (
                1 if -32 <= value < 128 else 2 if -128 <= value < 256
                else 3 if -32768 <= value < 65536 else 5 if -(2**31) <= value < 2**32 else 9)
            if size <= MAX_RECORD_BYTES:
                self._deferred[raw_key] = (timestamp, value)
                self.changelog_bytes += size
                return
        if self._deferred:
            self._deferred.pop(raw_key, None)
        if self._cached:
            self._cached.pop(raw_key, None)
        raw_value = self._dumps_timestamped(value, timestamp)
        if type(value) in _IMMUTABLE_VALUE_TYPES:
            self._decoded[raw_key] = (raw_value, (timestamp, value))
        if self._db is None:
            self._require_open()
        if self.changelog_topic is not None:
            size = len(raw_key) + len(raw_value)
            if size > MAX_RECORD_BYTES:
                check_record_size(self.changelog_topic, raw_key, raw_value)
            self._pending[raw_key] = raw_value
            self.changelog_bytes += size
        self._buffer.entries[raw_key] = raw_value

    def _cache_committed(self) -> None:
        """Keep the numbers just committed decoded (those the buffer holds as they were put)."""
        cached = self._cached
        entries = self._buffer.entries
        for raw_key, (raw, pair) in self._decoded.items():
            if entries.get(raw_key) is raw and type(pair[1]) in _CACHED_VALUE_TYPES:
                cached[raw_key] = pair
        if len(cached) > MAX_CACHED_VALUES:
            cached.clear()

    def _forget_cached(self) -> None:
        """The database changed otherwise (restoration, a clear): no decoded value holds."""
        if self._cached:
            self._cached.clear()

    def _encode_deferred(self) -> None:
        """Encode the deferred writes into the buffer and the changelog queue: every reader
        of either as bytes, and every write that is not deferred, comes after this."""
        deferred = self._deferred
        if not deferred:
            return
        dumps = self._dumps_timestamped
        entries = self._buffer.entries
        pending = self._pending if self.changelog_topic is not None else None
        decoded = self._decoded
        for raw_key, (timestamp, value) in deferred.items():
            raw_value = dumps(value, timestamp)
            entries[raw_key] = raw_value
            decoded[raw_key] = (raw_value, (timestamp, value))
            if pending is not None:
                pending[raw_key] = raw_value
        deferred.clear()

    def _loads_timestamped(self, raw: bytes) -> Sequence[Any]:
        # Replaced by the serde's own method on first use (one lookup per store).
        loads = getattr(self.spec.value_serde, "loads_timestamped", None)
        if loads is None:
            raise StateStoreError(f"{self!r}: its values carry no timestamps (value serde "
                                  f"{self.spec.value_serde.name!r}, not 'timestamped')")
        self._loads_timestamped = loads  # type: ignore[method-assign]
        return loads(raw)  # type: ignore[no-any-return]

    def _dumps_timestamped(self, value: Any, timestamp: int) -> bytes:
        dumps = getattr(self.spec.value_serde, "dumps_timestamped", None)
        if dumps is None:
            raise StateStoreError(f"{self!r}: its values carry no timestamps (value serde "
                                  f"{self.spec.value_serde.name!r}, not 'timestamped')")
        self._dumps_timestamped = dumps  # type: ignore[method-assign]
        return dumps(value, timestamp)  # type: ignore[no-any-return]

    def delete(self, key: Any) -> None:
        raw_key = self._encoded_key(key)
        self._require_open()
        if self._deferred:
            self._deferred.pop(raw_key, None)
        if self._cached:
            self._cached.pop(raw_key, None)
        self._buffer.put(raw_key, None)
        self._queue(raw_key, None)

    def write_input_position(self, offsets: dict[str, int]) -> None:
        """Record the next input offset per ``"topic:partition"`` this state reflects. Its
        changelog record follows the writes it covers: restoration applies a task store's
        writes only once such a record covers them."""
        raw = msgpack.packb(offsets)
        self._require_open()
        self._encode_deferred()
        self._buffer.put(INPUT_POSITION_KEY, raw)
        self._queue_position(raw)

    def read_input_position(self) -> dict[str, int]:
        raw = self._raw_get(INPUT_POSITION_KEY)
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
        """Encoded entries as stored (uncommitted writes included), for snapshots and
        comparisons."""
        return self._raw_scan(None, None, False)

    # -- committed reads (interactive queries) ---------------------------------------------

    def get_committed(self, key: Any, default: Any = None) -> Any:
        """The value as of the last commit (or, for a copy, the last changelog batch it
        applied): the database alone, without the writes buffered since. What a commit has
        made durable is what any later owner restores, so such a read never shows a write
        that a crash could take back."""
        raw = self._db_get(self._require_open(), self.spec.key_serde.dumps(key))
        return default if raw is None else self.spec.value_serde.loads(raw)

    def range_committed(
        self, start: Any = None, end: Any = None, *, reverse: bool = False
    ) -> Iterator[tuple[Any, Any]]:
        """Like ``range``, over the committed state only (see ``get_committed``)."""
        lower = None if start is None else self.spec.key_serde.dumps(start)
        upper = None if end is None else self.spec.key_serde.dumps(end)
        loads_key = self.spec.key_serde.loads
        loads_value = self.spec.value_serde.loads
        for key, value in self._db_scan(lower, upper, reverse):
            yield loads_key(key), loads_value(value)

    def approximate_count(self) -> int:
        return int(self._require_open().property_int_value("rocksdb.estimate-num-keys") or 0)

    def _scan(
        self, lower: bytes | None, upper: bytes | None, reverse: bool
    ) -> Iterator[tuple[Any, Any]]:
        loads_key = self.spec.key_serde.loads
        loads_value = self.spec.value_serde.loads
        for key, value in self._raw_scan(lower, upper, reverse):
            yield loads_key(key), loads_value(value)

    def _raw_scan(
        self, lower: bytes | None, upper: bytes | None, reverse: bool
    ) -> Iterator[tuple[bytes, bytes]]:
        """The database's entries in range merged with the buffer's, reserved keys left out."""
        self._encode_deferred()
        buffered = [
            (key, value) for key, value in self._buffer.scan(lower, upper, reverse)
            if not key.startswith(RESERVED_PREFIX)
        ]
        return merge(self._db_scan(lower, upper, reverse), buffered, reverse)

    def _db_scan(
        self, lower: bytes | None, upper: bytes | None, reverse: bool
    ) -> Iterator[tuple[bytes, bytes]]:
        try:
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
            while iterator.valid():
                key = iterator.key()
                if (upper is not None and key >= upper) or (lower is not None and key < lower):
                    return
                if not key.startswith(RESERVED_PREFIX):
                    yield key, iterator.value()
                if reverse:
                    iterator.prev()
                else:
                    iterator.next()
            iterator.status()
        except StateStoreError:
            raise
        except Exception as exc:
            raise StoreReadError(f"{self!r}: scan failed: {exc}") from exc

    # -- changelog side --------------------------------------------------------------------

    def drain_changelog(self) -> list[ChangelogRecord]:
        """Hand over the changelog records queued since the last drain: the latest write of
        each key, an input position after the writes it covers. The store counts them as
        unacknowledged until ``acknowledged`` (or ``requeue_changelog``) is called for each."""
        self._encode_deferred()
        if self._covered:
            records = [*self._covered.items(), *self._pending.items()]
        else:
            records = list(self._pending.items())
        self._covered = {}
        self._pending = {}
        self.changelog_bytes = 0
        self._unacked += len(records)
        return records

    def requeue_changelog(self, records: list[ChangelogRecord]) -> None:
        """Put records drained but never handed to the producer back in front of the queue."""
        if not records:
            return
        self._encode_deferred()
        self._unacked -= len(records)
        newer = [*self._covered.items(), *self._pending.items()]
        self._covered, self._pending, self.changelog_bytes = {}, {}, 0
        for key, value in (*records, *newer):
            if key == INPUT_POSITION_KEY and value is not None:
                self._queue_position(value)
            else:
                self._queue(key, value)

    def acknowledged(self, next_offset: int, records: int = 1) -> None:
        """The changelog holds ``records`` more of this store's writes, the last one ending
        before ``next_offset``."""
        stale = min(records, self._stale_acks)
        self._stale_acks -= stale
        if stale == records:
            return
        self._unacked = max(0, self._unacked - (records - stale))
        self._acked_to = max(self._acked_to, next_offset)

    @property
    def unacknowledged(self) -> int:
        """Changelog records queued or handed over and not acknowledged yet."""
        self._encode_deferred()
        return len(self._covered) + len(self._pending) + self._unacked

    def apply_restore_batch(self, records: list[ChangelogRecord], next_offset: int) -> None:
        """Apply changelog records (already encoded) in one WriteBatch; tombstones delete."""
        db = self._require_open()
        self._forget_cached()
        self._encode_deferred()
        if self._buffer:
            raise StateStoreError(
                f"{self!r}: {len(self._buffer)} uncommitted writes; abort them before "
                f"restoring"
            )
        batch = WriteBatch(raw_mode=True)
        put, delete = batch.put, batch.delete
        for key, value in records:
            if value is None:
                delete(key)
            else:
                put(key, value)
        # No write-ahead log: the changelog is the log. A crash before the next checkpoint
        # (written after a flush) replays from the previous one.
        try:
            db.write(batch, _NO_WAL)
        except Exception as exc:
            raise StoreWriteError(f"{self!r}: restore write failed: {exc}") from exc
        self.position = next_offset
        self._acked_to = max(self._acked_to, next_offset)

    def ingest_sst(self, sst_path: Path, next_offset: int) -> None:
        """Bulk-load a sorted SST file (a snapshot) and move the position to ``next_offset``."""
        self._forget_cached()
        try:
            self._require_open().ingest_external_file([str(sst_path)])
        except StateStoreError:
            raise
        except Exception as exc:
            raise StoreWriteError(f"{self!r}: ingesting {sst_path} failed: {exc}") from exc
        self.position = next_offset
        self._acked_to = max(self._acked_to, next_offset)

    def set_position(self, next_offset: int) -> None:
        """The database reflects the changelog up to ``next_offset`` (nothing to apply)."""
        self.position = next_offset
        self._acked_to = max(self._acked_to, next_offset)


def _open_db(directory: Path, bulk_load: bool, store: KeyValueStore) -> Rdict:
    options = _db_options(bulk_load)
    try:
        # Named for the default column family too: else rocksdict opens an existing database
        # with the options it was last opened with (a bulk-load memtable included).
        return Rdict(str(directory), options, column_families={"default": options})
    except Exception as exc:
        # RocksDB reports what it found on disk as "Corruption: ..." (a truncated SST file,
        # garbage in CURRENT); anything else (no space, permissions) is the machine's.
        if str(exc).startswith("Corruption"):
            raise StoreCorruptError(f"{store!r} cannot be opened: {exc}") from exc
        raise StoreIOError(f"{store!r} cannot be opened: {exc}") from exc


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
