"""Restoring new actives all together, each handed over as soon as its own state is restored.

As Kafka Streams' state updater does, one pass restores every restoring active at once: each
task's ``before_restore`` (exactly-once: ``init_transactions``, which fences its previous
owner) runs beside the others', its stores then join the one restoring
:class:`statestore.restore.ChangelogReader`, and the task goes to the thread (``on_restored``)
as soon as all of *its* stores reached their changelog's end. Restored one after the other,
the last of N tasks waited N round trips even with nothing to read; together, one round of
end-offset discovery serves them all.

A task's stores are registered only once its ``before_restore`` finished: no fetch reads its
changelog before its previous owner is fenced, so the end read cannot move afterwards. Tasks
revoked meanwhile leave the pass (their stores unregistered); tasks assigned meanwhile join
it. The decisions (who joins, who leaves, who is restored) are the pure functions below.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from statestore.store import KeyValueStore

log = logging.getLogger(__name__)

#: ``before_restore`` steps running at once. They block in worker threads (confluent-kafka's
#: ``init_transactions``), and asyncio's default pool (cores + 4 workers) also serves the
#: running tasks' commits and flushes: some workers are left to them.
FENCING_AT_ONCE = 4
#: How long one wait for news lasts (a fetch answering, a fencing step ending) before the
#: pass looks again for tasks assigned or revoked meanwhile.
POLL_MS = 100

Stores = dict[str, KeyValueStore]


def has_changelog(stores: Stores) -> bool:
    return any(store.changelog_topic is not None for store in stores.values())


def joining(restoring: Mapping[str, Stores], reading: Mapping[str, Stores],
            fencing: Collection[str]) -> list[str]:
    """Restoring actives that are not in the pass yet, in the order their ``before_restore``
    steps start: a task with no changelog first (a stateless first stage that feeds a
    repartition topic runs at once; the stages downstream wait on it), then by task id. A
    task whose earlier fencing still runs waits for it: two producers with one
    transactional id would fence each other."""
    new = [t for t, stores in restoring.items()
           if t not in fencing and reading.get(t) is not stores]
    return sorted(new, key=lambda t: (has_changelog(restoring[t]), t))


def dropped(restoring: Mapping[str, Stores], reading: Mapping[str, Stores]) -> list[str]:
    """Tasks of the pass no longer restoring the stores the pass reads (revoked, or revoked
    and assigned again with other stores)."""
    return sorted(t for t, stores in reading.items() if restoring.get(t) is not stores)


def restored(lags: Mapping[str, Sequence[int | None]]) -> list[str]:
    """Tasks whose every changelog was read to its end (an unknown end is not reached; a
    task with no changelog is restored at once), in the order they are handed over: those
    with no changelog first, then by task id."""
    done = [t for t, each in lags.items() if all(lag == 0 for lag in each)]
    return sorted(done, key=lambda t: (bool(lags[t]), t))


@dataclass(frozen=True)
class Restoration:
    """What restoring one task took: changelog records and bytes read, and the seconds from
    its stores' registration to its hand-over."""

    records: int
    bytes: int
    seconds: float


@dataclass
class _Reading:
    stores: Stores
    started: float


class RestorePass:
    """One pass over the thread's restoring actives, until none is left (or ``stop``)."""

    def __init__(
        self,
        reader: Any,
        restoring: Callable[[], Mapping[str, Stores]],
        before_restore: Callable[[str], Awaitable[Any]] | None,
        hand_over: Callable[[str, Stores, Restoration], Awaitable[None]],
    ) -> None:
        """``restoring``: the thread's restoring actives now; ``hand_over``: called for each
        restored task, its stores no longer read."""
        self._reader = reader
        self._restoring = restoring
        self._before_restore = before_restore
        self._hand_over = hand_over
        self._fencing: dict[str, tuple[Stores, asyncio.Future[Any]]] = {}
        self._reading: dict[str, _Reading] = {}
        self._slots = asyncio.Semaphore(FENCING_AT_ONCE)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        try:
            while not (stop is not None and stop.is_set()):
                restoring = self._restoring()
                for task_id in dropped(restoring, self._stores_read()):
                    self._leave(task_id)
                for task_id in joining(restoring, self._stores_read(), self._fencing):
                    self._fence(task_id, restoring[task_id])
                self._start_reading()
                if not self._fencing and not self._reading:
                    return
                if await self._hand_over_restored():
                    continue  # the thread's tasks may have changed meanwhile
                await self._wait()
        finally:
            for _, fence in self._fencing.values():
                fence.cancel()
            for task_id in list(self._reading):
                self._leave(task_id)

    def _stores_read(self) -> dict[str, Stores]:
        return {t: reading.stores for t, reading in self._reading.items()}

    def _fence(self, task_id: str, stores: Stores) -> None:
        self._fencing[task_id] = (stores, asyncio.ensure_future(self._fenced(task_id)))

    async def _fenced(self, task_id: str) -> None:
        if self._before_restore is not None:
            async with self._slots:
                await self._before_restore(task_id)

    def _start_reading(self) -> None:
        """Register the stores of the tasks whose ``before_restore`` finished and that still
        restore the same stores; a fencing error of a task still restoring ends the pass."""
        now = time.monotonic()
        for task_id, (stores, fence) in list(self._fencing.items()):
            if not fence.done():
                continue
            del self._fencing[task_id]
            if self._restoring().get(task_id) is not stores:
                if not fence.cancelled() and fence.exception() is not None:
                    log.info("%s: before_restore failed after it was revoked: %s", task_id,
                             fence.exception())
                continue  # revoked meanwhile
            fence.result()
            for store in stores.values():
                self._reader.register(store)
            self._reading[task_id] = _Reading(stores, now)

    def _lags(self) -> dict[str, list[int | None]]:
        return {t: [self._reader.lag(store) for store in reading.stores.values()
                    if store.changelog_topic is not None]
                for t, reading in self._reading.items()}

    async def _hand_over_restored(self) -> bool:
        """Hand over the tasks whose stores are all read to their end. Their figures are
        taken, and their stores let go, before the first hand-over: each one awaits the
        thread (the task's offsets), which says nothing of how long its restoration took."""
        now = time.monotonic()
        done: list[tuple[str, Stores, Restoration]] = []
        for task_id in restored(self._lags()):
            reading = self._reading[task_id]
            records = size = 0
            for store in reading.stores.values():
                read = self._reader.read_since_registered(store)
                records, size = records + read.records, size + read.bytes
            self._leave(task_id)
            done.append((task_id, reading.stores,
                         Restoration(records, size, now - reading.started)))
        for task_id, stores, restoration in done:
            if self._restoring().get(task_id) is stores:  # else revoked meanwhile
                await self._hand_over(task_id, stores, restoration)
        return bool(done)

    def _leave(self, task_id: str) -> None:
        reading = self._reading.pop(task_id, None)
        if reading is not None:
            for store in reading.stores.values():
                self._reader.unregister(store)

    async def _wait(self) -> None:
        """Until the reader's next fetch is applied, or a fencing step ends (at most
        ``POLL_MS``)."""
        if self._reading:
            await self._reader.poll(timeout_ms=POLL_MS)
        elif self._fencing:
            await asyncio.wait([fence for _, fence in self._fencing.values()],
                               timeout=POLL_MS / 1000, return_when=asyncio.FIRST_COMPLETED)
