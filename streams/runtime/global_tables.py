"""The runtime of global tables: each one a store of the process's own (no changelog),
restored from all partitions of its topic before any task runs, then kept up to date by
reading the topic for as long as the app runs.

At start the store is wiped and the topic read from its beginning to its end (as the fetch
reports it, so that Tansu's short ListOffsets answer does not matter): what every instance
holds then is the whole topic as of that moment. While the app runs, new records are applied
as they come; the store commits every second (it has nothing to ship: the topic is its
changelog).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from pathlib import Path

from aiokafka.structs import TopicPartition

from statestore.fetch import ChangelogFetcher
from statestore.store import KeyValueStore, StoreSpec
from streams.dsl.global_tables import GlobalTable

log = logging.getLogger(__name__)

COMMIT_INTERVAL_S = 1.0


class GlobalTables:
    """The app's global tables in this process."""

    def __init__(self, tables: list[GlobalTable]) -> None:
        self.tables = tables
        self._fetcher: ChangelogFetcher | None = None
        self._positions: dict[TopicPartition, int] = {}

    def open(self, state_dir: Path, application_id: str) -> None:
        for table in self.tables:
            directory = Path(state_dir) / application_id / "global" / table.store
            shutil.rmtree(directory, ignore_errors=True)  # restored from the topic
            table.opened = KeyValueStore(StoreSpec(table.store, changelogged=False),
                                         directory, None, -1).open()

    async def restore(self, bootstrap: str, partitions: dict[str, int]) -> None:
        """Read every table's topic from its beginning to its end."""
        if not self.tables:
            return
        self._fetcher = ChangelogFetcher(bootstrap, "relay-global-tables")
        await self._fetcher.start()
        for table in self.tables:
            self._fetcher.track(table.topic)
            for p in range(partitions[table.topic]):
                self._positions[TopicPartition(table.topic, p)] = 0
        behind = set(self._positions)
        while behind:
            for fetched in await self._fetch(behind):
                if fetched.end is not None and fetched.next_offset >= fetched.end:
                    behind.discard(fetched.tp)
        self._commit()
        log.info("global tables %s restored", ", ".join(t.store for t in self.tables))

    async def follow(self, stop: asyncio.Event) -> None:
        """Apply the topics' new records until ``stop`` is set."""
        if self._fetcher is None:
            return
        last_commit = time.monotonic()
        while not stop.is_set():
            fetched = await self._fetch(set(self._positions))
            if not any(f.changes for f in fetched):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.1)
            if time.monotonic() - last_commit >= COMMIT_INTERVAL_S:
                self._commit()
                last_commit = time.monotonic()

    async def _fetch(self, tps: set[TopicPartition]) -> list:
        assert self._fetcher is not None
        fetched_all = await self._fetcher.fetch({tp: self._positions[tp] for tp in tps})
        by_topic = {t.topic: t for t in self.tables}
        for fetched in fetched_all:
            table = by_topic[fetched.tp.topic]
            for key, value in fetched.changes:
                table.apply_or_skip(key, value, str(fetched.tp))
            self._positions[fetched.tp] = fetched.next_offset
        return fetched_all

    def _commit(self) -> None:
        for table in self.tables:
            if table.opened is not None:
                table.opened.commit()

    async def close(self) -> None:
        if self._fetcher is not None:
            await self._fetcher.close()
            self._fetcher = None
        for table in self.tables:
            if table.opened is not None:
                table.opened.close()
                table.opened = None
