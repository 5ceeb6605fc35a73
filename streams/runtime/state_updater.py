"""The state updater: restores the stores of new actives before they run, and keeps standby
and learner copies following their changelogs, reporting their lag.

Two changelog readers (:class:`statestore.restore.ChangelogReader`) do the fetching: one
restores actives (all of them together, each handed to the thread once its own changelogs
are read to their end, see :mod:`streams.runtime.active_restoration`), one follows every
copy. A
learner at or under ``acceptable_lag`` is ready; when the thread asks for a rebalance for its
ready learners is :func:`streams.group.learner_readiness.asks_now`'s decision (``learner_rejoin``:
at once, once all of them are ready, or batched with the group's other learners).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from statestore.store import KeyValueStore
from streams.group.group_learning import GroupLearning, LagLows
from streams.group.learner_readiness import LearnerView, asks_now, asks_promotion
from streams.group.slow_restores import RestoreWatch
from streams.group.warm_up import catches_up_within
from streams.metrics import Metrics
from streams.runtime.active_restoration import Restoration, RestorePass, Stores
from streams.runtime.tasks import Tasks
from streams.runtime.transitions import Role

log = logging.getLogger(__name__)

#: The lag reported for a copy whose changelog end is not known yet.
UNKNOWN_LAG = 2**31 - 1
#: How often the copies' lag and restoration rate are recorded.
COPY_METRICS_INTERVAL_S = 1.0


@dataclass
class _CatchUp:
    """A copy on its way to its changelog's end: since when, and what it read so far."""

    started: float
    records: int = 0
    size_bytes: float = 0.0


class RestoredTasks(Protocol):
    async def start_restored(self, task_id: str, stores: dict[str, KeyValueStore]) -> None: ...


class ReadyLearners(Protocol):
    def learners_ready(self, task_ids: list[str]) -> None: ...


class SlowRestores(Protocol):
    def restores_slow(self, task_ids: list[str]) -> None: ...

    def join_round_s(self) -> float | None: ...


class StateUpdater:
    def report_to(self, restored: RestoredTasks, ready: ReadyLearners,
                  slow: SlowRestores | None = None) -> None:
        """Who hears that a new active's state is restored (it may run), that learners
        are ready (a round may promote them) and that an active's restore is slow (a round may
        hand it to a caught-up copy elsewhere)."""
        self._on_restored = restored.start_restored
        self._on_learners_ready = ready.learners_ready
        self._slow_restores_to = slow

    def __init__(
        self,
        restorer: Any,
        follower: Any,
        tasks: Tasks,
        *,
        commit_interval_ms: int,
        acceptable_lag: int,
        learner_rejoin: str,
        on_restored: Callable[[str, dict[str, KeyValueStore]], Awaitable[None]] | None = None,
        on_learners_ready: Callable[[list[str]], None] | None = None,
        metrics: Metrics | None = None,
        metrics_label: str = "",
        before_restore: Callable[[str], Awaitable[Any]] | None = None,
        learner_batch_wait_ms: int = 30_000,
        group_learning: GroupLearning | None = None,
        member: str = "",
    ) -> None:
        self.restorer = restorer
        self._before_restore = before_restore
        self.follower = follower
        self._tasks = tasks
        self._commit_interval_s = commit_interval_ms / 1000
        self._acceptable_lag = acceptable_lag
        self._learner_rejoin = learner_rejoin
        self._on_restored = on_restored
        self._on_learners_ready = on_learners_ready
        self._wakeup = asyncio.Event()
        #: One restoration at a time: a task's start awaits its offsets while it is still
        #: listed as restoring, and must not be restored twice meanwhile.
        self._restoring = asyncio.Lock()
        self._batch_wait_s = learner_batch_wait_ms / 1000
        #: Ready learners this thread asked a round for.
        self._ready_reported: set[str] = set()
        #: Ready learners -> since when (monotonic) they are ready as learners.
        self._ready_since: dict[str, float] = {}
        #: From the last assignment: the group's learner copies, and this thread's learners
        #: it promoted (copies until the next round).
        self._group_learners = 0
        self._promoted: frozenset[str] = frozenset()
        #: The other members' learners, from their status records (None: not known), and
        #: this thread's place in the group: its status key, its round and the round's size.
        self._group_learning = group_learning
        self._member = member
        self._generation = -1
        self._group_size = 0
        #: When this thread's learners' lags last reached a new low (monotonic).
        self._lows = LagLows()
        #: The group's learners the ready ones wait for (logged when it changes).
        self._waiting_for: frozenset[str] = frozenset()
        self._metrics = metrics
        self._label = metrics_label
        #: Per copy: changelog records it had read at the last sample, and when.
        self._read_at: dict[str, tuple[int, float]] = {}
        #: Copies that have not reached their changelog's end yet since they were placed.
        self._catching_up: dict[str, _CatchUp] = {}
        #: Warmed-up learners expected to catch up while the first round runs (warm_up).
        self._ready_by_assignment: frozenset[str] = frozenset()
        #: Restoring actives, and those whose restore is slow enough to hand over.
        self._restore_watch = RestoreWatch()
        self._slow_restores_to: SlowRestores | None = None

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

    def follow(self, stores: dict[str, KeyValueStore], task_id: str | None = None) -> None:
        for store in stores.values():
            self.follower.register(store)
        if task_id is not None and self._metrics is not None:
            self._catching_up[task_id] = _CatchUp(time.monotonic())

    def unfollow(self, task_id: str, stores: dict[str, KeyValueStore]) -> None:
        self._ready_reported.discard(task_id)
        self._ready_since.pop(task_id, None)
        self._catching_up.pop(task_id, None)
        for store in stores.values():
            self.follower.unregister(store)

    def cancel_restore(self, stores: dict[str, KeyValueStore]) -> None:
        for store in stores.values():
            self.restorer.unregister(store)

    def copy_lag(self, task_id: str) -> int:
        """The largest lag of the copy's stores (unknown counts as very large, as does a
        deferred copy's, whose stores are not open yet)."""
        stores = self._tasks.copies.get(task_id)
        if stores is None:
            return UNKNOWN_LAG
        lags = [self.follower.lag(store) for store in stores.values()]
        if any(lag is None for lag in lags):
            return UNKNOWN_LAG
        return max((lag for lag in lags if lag is not None), default=0)

    def lags(self, role: Role) -> dict[str, int]:
        return {t: self.copy_lag(t) for t in self._tasks.copies_with(role)}

    def restoring_lags(self) -> dict[str, int]:
        """Per restoring active whose changelog ends are known: the records it has left to
        restore (the ends come from the fetch high watermark). A task queued behind another
        one's restoration has no known end yet and is left out."""
        lags: dict[str, int] = {}
        for task_id, stores in self._tasks.restoring.items():
            each = [self.restorer.lag(store) for store in stores.values()
                    if store.changelog_topic is not None]
            if all(lag is not None for lag in each):
                lags[task_id] = sum(lag for lag in each if lag is not None)
        return lags

    def slow_restores(self) -> dict[str, int]:
        """Restoring actives judged slow (:mod:`streams.group.slow_restores`), with the
        records each has left: what this thread's subscription asks the leader to hand over."""
        if not self._restore_watch.slow:
            return {}
        return self._restore_watch.slow_lags(self.restoring_lags())

    def check_slow_restores(self, now: float | None = None) -> None:
        """Judge the restoring actives, and tell the thread of restores newly found slow
        (called after every poll of the copies)."""
        told = self._slow_restores_to
        if told is None or not (self._tasks.restoring or self._restore_watch.started):
            return
        now = time.monotonic() if now is None else now
        newly = self._restore_watch.judge(self.restoring_lags(), now, told.join_round_s(),
                                          self._acceptable_lag)
        if newly:
            told.restores_slow(newly)

    def record_copies(self, now: float | None = None) -> None:
        """Each copy's changelog lag and the pace it restores at since the last sample."""
        if self._metrics is None:
            return
        now = time.monotonic() if now is None else now
        read_at: dict[str, tuple[int, float]] = {}
        for task_id, role in self._tasks.copy_roles.items():
            lag = self.copy_lag(task_id)
            if lag != UNKNOWN_LAG:
                self._metrics.set_copy_lag(self._label, task_id, role.value, lag)
            read = sum(self.follower.read_position(store)
                       for store in self._tasks.copies[task_id].values())
            read_at[task_id] = (read, now)
            before = self._read_at.get(task_id)
            if before is not None and now > before[1]:
                rate = max(0, read - before[0]) / (now - before[1])
                self._metrics.set_restore_rate(self._label, task_id, role.value, rate)
        self._read_at = read_at

    def assignment_changed(self) -> None:
        """Forget ready reports of copies that are gone, and look for new actives."""
        self._ready_reported &= set(self._tasks.copy_roles)
        # Said of the first round only: later rounds judge the copies by their lags.
        self._ready_by_assignment = frozenset()
        self._wakeup.set()

    def learners_assigned(self, group_learners: int, promoted: frozenset[str],
                          generation: int = -1, group_size: int = 0) -> None:
        """What the last assignment says of learners beyond this thread's list: how many the
        group holds, and which of this thread's were promoted; and the round it came from
        (its generation and how many members it had)."""
        self._group_learners = group_learners
        self._promoted = promoted
        self._generation = generation
        self._group_size = group_size

    def _learning(self) -> frozenset[str]:
        return frozenset(self._tasks.copies_with(Role.LEARNER)) - self._promoted

    def asks_promotion(self, promoted: frozenset[str] | None = None) -> bool:
        """Whether this thread's subscription asks the round to promote ready learners
        (``promoted``: what the last assignment received promoted, if it is newer than the
        one applied)."""
        promoted = self._promoted if promoted is None else promoted
        held = frozenset(self._tasks.copies_with(Role.LEARNER))
        return asks_promotion(frozenset(self._ready_reported), held, promoted)

    async def warm_up(self, task_ids: Iterable[str], deadline: float, stop: asyncio.Event,
                      join_lead_s: float = 0.0) -> frozenset[str]:
        """Before the thread joins: follow these learner copies until every one is within
        the acceptable lag, ``deadline`` (monotonic) passes or ``stop`` is set. Returns the
        caught-up ones, marked as asked for: the first subscription asks the round to
        promote them, and no ask for a round follows (:mod:`streams.group.warm_up`).

        ``join_lead_s``: how long a join round takes the group. Copies that, at the rate
        they have been read, will have caught up within that time count as ready too: the
        thread joins while they finish restoring, and its subscription says it expects them
        ready by the time the round's assignment arrives (``ready_by_assignment``). The
        restore and the round then overlap instead of following each other."""
        wanted = frozenset(task_ids)
        started = time.monotonic()
        read_at_start = sum(self._read(t) for t in wanted)

        def ready() -> frozenset[str]:
            return frozenset(t for t in wanted if self.copy_lag(t) <= self._acceptable_lag)

        def due_within_lead() -> bool:
            return join_lead_s > 0 and catches_up_within(
                join_lead_s, time.monotonic() - started,
                sum(self._read(t) for t in wanted) - read_at_start,
                sum(self.copy_lag(t) for t in wanted - ready()))

        projected = False
        while ready() != wanted and time.monotonic() < deadline and not stop.is_set():
            if due_within_lead():
                projected = True
                break
            before = self._catch_up_positions()
            await self.follower.poll(timeout_ms=200)
            self._caught_up(before)
        caught_up = ready()
        if projected:
            self._ready_by_assignment = wanted - caught_up
            caught_up = wanted
        self._ready_reported |= caught_up
        now = time.monotonic()
        self._ready_since.update({t: now for t in caught_up})
        return caught_up

    def ready_by_assignment(self) -> frozenset[str]:
        """Warmed-up learners not caught up yet that the thread expects to be by the time
        its first round's assignment arrives (what its subscription says of them)."""
        return self._ready_by_assignment & self._learning()

    def asked_learners(self) -> frozenset[str]:
        """The ready learners this thread asks the next round to promote (what its
        subscription's ``asks_promotion`` is about)."""
        return frozenset(self._ready_reported) & self._learning()

    def check_learners_ready(self, now: float | None = None) -> None:
        """Tell the thread to ask for a round when the policy says so (called after every
        poll of the copies, so that a wait runs out within a poll)."""
        now = time.monotonic() if now is None else now
        lags = self.learning_lags()
        learners = frozenset(lags)
        ready = frozenset(t for t, lag in lags.items() if lag <= self._acceptable_lag)
        self._ready_since = {t: self._ready_since.get(t, now) for t in ready}
        unasked = {t: since for t, since in self._ready_since.items()
                   if t not in self._ready_reported}
        self._lows.update(lags, now)
        catching_up = self._group_catching_up(learners - ready) if unasked else None
        view = LearnerView(learners, ready, unasked, self._group_learners, catching_up)
        if asks_now(self._learner_rejoin, view, now, self._batch_wait_s):
            self._ready_reported |= ready
            self._waiting_for = frozenset()
            if self._on_learners_ready is not None:
                self._on_learners_ready(sorted(unasked))
        elif catching_up and frozenset(catching_up) != self._waiting_for:
            self._waiting_for = frozenset(catching_up)
            log.info("%s: ready learners %s wait for the group's learners still catching up: "
                     "%s", self._label, sorted(unasked), sorted(catching_up))

    def learning_lags(self) -> dict[str, int]:
        """This thread's learners it is still learning (not the ones its last round
        promoted) -> lag: what its status record tells the other members."""
        return {t: self.copy_lag(t) for t in self._learning()}

    def _group_catching_up(self, behind: frozenset[str]) -> dict[str, float] | None:
        """The group's learners not ready yet -> when each last reached a new low, this
        thread's (``behind``) with the other members'; None when those are not known."""
        if self._learner_rejoin != "batched" or self._group_learning is None:
            return None
        others = self._group_learning.catching_up(
            self._member, self._generation, self._group_size, int(time.time() * 1000))
        if others is None:
            return None
        return {**others, **{t: self._lows.since(t) for t in behind}}

    # -- loops -----------------------------------------------------------------------------

    async def restore_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._wakeup.wait()
            self._wakeup.clear()
            await self.restore_pending(stop)

    async def restore_pending(self, stop: asyncio.Event | None = None) -> None:
        """Restore the restoring actives together, and hand each to the thread to run as
        soon as its own stores are restored (:class:`RestorePass`). ``before_restore`` runs
        first for each (exactly-once: it fences the task's previous owner, so the
        changelog's end cannot move after it)."""
        async with self._restoring:
            await RestorePass(self.restorer, lambda: self._tasks.restoring,
                              self._before_restore, self._restored).run(stop)

    async def _restored(self, task_id: str, stores: Stores, done: Restoration) -> None:
        log.info("%s: task %s restored: %d records, %.1f MB in %.2fs", self._label, task_id,
                 done.records, done.bytes / 1e6, done.seconds)
        if self._metrics is not None:
            self._metrics.finished_restoration(self._label, task_id, done.records,
                                               done.seconds, done.bytes)
        # The callback checks the task is still restoring these very stores: it may have
        # been revoked meanwhile.
        if self._on_restored is not None:
            await self._on_restored(task_id, stores)

    async def follow_loop(self, stop: asyncio.Event, on_poll: Callable[[], None]) -> None:
        last_checkpoint = last_sample = time.monotonic()
        while not stop.is_set():
            self.check_slow_restores()
            if not self._tasks.copies:
                await asyncio.sleep(0.1)
                continue
            before = self._catch_up_positions()
            await self.follower.poll(timeout_ms=200)
            self._caught_up(before)
            self.check_learners_ready()
            if time.monotonic() - last_sample >= COPY_METRICS_INTERVAL_S:
                last_sample = time.monotonic()
                self.record_copies(last_sample)
            if time.monotonic() - last_checkpoint > self._commit_interval_s:
                last_checkpoint = time.monotonic()
                for stores in self._tasks.copies.values():
                    for store in stores.values():
                        store.commit()
            on_poll()

    def _read(self, task_id: str) -> int:
        return sum(self.follower.read_position(store)
                   for store in self._tasks.copies.get(task_id, {}).values())

    def _catch_up_positions(self) -> tuple[int, dict[str, int]]:
        """Before a poll: the follower's bytes read, and each catching-up copy's position."""
        if not self._catching_up:
            return 0, {}
        return int(self.follower.stats.bytes), {t: self._read(t) for t in self._catching_up}

    def _caught_up(self, before: tuple[int, dict[str, int]]) -> None:
        """After a poll: add what each catching-up copy read, and record the restorations of
        those that reached their changelog's end. The reader counts bytes per fetch, not per
        store: a fetch's bytes are shared among the copies it served by their records."""
        bytes_before, positions = before
        if not positions or self._metrics is None:
            return
        read = {t: max(0, self._read(t) - p) for t, p in positions.items()
                if t in self._catching_up}
        fetched = max(0, int(self.follower.stats.bytes) - bytes_before)
        records = sum(read.values())
        now = time.monotonic()
        for task_id, n in read.items():
            catch_up = self._catching_up[task_id]
            catch_up.records += n
            if records:
                catch_up.size_bytes += fetched * n / records
            if self.copy_lag(task_id) == 0:
                del self._catching_up[task_id]
                self._metrics.finished_restoration(
                    self._label, task_id, catch_up.records, now - catch_up.started,
                    round(catch_up.size_bytes))

    def stopping(self) -> None:
        self._wakeup.set()
