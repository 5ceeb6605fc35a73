"""The state updater restores its new actives together (no broker): one round of end-offset
discovery serves every task, each task runs as soon as its own changelogs are read, a task
revoked meanwhile leaves the pass, and exactly-once fencing still comes before any read."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from statestore.restore import RestoreStats
from streams.runtime.active_restoration import dropped, joining, restored
from streams.runtime.state_updater import StateUpdater
from streams.runtime.tasks import Tasks
from tests.conftest import wait_until
from tests.unit.streams.fakes import FakeChangelogReader

#: Bytes per changelog record, in the scripted reader.
RECORD_BYTES = 10


@dataclass(eq=False)
class _Store:
    partition: int
    changelog_topic: str | None = "app-counts-changelog"
    name: str = "counts"
    position: int = 0


@dataclass
class _ScriptedReader:
    """A changelog reader whose every poll is one round trip: it learns the ends of the
    stores registered before it and reads up to ``per_poll`` records of each. ``ends``:
    partition -> changelog end."""

    ends: dict[int, int]
    per_poll: int = 100
    on_poll: Callable[[int], None] | None = None
    events: list[str] = field(default_factory=list)
    polls: int = 0
    registered: list[_Store] = field(default_factory=list)
    _answered: set[int] = field(default_factory=set)
    _read: dict[int, int] = field(default_factory=dict)
    stats: RestoreStats = field(default_factory=RestoreStats)

    def register(self, store: _Store) -> None:
        if store.changelog_topic is None:
            return
        self.events.append(f"read {store.partition}")
        self.registered.append(store)
        self._answered.discard(id(store))
        self._read[id(store)] = 0

    def unregister(self, store: _Store) -> None:
        if store in self.registered:
            self.registered.remove(store)

    def is_registered(self, store: _Store) -> bool:
        return store in self.registered

    def lag(self, store: _Store) -> int | None:
        if store not in self.registered or id(store) not in self._answered:
            return None
        return self.ends[store.partition] - store.position

    def caught_up(self, store: _Store) -> bool:
        return self.lag(store) == 0

    def read_since_registered(self, store: _Store) -> RestoreStats:
        read = self._read.get(id(store), 0) if store in self.registered else 0
        return RestoreStats(read, read * RECORD_BYTES)

    async def poll(self, timeout_ms: int = 200) -> int:
        self.polls += 1
        if self.on_poll is not None:
            self.on_poll(self.polls)
        await asyncio.sleep(0)
        applied = 0
        for store in list(self.registered):
            n = min(self.per_poll, self.ends[store.partition] - store.position)
            store.position += n
            self._read[id(store)] += n
            self._answered.add(id(store))
            applied += n
        return applied

    async def restore(self, stores: list[_Store], **kwargs: Any) -> RestoreStats:
        """As the real reader's: register, poll until caught up, unregister."""
        stores = [s for s in stores if s.changelog_topic is not None]
        for store in stores:
            self.register(store)
        read = RestoreStats()
        while not all(self.caught_up(s) for s in stores if self.is_registered(s)):
            read.records += await self.poll()
        for store in stores:
            self.unregister(store)
        read.bytes = read.records * RECORD_BYTES
        return read


@dataclass
class _Restorations:
    """The metrics' view of finished restorations: task -> (records, bytes)."""

    finished: dict[str, tuple[int, int]] = field(default_factory=dict)

    def finished_restoration(self, thread: str, task: str, records: int, seconds: float,
                             size_bytes: int) -> None:
        self.finished[task] = (records, size_bytes)


def _updater(reader: _ScriptedReader, tasks: Tasks, handed: list[str], **extra: Any
             ) -> StateUpdater:
    async def on_restored(task_id: str, stores: dict[str, Any]) -> None:
        if tasks.restoring.get(task_id) is stores:
            tasks.remove_restoring(task_id)
        handed.append(task_id)

    return StateUpdater(reader, FakeChangelogReader(), tasks, commit_interval_ms=1000,
                        acceptable_lag=10, learner_rejoin="eager", on_restored=on_restored,
                        **extra)


async def test_tasks_with_nothing_to_restore_are_handed_over_after_one_round_of_ends() -> None:
    reader = _ScriptedReader({p: 0 for p in range(8)})
    tasks, handed = Tasks(), []
    updater = _updater(reader, tasks, handed)
    for p in range(8):
        tasks.add_restoring(f"0_{p}", {"counts": _Store(p)})  # type: ignore[dict-item]
    await asyncio.wait_for(updater.restore_pending(), 5)
    assert handed == [f"0_{p}" for p in range(8)]
    assert reader.polls == 1  # one at a time took one round trip per task
    assert reader.registered == []


async def test_a_small_task_runs_before_a_big_one_is_restored_and_each_has_its_figures() -> None:
    reader = _ScriptedReader({0: 1000, 1: 10}, per_poll=100)
    tasks, handed, metrics = Tasks(), [], _Restorations()
    big, small = _Store(0), _Store(1)
    big_lag_when_small_ran: list[int | None] = []
    updater = _updater(reader, tasks, handed, metrics=metrics, metrics_label="t")
    hand_over = updater._on_restored
    assert hand_over is not None

    async def on_restored(task_id: str, stores: dict[str, Any]) -> None:
        if task_id == "0_1":
            big_lag_when_small_ran.append(reader.lag(big))
        await hand_over(task_id, stores)

    updater._on_restored = on_restored
    tasks.add_restoring("0_0", {"counts": big})  # type: ignore[dict-item]
    tasks.add_restoring("0_1", {"counts": small})  # type: ignore[dict-item]
    await asyncio.wait_for(updater.restore_pending(), 5)
    assert handed == ["0_1", "0_0"]
    assert big_lag_when_small_ran == [900]  # after the first round trip
    assert metrics.finished == {"0_0": (1000, 1000 * RECORD_BYTES),
                                "0_1": (10, 10 * RECORD_BYTES)}


async def test_a_task_revoked_while_it_restores_is_not_handed_over_and_not_read() -> None:
    tasks, handed = Tasks(), []
    revoked = {"counts": _Store(0)}
    kept = {"counts": _Store(1)}
    updater: StateUpdater

    def revoke_on_third_poll(polls: int) -> None:
        if polls == 3:  # as the task manager does on revocation
            tasks.remove_restoring("0_0")
            updater.cancel_restore(revoked)  # type: ignore[arg-type]

    reader = _ScriptedReader({0: 1000, 1: 1000}, per_poll=100, on_poll=revoke_on_third_poll)
    updater = _updater(reader, tasks, handed)
    tasks.add_restoring("0_0", revoked)  # type: ignore[arg-type]
    tasks.add_restoring("0_1", kept)  # type: ignore[arg-type]
    await asyncio.wait_for(updater.restore_pending(), 5)
    assert handed == ["0_1"]
    assert reader.registered == []
    assert revoked["counts"].position < 1000


async def test_a_task_revoked_while_it_is_fenced_is_never_read() -> None:
    reader = _ScriptedReader({0: 5, 1: 5})
    tasks, handed = Tasks(), []
    release = asyncio.Event()

    async def fence(task_id: str) -> None:
        if task_id == "0_0":
            await release.wait()

    updater = _updater(reader, tasks, handed, before_restore=fence)
    tasks.add_restoring("0_0", {"counts": _Store(0)})  # type: ignore[dict-item]
    tasks.add_restoring("0_1", {"counts": _Store(1)})  # type: ignore[dict-item]
    restoring = asyncio.create_task(updater.restore_pending())
    await wait_until(lambda: handed == ["0_1"], timeout_s=5, message="0_1 handed over")
    tasks.remove_restoring("0_0")
    release.set()
    await asyncio.wait_for(restoring, 5)
    assert handed == ["0_1"]
    assert reader.events == ["read 1"]


async def test_fencing_runs_beside_the_others_and_precedes_every_read_of_its_task() -> None:
    """Exactly-once: a task's changelog is read only once its previous owner is fenced (its
    end cannot move after that); a slow fencing holds no other task back."""
    reader = _ScriptedReader({0: 5, 1: 5, 2: 5})
    tasks, handed = Tasks(), []
    release = asyncio.Event()

    async def fence(task_id: str) -> None:
        reader.events.append(f"fence {task_id}")
        if task_id == "0_0":
            await release.wait()
        reader.events.append(f"fenced {task_id}")

    updater = _updater(reader, tasks, handed, before_restore=fence)
    for p in range(3):
        tasks.add_restoring(f"0_{p}", {"counts": _Store(p)})  # type: ignore[dict-item]
    restoring = asyncio.create_task(updater.restore_pending())
    await wait_until(lambda: sorted(handed) == ["0_1", "0_2"], timeout_s=5,
                     message="the tasks fenced at once handed over")
    assert "read 0" not in reader.events
    release.set()
    await asyncio.wait_for(restoring, 5)
    assert handed[-1] == "0_0"
    for p in range(3):
        assert reader.events.index(f"fenced 0_{p}") < reader.events.index(f"read {p}")


async def test_a_task_assigned_while_a_pass_runs_joins_it() -> None:
    tasks, handed = Tasks(), []
    late = {"counts": _Store(1)}

    def assign_on_second_poll(polls: int) -> None:
        if polls == 2:
            tasks.add_restoring("0_1", late)  # type: ignore[arg-type]

    reader = _ScriptedReader({0: 1000, 1: 0}, per_poll=100, on_poll=assign_on_second_poll)
    updater = _updater(reader, tasks, handed)
    tasks.add_restoring("0_0", {"counts": _Store(0)})  # type: ignore[dict-item]
    await asyncio.wait_for(updater.restore_pending(), 5)
    assert handed == ["0_1", "0_0"]


def test_the_decisions() -> None:
    a, b, c = {"s": _Store(0)}, {"s": _Store(1)}, {"s": _Store(2, changelog_topic=None)}
    restoring: dict[str, Any] = {"0_0": a, "0_1": b, "1_0": c}
    # No changelog first; a task still being fenced, or already read, does not join again.
    assert joining(restoring, {}, ()) == ["1_0", "0_0", "0_1"]
    assert joining(restoring, {"0_0": a}, {"0_1"}) == ["1_0"]
    # Revoked, or assigned again with other stores: it leaves the pass (and joins again).
    again = {"s": _Store(1)}
    assert dropped({**restoring, "0_1": again}, {"0_0": a, "0_1": b, "0_2": b}) == [
        "0_1", "0_2"]
    assert joining({"0_1": again}, {"0_1": b}, ()) == ["0_1"]
    # An unknown end is not reached; no changelog is restored at once, and goes first.
    assert restored({"0_0": [0, 0], "0_1": [0, None], "0_2": [3], "1_0": []}) == [
        "1_0", "0_0"]
