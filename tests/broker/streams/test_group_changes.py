"""The seed's harder group changes end to end on the real broker: swapping every host for a
new one online, the leader crashing while the group is scaling, and a vanished member's tasks
held back for its return (``lost_task_delay_ms``) and reassigned once the delay is over.
Counts stay exact throughout: no record lost or counted twice."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from streams.app import App
from streams.group.status_topic import read_status
from streams.runtime.thread import StreamThread
from tests.broker.streams.harness import (
    Launched,
    Watch,
    counting_app,
    counting_topics,
    exact_counts,
    published,
    run_relay,
    tasks_of,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


def holds_back(thread: StreamThread, after: int, lost: set[str]) -> bool:
    """The thread, now leading alone, assigned after ``after`` and held ``lost`` back."""
    memory = thread.assignor.memory
    return (thread.status.rebalances > after and thread.assignor.is_leader
            and memory is not None and set(memory.lost) == lost)


async def test_online_host_swap(tmp_path: Path, bootstrap: str,
                                unique: Callable[[str], str], launched: Launched) -> None:
    """Online host swapping: double the group with new instances, mark the old ones
    leaving; the new ones learn every task, take them over, and the old ones shut down."""
    app_id = unique("swap")
    source, sink, traffic = await counting_topics(bootstrap, app_id, 2000)
    launched.traffic_for(traffic)
    apps = {name: counting_app(app_id, bootstrap, tmp_path / name, source, sink)
            for name in ("old-1", "old-2", "new-1", "new-2")}
    old, new = [apps["old-1"], apps["old-2"]], [apps["new-1"], apps["new-2"]]
    runs = {name: launched.app(apps[name]) for name in ("old-1", "old-2")}
    async with Watch(*new) as watch:
        await wait_until(lambda: all(len(tasks_of(a)) == 2 for a in old), timeout_s=120,
                         message="the old instances to share the tasks")
        traffic.start()
        for name in ("new-1", "new-2"):
            runs[name] = launched.app(apps[name])
        await wait_until(lambda: all(a.threads and all(t.status.rebalances > 0 for t in a.threads)
                                         for a in new),
                         timeout_s=120, message="the new instances to join")
        # The new instances' learners may take tasks over meanwhile: the counts wanted are
        # the old instances' own at each look.
        await published(bootstrap, app_id, lambda: {f"{a.instance_id}-thread-0": len(tasks_of(a))
                                                    for a in old})
        code, out = await run_relay("mark-leaving", app_id, *(a.instance_id for a in old),
                                    bootstrap=bootstrap)
        assert code == 0, out
        await wait_until(lambda: runs["old-1"].done() and runs["old-2"].done(), timeout_s=240,
                         message="the old instances to hand over and shut down")
        for name in ("old-1", "old-2"):
            runs[name].result()  # ended cleanly, not with an error
            assert all(t.shutdown_requested for t in apps[name].threads)
        await wait_until(lambda: all(len(tasks_of(a)) == 2 for a in new), timeout_s=120,
                         message="the new instances to run two tasks each")
    # Every task the new instances took over from the old ones, they learned first.
    for app in new:
        assert tasks_of(app) <= watch.learned[id(app)]
    await traffic.stop()
    await exact_counts(bootstrap, sink, traffic.produced)


async def test_the_leader_crashes_while_the_group_scales(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], launched: Launched
) -> None:
    """Leader crash during scaling: a new member is learning when the leader dies
    (SIGKILL: no commit, no leave). A survivor becomes leader (rebuilding the memory from the
    notes members echo), and the group settles with every task running, counts exact."""
    app_id = unique("leader-crash")
    source, sink, traffic = await counting_topics(bootstrap, app_id, 5000)
    launched.traffic_for(traffic)
    workers = {name: launched.worker(app_id, bootstrap, tmp_path / name, source, sink)
               for name in ("w1", "w2")}
    newcomer = counting_app(app_id, bootstrap, tmp_path / "newcomer", source, sink)

    async def shared_by_workers() -> bool:
        status = await read_status(bootstrap, app_id)
        return (len(status) == 2 and all(len(s["active"]) == 2 for s in status.values())
                and sum(bool(s.get("leader")) for s in status.values()) == 1)

    await wait_until(shared_by_workers, timeout_s=150,
                     message="the two workers to share the tasks")
    traffic.start()
    launched.app(newcomer)
    await wait_until(
        lambda: any(t.learners for t in newcomer.threads),
        timeout_s=150, interval_s=0.02, message="the newcomer to learn a task")
    status = await read_status(bootstrap, app_id)
    leader = next(s for s in status.values() if s.get("leader"))
    victim = next(w for w in workers.values() if w.pid == leader["pid"])
    survivor = next(w for w in workers.values() if w is not victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait()

    async def settled() -> bool:
        status = await read_status(bootstrap, app_id)
        live = [s for s in status.values() if s["pid"] != victim.pid]
        running = sorted(t for s in live for t in s["active"])
        return (running == ["0_0", "0_1", "0_2", "0_3"] and len(tasks_of(newcomer)) == 2
                and any(s["pid"] == survivor.pid for s in live))

    await wait_until(settled, timeout_s=180,
                     message="the survivor and the newcomer to run two tasks each")

    async def a_survivor_leads() -> bool:
        status = await read_status(bootstrap, app_id)
        # The victim's last record (it never cleared it) still says it led.
        leaders = {s["pid"] for s in status.values()
                   if s.get("leader") and s["pid"] != victim.pid}
        return leaders in ({survivor.pid}, {os.getpid()})

    await wait_until(a_survivor_leads, timeout_s=30, message="a survivor to lead the group")
    await traffic.stop()
    await exact_counts(bootstrap, sink, traffic.produced)


@pytest.mark.parametrize("absence", ["returns", "stays away"])
async def test_lost_tasks_wait_for_their_member_then_move(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], launched: Launched,
    absence: str,
) -> None:
    """A static member that vanishes past its session timeout: the leader holds its tasks
    back for ``lost_task_delay_ms``. Returning within the delay, it gets them back (nobody
    else ran them); gone for longer, its tasks are reassigned when the delay is over.

    The member that vanishes is a follower, so the leader that holds its tasks stays the same
    (a new leader would rebuild the hold from the notes members echo). The session is shorter
    than a static restart needs: here the member is meant to be evicted."""
    app_id = unique("lost")
    source, sink, traffic = await counting_topics(bootstrap, app_id, 1000)
    launched.traffic_for(traffic)
    returns = absence == "returns"
    settings = {"lost_task_delay_ms": 45_000 if returns else 12_000,
                "session_timeout_ms": 12_000}

    def member(name: str) -> App:
        return counting_app(app_id, bootstrap, tmp_path / name, source, sink, name, **settings)

    apps = {name: member(name) for name in ("node-a", "node-b")}
    for app in apps.values():
        launched.app(app)
    async with Watch(*apps.values()) as watch:
        await wait_until(lambda: all(len(tasks_of(a)) == 2 for a in apps.values()),
                         timeout_s=150, message="the two members to share the tasks")
        traffic.start()
        leader = next(n for n, a in apps.items() if a.threads[0].assignor.is_leader)
        gone = next(n for n in apps if n != leader)
        stays, thread = apps[leader], apps[leader].threads[0]
        own, lost = tasks_of(stays), tasks_of(apps[gone])
        rebalances = thread.status.rebalances
        ran_before = set(watch.ran[id(stays)])
        # Static: no LeaveGroup; the session timeout evicts it.
        await launched.stop(apps[gone])
        await wait_until(partial(holds_back, thread, rebalances, lost), timeout_s=90,
                         message=f"{gone}'s tasks to be held back")
        assert tasks_of(stays) == own
        if returns:
            back = apps[gone] = member(gone)
            watch.add(back)
            launched.app(back)
            await wait_until(lambda: tasks_of(back) == lost, timeout_s=120,
                             message=f"{gone} to get its own tasks back")
            assert not (watch.ran[id(stays)] - ran_before) & lost, (
                f"{leader} ran tasks held back for {gone}")
        else:
            await wait_until(lambda: tasks_of(stays) == own | lost, timeout_s=150,
                             message=f"{leader} to take {gone}'s tasks after the delay")
        await traffic.stop()
        await exact_counts(bootstrap, sink, traffic.produced)
