"""The state updater: restores the stores of new actives before they run, and keeps standby
and learner copies following their changelogs, reporting their lag.

Two changelog readers (:class:`statestore.restore.ChangelogReader`) do the fetching: one
restores actives (one task at a time, to its changelog's end), one follows every copy. A
learner at or under ``acceptable_lag`` is ready: the thread is told, and asks for a
rebalance at once (``learner_rejoin="eager"``) or once all its learners are ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from statestore.store import KeyValueStore
from streams.tasks import Tasks
from streams.transitions import Role

#: The lag reported for a copy whose changelog end is not known yet.
UNKNOWN_LAG = 2**31 - 1


class StateUpdater:
    def __init__(
        self,
        restorer: Any,
        follower: Any,
        tasks: Tasks,
        *,
        commit_interval_ms: int,
        acceptable_lag: int,
        learner_rejoin: str,
        on_restored: Callable[[str, dict[str, KeyValueStore]], Awaitable[None]],
        on_learners_ready: Callable[[list[str]], None],
    ) -> None:
        self.restorer = restorer
        self.follower = follower
        self._tasks = tasks
        self._commit_interval_s = commit_interval_ms / 1000
        self._acceptable_lag = acceptable_lag
        self._learner_rejoin = learner_rejoin
        self._on_restored = on_restored
        self._on_learners_ready = on_learners_ready
        self._wakeup = asyncio.Event()
        self._ready_reported: set[str] = set()

    async def start(self) -> None:
        await self.follower.start()
        await self.restorer.start()

    async def stop(self) -> None:
        for reader in (self.follower, self.restorer):
            with contextlib.suppress(Exception):
                await reader.stop()

    @property
    def restored_records(self) -> int:
        return int(self.restorer.stats.records + self.follower.stats.records)

    # -- copies ----------------------------------------------------------------------------

    def follow(self, stores: dict[str, KeyValueStore]) -> None:
        for store in stores.values():
            self.follower.register(store)

    def unfollow(self, task_id: str, stores: dict[str, KeyValueStore]) -> None:
        self._ready_reported.discard(task_id)
        for store in stores.values():
            self.follower.unregister(store)

    def cancel_restore(self, stores: dict[str, KeyValueStore]) -> None:
        for store in stores.values():
            self.restorer.unregister(store)

    def copy_lag(self, task_id: str) -> int:
        """The largest lag of the copy's stores (unknown counts as very large)."""
        lags = [self.follower.lag(store) for store in self._tasks.copies.get(task_id, {}).values()]
        if any(lag is None for lag in lags):
            return UNKNOWN_LAG
        return max((lag for lag in lags if lag is not None), default=0)

    def lags(self, role: Role) -> dict[str, int]:
        return {t: self.copy_lag(t) for t in self._tasks.copies_with(role)}

    def assignment_changed(self) -> None:
        """Forget ready reports of copies that are gone, and look for new actives."""
        self._ready_reported &= set(self._tasks.copy_roles)
        self._wakeup.set()

    def check_learners_ready(self) -> None:
        learners = self._tasks.copies_with(Role.LEARNER)
        ready = {t for t in learners if self.copy_lag(t) <= self._acceptable_lag}
        newly = ready - self._ready_reported
        if not newly:
            return
        if self._learner_rejoin == "eager" or ready == set(learners):
            self._ready_reported |= ready
            self._on_learners_ready(sorted(newly))

    # -- loops -----------------------------------------------------------------------------

    async def restore_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._wakeup.wait()
            self._wakeup.clear()
            await self.restore_pending(stop)

    async def restore_pending(self, stop: asyncio.Event | None = None) -> None:
        """Restore the restoring actives one by one, each to its changelog's end, and hand
        each to the thread to run."""
        while self._tasks.restoring and not (stop is not None and stop.is_set()):
            task_id = sorted(self._tasks.restoring)[0]
            stores = self._tasks.restoring[task_id]
            await self.restorer.restore(list(stores.values()))
            # The callback checks the task is still restoring these very stores: it may have
            # been revoked meanwhile.
            await self._on_restored(task_id, stores)

    async def follow_loop(self, stop: asyncio.Event, on_poll: Callable[[], None]) -> None:
        last_checkpoint = time.monotonic()
        while not stop.is_set():
            if not self._tasks.copies:
                await asyncio.sleep(0.1)
                continue
            await self.follower.poll(timeout_ms=200)
            self.check_learners_ready()
            if time.monotonic() - last_checkpoint > self._commit_interval_s:
                last_checkpoint = time.monotonic()
                for stores in self._tasks.copies.values():
                    for store in stores.values():
                        store.commit()
            on_poll()

    def stopping(self) -> None:
        self._wakeup.set()
