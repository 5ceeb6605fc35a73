"""Opening a store that bootstraps from its snapshot (which loads files and may write its
changelog: seconds to minutes) runs off the event loop, so that the loop keeps heartbeating
and running the process's other threads meanwhile.

The bootstrap is replaced by a fake that finishes only once the event loop has ticked while
it runs: run on the loop, it could not, and the assignment would fail."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from assignor import parse_task_id
from statestore import recovery
from statestore.errors import StoreLockedError
from statestore.snapshot import SnapshotRef
from statestore.store import KeyValueStore, StoreSpec, changelog_topic_name, store_directory
from tests.unit.streams.fakes import Rig, assign, rig

pytestmark = pytest.mark.asyncio

#: How many loop ticks a bootstrap waits for; how long before it gives up.
TICKS, GIVE_UP_S = 3, 20.0


class LoopTicks:
    """Counts the event loop's turns; worker threads can wait for a count."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = threading.Condition()

    async def run(self) -> None:
        while True:
            with self._changed:
                self.count += 1
                self._changed.notify_all()
            await asyncio.sleep(0.001)

    def wait_for(self, count: int, timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.count >= count, timeout_s)


class SlowBootstrap:
    """Stands in for :func:`statestore.recovery.bootstrap_from_snapshot`."""

    def __init__(self, ticks: LoopTicks, failing: frozenset[str] = frozenset()) -> None:
        self.ticks = ticks
        self.failing = failing
        #: (task, store, ticks of the loop while it ran) per bootstrap.
        self.done: list[tuple[str, str, int]] = []

    def __call__(self, store: KeyValueStore, ref: SnapshotRef) -> bool:
        before = self.ticks.count
        if not self.ticks.wait_for(before + TICKS, GIVE_UP_S):
            raise AssertionError("the event loop did not turn while a snapshot bootstrap ran")
        if ref.task in self.failing:
            raise OSError(f"cannot read the snapshot of {ref.task}")
        self.done.append((ref.task, store.name, self.ticks.count - before))
        return True


@pytest.fixture
def ticks() -> Iterator[LoopTicks]:
    yield LoopTicks()


@contextlib.asynccontextmanager
async def ticking(ticks: LoopTicks, *rigs: Rig) -> AsyncIterator[None]:
    """The loop counted while the block runs; the rigs' tasks closed after it."""
    counter = asyncio.create_task(ticks.run())
    try:
        yield
    finally:
        counter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await counter
        for r in rigs:
            r.thread.task_manager.close_all()


def lock_is_free(state_dir: Path, task_id: str) -> bool:
    try:
        KeyValueStore(StoreSpec("counts"), store_directory(state_dir, "unit", task_id, "counts"),
                      changelog_topic_name("unit", "counts"),
                      parse_task_id(task_id)[1]).open().close()
    except StoreLockedError:
        return False
    return True


async def test_the_loop_turns_while_stores_bootstrap_from_their_snapshots(
    tmp_path: Path, ticks: LoopTicks, monkeypatch: pytest.MonkeyPatch,
) -> None:
    bootstrap = SlowBootstrap(ticks)
    monkeypatch.setattr(recovery, "bootstrap_from_snapshot", bootstrap)
    r = rig(tmp_path / "state", snapshot_dir=tmp_path / "snapshots")
    async with ticking(ticks, r):
        await assign(r, ("0_0",), learners=("0_1",), standbys=("0_2",))
        assert sorted(task for task, _store, _ticks in bootstrap.done) == ["0_0", "0_1", "0_2"]
        assert all(n >= TICKS for _task, _store, n in bootstrap.done)
        assert list(r.thread.tasks) == ["0_0"]
        assert list(r.thread.learners) == ["0_1"] and list(r.thread.standbys) == ["0_2"]
        # A later assignment opens only what is new to it.
        await assign(r, ("0_0", "0_3"), learners=("0_1",))
        assert [task for task, _store, _ticks in bootstrap.done][3:] == ["0_3"]
        assert sorted(r.thread.tasks) == ["0_0", "0_3"]


async def test_a_bootstrap_that_fails_leaves_no_store_open(
    tmp_path: Path, ticks: LoopTicks, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recovery, "bootstrap_from_snapshot",
                        SlowBootstrap(ticks, failing=frozenset({"0_1"})))
    r = rig(tmp_path / "state", snapshot_dir=tmp_path / "snapshots")
    async with ticking(ticks, r):
        await assign(r, ("0_0", "0_1"))
        assert r.thread.tasks == {} and r.thread.restoring == []
        # 0_0 opened fine before 0_1 failed: closed again, its lock free.
        assert lock_is_free(tmp_path / "state", "0_0")
        assert lock_is_free(tmp_path / "state", "0_1")
