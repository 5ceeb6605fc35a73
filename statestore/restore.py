"""Restoration: reading changelog partitions back into stores.

One :class:`ChangelogReader` serves every copy of state a member holds. An active task's
stores are restored to the changelog's end before the task runs; standby and learner copies
stay registered and keep following the changelog. For each registered store the reader knows
its position and the changelog's end, hence its lag, which the member reports in its
subscription and which decides isReady.

The reader fetches through :mod:`statestore.fetch` (no per-record consumer objects) and keeps
the next fetch in flight while it checks and writes the previous one: the broker serves it
meanwhile. Each fetch is applied to its store in one WriteBatch (a long run of records
held for its input position, below, in slices of ``APPLY_SLICE_BYTES`` with the event loop
run between them), for restoring actives and following copies alike. Stores being restored
are opened for bulk loading (a vector memtable, sorted when RocksDB flushes it in its own
threads) and switched to the default memtable before a task reads them
(``KeyValueStore.end_bulk_load``).

A task's store (``tracks_input``) writes its changelog in groups, each closed by the input
position the group's writes reflect (a reserved key). The reader applies such a changelog
only up to the last input position it read and holds the records after it until the next
one arrives: a writer that stopped mid-group (killed, or stopped at a bad record) left
writes whose input was never covered, and applying them would count that input twice when
it is processed again. When the store stops being read with records still held, it is told
their keys (``mark_uncovered``), and the task that runs it writes its restored values over
them before anything else.

The changelog's end is taken from the fetch response (its last stable offset, which is the
high watermark unless a transaction is open), never from ListOffsets: some brokers answer
ListOffsets(latest) with the last batch's base offset + 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka.structs import TopicPartition

from statestore.errors import ChangelogDecodeError, StateStoreError
from statestore.fetch import ChangelogFetcher, FetchedPartition, FetchedRecord, FetchSettings
from statestore.serdes import OrderedKeySerde, SerdeError
from statestore.store import RESERVED_PREFIX, KeyValueStore

log = logging.getLogger(__name__)

# 0xff starts the store's reserved keys (the input position).
_ORDERED_KEY_TAGS = frozenset({0x05, 0x08, 0x10, 0x18, 0x20, 0x30, 0x40, 0xFF})

#: Bytes of changelog records written to a store in one WriteBatch. Records held until an
#: input position covers them can add up to hundreds of MB (a changelog written without
#: positions for a long stretch, such as a prefilled one), and RocksDB holds the GIL while it
#: writes a batch: one batch of 800 MB stopped the whole process for 6 s, heartbeats
#: included, and its member lost its session. Written in slices with the event loop run
#: between them, the store's position moving with the last slice.
APPLY_SLICE_BYTES = 8 * 1024 * 1024
#: The broker's max wait for a fetch sent while a store's changelog end is unknown. Not 0:
#: Tansu answers a fetch that may not wait with no partition at all, so the end stayed
#: unknown for good.
END_PROBE_WAIT_MS = 1


@dataclass
class RestoreStats:
    records: int = 0
    #: Bytes of record batches read.
    bytes: int = 0
    seconds: float = 0.0

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def megabytes_per_second(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class CopyProgress:
    """How far one store copy is: the next changelog offset it will apply and the end."""

    topic: str
    partition: int
    position: int
    end: int | None

    @property
    def lag(self) -> int | None:
        return None if self.end is None else max(0, self.end - self.position)


@dataclass(frozen=True)
class _Accepted:
    """A fetched partition to apply to its store: the changes and the offset after them."""

    store: KeyValueStore
    fetched: FetchedPartition
    changes: list[FetchedRecord]
    next_offset: int


class ChangelogReader:
    """Reads changelog partitions into the stores registered with it."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_id: str = "relay-restore",
        validate: bool = True,
        max_records: int | None = None,
        fetch_max_bytes: int = 64 * 1024 * 1024,
        max_partition_fetch_bytes: int = 16 * 1024 * 1024,
        fetch_max_wait_ms: int = 100,
        committed_by_markers: bool = False,
    ) -> None:
        """``max_records`` caps the records one poll applies per partition (None: all that
        a fetch returned); ``committed_by_markers``: see :class:`FetchSettings`."""
        settings = FetchSettings(
            max_wait_ms=fetch_max_wait_ms,
            max_bytes=fetch_max_bytes,
            max_partition_bytes=max_partition_fetch_bytes,
            committed_by_markers=committed_by_markers,
        )
        self._fetcher = ChangelogFetcher(bootstrap_servers, client_id, settings)
        self._validate = validate
        self._max_records = max_records
        self._stores: dict[TopicPartition, KeyValueStore] = {}
        #: Where each partition's next fetch starts: ahead of its store's position while the
        #: fetch that got there is being checked and written.
        self._fetch_positions: dict[TopicPartition, int] = {}
        #: Each partition's end as the last fetch answered it.
        self._ends: dict[TopicPartition, int] = {}
        #: Records of input-tracking stores read after their last input position, not applied.
        self._held: dict[TopicPartition, list[FetchedRecord]] = {}
        #: What each partition's store was given since it was registered.
        self._read_since: dict[TopicPartition, RestoreStats] = {}
        self._in_flight: asyncio.Task[list[FetchedPartition]] | None = None
        self._started = False
        self.stats = RestoreStats()

    async def start(self) -> None:
        if not self._started:
            await self._fetcher.start()
            self._started = True

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self._cancel_in_flight()
            await self._fetcher.close()

    async def __aenter__(self) -> ChangelogReader:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- registration ----------------------------------------------------------------------

    def register(self, store: KeyValueStore) -> None:
        """Start reading the store's changelog partition from the store's position."""
        if store.changelog_topic is None:
            return
        if not store.is_open:
            raise StateStoreError(f"open store {store.name} before registering it")
        if store.uncommitted or store.unacknowledged:
            # Its writes since the last commit may or may not be in the changelog, which is
            # read again from the position the database reflects.
            log.warning("%r: %d uncommitted writes dropped; the changelog is read from offset "
                        "%d instead", store, store.uncommitted, store.position)
            store.abort()
        tp = TopicPartition(store.changelog_topic, store.partition)
        self._drop_in_flight()
        self._stores[tp] = store
        self._fetch_positions[tp] = store.position
        self._held.pop(tp, None)
        self._read_since[tp] = RestoreStats()
        # The end is unknown until a fetch issued from now on answers.
        self._ends.pop(tp, None)
        self._fetcher.track(tp.topic)

    def unregister(self, store: KeyValueStore) -> None:
        if store.changelog_topic is None:
            return
        tp = TopicPartition(store.changelog_topic, store.partition)
        if self._stores.get(tp) is store:
            self._drop_in_flight()
            del self._stores[tp]
            self._fetch_positions.pop(tp, None)
            self._ends.pop(tp, None)
            self._read_since.pop(tp, None)
            held = self._held.pop(tp, None)
            if held:
                store.mark_uncovered({key for key, _ in held if key is not None})

    @property
    def fetcher(self) -> ChangelogFetcher:
        return self._fetcher

    @property
    def stores(self) -> list[KeyValueStore]:
        return list(self._stores.values())

    def progress(self, store: KeyValueStore) -> CopyProgress:
        """How far the store's changelog was read, and its end. Records held back (after
        the last input position) count as read: they wait for their writer, not the reader."""
        if store.changelog_topic is None:
            return CopyProgress("", store.partition, store.position, store.position)
        tp = TopicPartition(store.changelog_topic, store.partition)
        if self._stores.get(tp) is not store:
            return CopyProgress(tp.topic, tp.partition, store.position, None)
        return CopyProgress(tp.topic, tp.partition, self._fetch_positions[tp], self._ends.get(tp))

    def lag(self, store: KeyValueStore) -> int | None:
        """Records the store is behind its changelog's end; None until the end is known."""
        return self.progress(store).lag

    def caught_up(self, store: KeyValueStore) -> bool:
        return self.lag(store) == 0

    def is_registered(self, store: KeyValueStore) -> bool:
        tp = TopicPartition(store.changelog_topic or "", store.partition)
        return self._stores.get(tp) is store

    def read_since_registered(self, store: KeyValueStore) -> RestoreStats:
        """The records and bytes read into the store since it was registered (nothing for a
        store not registered)."""
        tp = TopicPartition(store.changelog_topic or "", store.partition)
        if self._stores.get(tp) is not store:
            return RestoreStats()
        read = self._read_since[tp]
        return RestoreStats(read.records, read.bytes)

    def read_position(self, store: KeyValueStore) -> int:
        """How far the store's changelog was read (collected changes included)."""
        tp = TopicPartition(store.changelog_topic or "", store.partition)
        return self._fetch_positions.get(tp, store.position)

    # -- reading ---------------------------------------------------------------------------

    async def poll(self, timeout_ms: int = 200) -> int:
        """Apply what the fetch in flight returned (waiting up to ``timeout_ms`` for it) and
        send the next one; returns the records applied."""
        if not self._stores:
            await asyncio.sleep(timeout_ms / 1000)
            return 0
        if self._in_flight is None:
            self._in_flight = self._send_fetch()
        fetch = self._in_flight
        await asyncio.wait({fetch}, timeout=timeout_ms / 1000)
        if fetch is not self._in_flight or not fetch.done():
            return 0  # still in flight, or dropped by a registration meanwhile
        self._in_flight = None
        accepted = self._accept(fetch.result())
        if self._stores:
            # The broker serves the next fetch while this one is checked and written.
            sent = asyncio.Event()
            self._in_flight = next_fetch = self._send_fetch(sent)
            await _until_sent(next_fetch, sent)
            # Registrations may have changed meanwhile: apply only what is still wanted.
            accepted = [item for item in accepted if self._still_wanted(item)]
        applied = 0
        for done, item in enumerate(accepted):
            if done and not self._still_wanted(item):
                continue  # unregistered while an earlier one was written
            try:
                self._check(item.store, item.fetched, item.changes)
                await self._apply(item)
            except BaseException:
                self._read_again(accepted[done:])
                raise
            applied += len(item.changes)
            self.stats.bytes += item.fetched.size
            self.stats.records += len(item.changes)
            read = self._read_since.get(item.fetched.tp)
            if read is not None:
                read.bytes += item.fetched.size
                read.records += len(item.changes)
        return applied

    def _still_wanted(self, item: _Accepted) -> bool:
        tp = item.fetched.tp
        return self._stores.get(tp) is item.store and self._fetch_positions.get(tp) == (
            item.next_offset
        )

    def _read_again(self, unapplied: list[_Accepted]) -> None:
        """Fetches not applied (one failed) are read again from what their stores hold."""
        self._drop_in_flight()
        for item in unapplied:
            tp = item.fetched.tp
            if self._stores.get(tp) is item.store:
                self._fetch_positions[tp] = item.store.position
                self._held.pop(tp, None)

    def _send_fetch(
        self, sent: asyncio.Event | None = None
    ) -> asyncio.Task[list[FetchedPartition]]:
        positions = dict(self._fetch_positions)
        # A store just registered waits for its changelog's end, which only a fetch answers.
        # Already at the end (a standby promoted, a store restarted where it stopped), it
        # finds nothing new, and the broker would hold the fetch for its whole max wait
        # before saying so: every restored task waited that long to start.
        unknown_end = any(tp not in self._ends for tp in positions)
        return asyncio.ensure_future(self._fetcher.fetch(
            positions, sent, max_wait_ms=END_PROBE_WAIT_MS if unknown_end else None))

    def _accept(self, fetched: list[FetchedPartition]) -> list[_Accepted]:
        """The fetched partitions still wanted from where they were fetched, with the changes
        to apply and the offset after them; moves the fetch positions past them."""
        accepted: list[_Accepted] = []
        for part in fetched:
            store = self._stores.get(part.tp)
            if store is None or self._fetch_positions.get(part.tp) != part.fetch_offset:
                continue
            if part.past_end:
                self._discard_foreign_state(store, part)
                continue
            changes, next_offset = part.changes, part.next_offset
            if self._max_records is not None and len(changes) > self._max_records:
                changes = changes[: self._max_records]
                next_offset = part.offset_of(self._max_records)
            self._fetch_positions[part.tp] = next_offset
            if part.end is not None:
                self._ends[part.tp] = part.end
            accepted.append(_Accepted(store, part, changes, next_offset))
        return accepted

    def _discard_foreign_state(self, store: KeyValueStore, part: FetchedPartition) -> None:
        """The store reflects a changelog longer than the one on the broker: its state (and
        the input position in it) was written against another cluster, a replaced broker
        say, or before the changelog was deleted. Kept, it would answer queries with the old
        counts and skip the new input as already processed: it is discarded, and read again
        from the changelog's start."""
        log.warning(
            "%r: its state reflects %s[%d] up to offset %d, but that changelog ends before "
            "it: the state directory belongs to another cluster (a replaced broker?) or the "
            "changelog was deleted. Discarding the local state and restoring from the "
            "changelog", store, part.tp.topic, part.tp.partition, part.fetch_offset)
        store.clear()
        self._fetch_positions[part.tp] = store.position
        self._held.pop(part.tp, None)
        self._ends.pop(part.tp, None)

    async def _apply(self, item: _Accepted) -> None:
        store = item.store
        if store.tracks_input:
            await self._apply_covered(item)
        # An empty fetch at the end changes nothing; control batches alone move the position.
        elif item.changes or item.next_offset != store.position:
            await self._write(item, item.changes, item.next_offset)

    async def _write(self, item: _Accepted, records: list[FetchedRecord],
                     next_offset: int) -> None:
        """Write ``records`` to the item's store in slices of about ``APPLY_SLICE_BYTES``,
        letting the event loop run between slices; the store's position moves to
        ``next_offset`` with the last slice. If the store stops being read meanwhile, the
        rest is left unwritten: its position has not moved, so its next reader reads those
        records again (applying a record twice is harmless: each is a whole value)."""
        store = item.store
        # Sliced by count, at this fetch's mean record size: no pass over the records.
        per_slice = max(1, APPLY_SLICE_BYTES * max(1, len(item.changes))
                        // max(1, item.fetched.size))
        start = 0
        while True:
            end = start + per_slice
            if end >= len(records):
                store.apply_restore_batch(records[start:] if start else records,  # type: ignore[arg-type]
                                          next_offset)
                return
            store.apply_restore_batch(records[start:end], store.position)  # type: ignore[arg-type]
            start = end
            await asyncio.sleep(0)
            if not self._still_wanted(item):
                return

    async def _apply_covered(self, item: _Accepted) -> None:
        """Apply the records up to the last input position read; hold the rest."""
        tp, changes = item.fetched.tp, item.changes
        held = self._held.get(tp, [])
        last = len(changes) - 1
        while last >= 0 and not _is_reserved(changes[last][0]):
            last -= 1
        if last < 0:
            if changes:
                self._held[tp] = held + changes
            elif not held and item.next_offset != item.store.position:
                item.store.set_position(item.next_offset)
            return
        covered = held + changes[: last + 1] if held else changes[: last + 1]
        rest = changes[last + 1:]
        if rest:
            self._held[tp] = rest
            # Where a restart reads again from: the start of this fetch, before the records
            # held (applying the covered ones again is harmless: they are whole values).
            position = item.fetched.fetch_offset
        else:
            self._held.pop(tp, None)
            position = item.next_offset
        await self._write(item, covered, max(position, item.store.position))

    def _check(
        self, store: KeyValueStore, fetched: FetchedPartition, changes: list[FetchedRecord]
    ) -> None:
        """Every change has a key that starts with a known tag and a value the store's serde
        can read; else a ChangelogDecodeError names the first bad record."""
        if not self._validate:
            return
        check_tag = isinstance(store.spec.key_serde, OrderedKeySerde)
        loads_value = store.spec.value_serde.loads
        tags = _ORDERED_KEY_TAGS
        # One tight pass; only when it fails does a second one find which record and why.
        try:
            for key, value in changes:
                if not key or (check_tag and key[0] not in tags):
                    break
                if value is not None:
                    loads_value(value)
            else:
                return
        except SerdeError:
            pass
        self._raise_first_bad(store, fetched, changes, check_tag)

    def _raise_first_bad(
        self,
        store: KeyValueStore,
        fetched: FetchedPartition,
        changes: list[FetchedRecord],
        check_tag: bool,
    ) -> None:
        tp = fetched.tp
        for index, (key, value) in enumerate(changes):
            cause: SerdeError | None = None
            if not key:
                reason = "no key"
            elif check_tag and key[0] not in _ORDERED_KEY_TAGS:
                reason = f"key starts with 0x{key[0]:02x}"
            elif value is None:
                continue
            else:
                try:
                    store.spec.value_serde.loads(value)
                    continue
                except SerdeError as exc:
                    reason, cause = str(exc), exc
            raise ChangelogDecodeError(
                tp.topic, tp.partition, fetched.offset_of(index), reason
            ) from cause
        raise StateStoreError(f"a record of {tp} failed a check and then passed it")

    def _drop_in_flight(self) -> None:
        """Forget the fetch in flight: it was sent for other stores or positions."""
        fetch, self._in_flight = self._in_flight, None
        if fetch is not None:
            fetch.cancel()
            fetch.add_done_callback(_retrieve_outcome)

    async def _cancel_in_flight(self) -> None:
        fetch, self._in_flight = self._in_flight, None
        if fetch is not None:
            fetch.cancel()
            with contextlib.suppress(BaseException):
                await fetch

    async def restore(
        self,
        stores: Iterable[KeyValueStore],
        *,
        show_progress: bool | None = None,
        timeout_s: float | None = None,
    ) -> RestoreStats:
        """Bring ``stores`` to their changelog's end, then stop reading them.

        Progress is drawn with rich when stderr is a terminal; the rate is logged at the end.
        """
        stores = [s for s in stores if s.changelog_topic is not None]
        stats_before = RestoreStats(self.stats.records, self.stats.bytes)
        started = time.perf_counter()
        for store in stores:
            self.register(store)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        draw = sys.stderr.isatty() if show_progress is None else show_progress
        progress_bar = _RestoreProgress(stores, self) if draw else None
        try:
            # A store unregistered meanwhile (its task was closed: revoked while restoring)
            # holds the restoration no longer: its end is forgotten, so it would never catch up.
            while not all(self.caught_up(store) for store in stores
                          if self.is_registered(store)):
                if deadline is not None and time.monotonic() > deadline:
                    raise StateStoreError(
                        f"restoration did not reach the changelog end within {timeout_s}s"
                    )
                await self.poll(timeout_ms=100)
                if progress_bar is not None:
                    progress_bar.update()
        finally:
            if progress_bar is not None:
                progress_bar.close()
            for store in stores:
                self.unregister(store)
        result = RestoreStats(
            records=self.stats.records - stats_before.records,
            bytes=self.stats.bytes - stats_before.bytes,
            seconds=time.perf_counter() - started,
        )
        log.info(
            "restored %d stores: %d records, %.1f MB in %.2fs (%.0f records/s, %.1f MB/s)",
            len(stores), result.records, result.bytes / 1e6, result.seconds,
            result.records_per_second, result.megabytes_per_second,
        )
        return result

    async def follow(self, stop: asyncio.Event) -> None:
        """Keep registered standby and learner copies up to date until ``stop`` is set."""
        while not stop.is_set():
            await self.poll(timeout_ms=200)


def _is_reserved(key: bytes | None) -> bool:
    return key is not None and key.startswith(RESERVED_PREFIX)


async def _until_sent(fetch: asyncio.Task[list[FetchedPartition]], sent: asyncio.Event) -> None:
    """Wait until the fetch's requests are written (or it ended, or was dropped)."""
    waiter = asyncio.ensure_future(sent.wait())
    try:
        await asyncio.wait({fetch, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


def _retrieve_outcome(fetch: asyncio.Future[object]) -> None:
    # A dropped fetch may have failed; its error is of no interest, but unretrieved it
    # would be reported as "never retrieved".
    if not fetch.cancelled():
        fetch.exception()


class _RestoreProgress:
    """A rich progress bar over the records left to restore."""

    def __init__(self, stores: list[KeyValueStore], reader: ChangelogReader) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._stores = stores
        self._reader = reader
        self._progress = Progress(
            TextColumn("restoring {task.fields[count]} stores"),
            BarColumn(),
            # Counts whether or not the total is known yet (a format spec fails on None).
            MofNCompleteColumn(),
            TextColumn("records"),
            TimeRemainingColumn(),
            transient=True,
        )
        self._start = {id(s): reader.read_position(s) for s in stores}
        self._task = self._progress.add_task("restore", total=None, count=len(stores))
        self._progress.start()

    def update(self) -> None:
        done = sum(self._reader.read_position(s) - self._start[id(s)] for s in self._stores)
        ends = [self._reader.progress(s).end for s in self._stores]
        total = None
        if all(end is not None for end in ends):
            total = sum(end - self._start[id(s)] for s, end in zip(self._stores, ends, strict=True))
        self._progress.update(self._task, completed=done, total=total)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._progress.stop()
