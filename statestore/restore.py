"""Restoration: reading changelog partitions back into stores.

One :class:`ChangelogReader` (one consumer, manually assigned) serves every copy of state a
member holds. An active task's stores are restored to the changelog's end before the task
runs; standby and learner copies stay registered and keep following the changelog. For each
registered store the reader knows its position and the changelog's end, hence its lag, which
the member reports in its subscription and which decides isReady.

The changelog's end is taken from the fetch high watermark, never from ListOffsets: some
brokers answer ListOffsets(latest) with the last batch's base offset + 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from statestore.errors import ChangelogDecodeError, StateStoreError
from statestore.serdes import OrderedKeySerde, SerdeError
from statestore.store import ChangelogRecord, KeyValueStore

log = logging.getLogger(__name__)

# 0xff starts the store's reserved keys (the input position).
_ORDERED_KEY_TAGS = frozenset({0x05, 0x08, 0x10, 0x18, 0x20, 0x30, 0x40, 0xFF})


@dataclass
class RestoreStats:
    records: int = 0
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


class ChangelogReader:
    """Reads changelog partitions into the stores registered with it."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_id: str = "relay-restore",
        validate: bool = True,
        max_records: int = 50_000,
        fetch_max_bytes: int = 64 * 1024 * 1024,
        max_partition_fetch_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_servers,
            client_id=client_id,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_bytes=fetch_max_bytes,
            max_partition_fetch_bytes=max_partition_fetch_bytes,
            fetch_max_wait_ms=100,
            check_crcs=False,
        )
        self._validate = validate
        self._max_records = max_records
        self._stores: dict[TopicPartition, KeyValueStore] = {}
        self._started = False
        self.stats = RestoreStats()

    async def start(self) -> None:
        if not self._started:
            await self._consumer.start()
            self._started = True

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self._consumer.stop()

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
        tp = TopicPartition(store.changelog_topic, store.partition)
        self._stores[tp] = store
        self._reassign()

    def unregister(self, store: KeyValueStore) -> None:
        if store.changelog_topic is None:
            return
        tp = TopicPartition(store.changelog_topic, store.partition)
        if self._stores.get(tp) is store:
            del self._stores[tp]
            self._reassign()

    def _reassign(self) -> None:
        # assign() forgets every position, so every registered store is sought again.
        if not self._stores:
            # An empty assignment (or unsubscribe) while a fetch is in flight leaves aiokafka
            # 0.14's fetcher unable to stop; pausing what was assigned stops the fetching alike.
            self._consumer.pause(*self._consumer.assignment())
            return
        self._consumer.assign(list(self._stores))
        for tp, store in self._stores.items():
            self._consumer.seek(tp, store.position)

    @property
    def stores(self) -> list[KeyValueStore]:
        return list(self._stores.values())

    def progress(self, store: KeyValueStore) -> CopyProgress:
        if store.changelog_topic is None:
            return CopyProgress("", store.partition, store.position, store.position)
        tp = TopicPartition(store.changelog_topic, store.partition)
        end = self._consumer.highwater(tp) if tp in self._stores else None
        return CopyProgress(tp.topic, tp.partition, store.position, end)

    def lag(self, store: KeyValueStore) -> int | None:
        """Records the store is behind its changelog's end; None until the end is known."""
        return self.progress(store).lag

    def caught_up(self, store: KeyValueStore) -> bool:
        return self.lag(store) == 0

    # -- reading ---------------------------------------------------------------------------

    async def poll(self, timeout_ms: int = 200) -> int:
        """Fetch once and apply what came to the stores; returns the records applied."""
        if not self._stores:
            await asyncio.sleep(timeout_ms / 1000)
            return 0
        batches = await self._consumer.getmany(
            timeout_ms=timeout_ms, max_records=self._max_records
        )
        applied = 0
        for tp, records in batches.items():
            store = self._stores.get(tp)
            if store is None or not records:
                continue
            changes = self._changes(tp, store, records)
            store.apply_restore_batch(changes, records[-1].offset + 1)
            applied += len(records)
            self.stats.bytes += sum(
                r.serialized_key_size + r.serialized_value_size for r in records
            )
        self.stats.records += applied
        return applied

    def _changes(self, tp: TopicPartition, store: KeyValueStore, records: list) -> list:
        """The records as (key, value) pairs, each checked in the same pass: a key that is
        present and starts with a known tag, a value the store's serde can read."""
        if not self._validate:
            return [(r.key, r.value) for r in records]
        check_tag = isinstance(store.spec.key_serde, OrderedKeySerde)
        loads_value = store.spec.value_serde.loads
        tags = _ORDERED_KEY_TAGS
        changes: list[ChangelogRecord] = []
        append = changes.append
        for record in records:
            key, value = record.key, record.value
            if not key or (check_tag and key[0] not in tags):
                reason = "no key" if not key else f"key starts with 0x{key[0]:02x}"
                raise ChangelogDecodeError(tp.topic, tp.partition, record.offset, reason)
            if value is not None:
                try:
                    loads_value(value)
                except SerdeError as exc:
                    raise ChangelogDecodeError(
                        tp.topic, tp.partition, record.offset, str(exc)
                    ) from exc
            append((key, value))
        return changes

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
            while not all(self.caught_up(store) for store in stores):
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


class _RestoreProgress:
    """A rich progress bar over the records left to restore."""

    def __init__(self, stores: list[KeyValueStore], reader: ChangelogReader) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self._stores = stores
        self._reader = reader
        self._progress = Progress(
            TextColumn("restoring {task.fields[count]} stores"),
            BarColumn(),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} records"),
            TimeRemainingColumn(),
            transient=True,
        )
        self._start = {id(s): s.position for s in stores}
        self._task = self._progress.add_task("restore", total=None, count=len(stores))
        self._progress.start()

    def update(self) -> None:
        done = sum(s.position - self._start[id(s)] for s in self._stores)
        ends = [self._reader.progress(s).end for s in self._stores]
        total = None
        if all(end is not None for end in ends):
            total = sum(end - self._start[id(s)] for s, end in zip(self._stores, ends, strict=True))
        self._progress.update(self._task, completed=done, total=total)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._progress.stop()
