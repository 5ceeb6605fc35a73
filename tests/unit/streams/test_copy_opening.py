"""Deferred copies: a round that starts actives here opens the copies it adds only once
those actives run, and a deferred copy follows the next assignment like any other."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from statestore.store import KeyValueStore
from streams.runtime.state_updater import UNKNOWN_LAG
from streams.runtime.transitions import Role
from tests.unit.streams.fakes import Rig, assign, rig

pytestmark = pytest.mark.asyncio


@contextlib.contextmanager
def recording_opens(r: Rig, events: list[str]) -> Any:
    """Record each task whose stores the thread opens, and each task it starts."""
    manager = r.thread.task_manager
    open_stores = manager._open_stores
    start_restored = manager.start_restored

    def opening(task_id: str) -> dict[str, KeyValueStore]:
        events.append(f"open {task_id}")
        return open_stores(task_id)

    async def starting(task_id: str, stores: dict[str, KeyValueStore], *args: Any) -> bool:
        started = await start_restored(task_id, stores, *args)
        if started:
            events.append(f"start {task_id}")
        return started

    manager._open_stores = opening  # type: ignore[method-assign]
    manager.start_restored = starting  # type: ignore[method-assign]
    try:
        yield
    finally:
        manager.close_all()


async def test_a_moved_active_starts_before_the_copies_its_round_adds_open(
    tmp_path: Path,
) -> None:
    """The standby 0_2 becomes active in a round that also adds a standby and a learner:
    their stores open after 0_2 runs, not before (opening them took the moved task's first
    tenths of a second)."""
    r = rig(tmp_path)
    events: list[str] = []
    with recording_opens(r, events):
        await assign(r, ("0_0",), standbys=("0_2",))
        events.clear()
        await assign(r, ("0_0", "0_2"), standbys=("0_1",), learners=("0_3",))
        assert events == ["start 0_2", "open 0_1", "open 0_3"]
        assert r.thread.standbys == {"0_1": 0} and r.thread.learners == {"0_3": 0}
        assert not r.thread.registry.deferred


async def test_copies_open_at_once_in_a_round_that_starts_nothing(tmp_path: Path) -> None:
    r = rig(tmp_path)
    events: list[str] = []
    with recording_opens(r, events):
        await assign(r, ("0_0",))
        events.clear()
        await assign(r, ("0_0",), standbys=("0_1",), restore=False)
        assert events == ["open 0_1"] and not r.thread.registry.deferred


async def test_deferred_copies_are_reported_with_an_unknown_lag(tmp_path: Path) -> None:
    """Until its stores open, a deferred copy is in the subscription, as a copy whose lag is
    not known yet (as one just opened is), not left out."""
    r = rig(tmp_path)
    with recording_opens(r, []):
        await assign(r, ("0_0",), standbys=("0_1",), learners=("0_2",), restore=False)
        assert r.thread.registry.deferred == {"0_1": Role.STANDBY, "0_2": Role.LEARNER}
        subscription = r.thread.member.subscription()
        assert subscription.standbys == {"0_1": UNKNOWN_LAG}
        assert subscription.learners == {"0_2": UNKNOWN_LAG}


async def test_a_deferred_copy_follows_the_next_assignment(tmp_path: Path) -> None:
    """Dropped before it opened, it is never opened; made active, it opens as an active."""
    r = rig(tmp_path)
    events: list[str] = []
    with recording_opens(r, events):
        await assign(r, ("0_0",), standbys=("0_1",), learners=("0_2",), restore=False)
        assert events == ["open 0_0"]
        await assign(r, ("0_0", "0_2"), restore=False)
        assert not r.thread.registry.deferred
        assert r.thread.restoring == ["0_0", "0_2"] and r.thread.standbys == {}
        await r.thread.state_updater.restore_pending()
        await r.thread.listener.copy_opener.settled()
        assert events == ["open 0_0", "open 0_2", "start 0_0", "start 0_2"]


async def test_a_closing_thread_opens_no_deferred_copy(tmp_path: Path) -> None:
    r = rig(tmp_path)
    events: list[str] = []
    with recording_opens(r, events):
        await assign(r, ("0_0",), standbys=("0_1",), restore=False)
        await r.thread.listener.close()
        r.thread.task_manager.close_all()
        assert events == ["open 0_0"] and not r.thread.registry.deferred
        assert r.thread.registry.ids() == []
