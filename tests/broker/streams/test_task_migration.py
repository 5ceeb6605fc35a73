"""Smooth task migration end to end on the real broker (learners): a new member first learns
tasks in the background while their owner keeps processing, then takes them over; a member
marked as leaving hands its tasks to learners and shuts down, or is cut short by the
scale-down timeout. Counts stay exact throughout: no record lost or counted twice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from streams.app import App
from streams.group.group_learning import GroupLearning
from streams.queries.routing import StatusFollower
from tests.broker.streams.harness import (
    Launched,
    Watch,
    counting_app,
    counting_topics,
    exact_counts,
    published,
    run_relay,
    running,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


@pytest.mark.tansu
async def test_scale_out_learns_first_then_moves(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], launched: Launched
) -> None:
    app_id = unique("scale-out")
    source, sink, traffic = await counting_topics(bootstrap, app_id, 3000)
    launched.traffic_for(traffic)
    # Dynamic members (short sessions, quick rounds): static membership is not under test.
    old = counting_app(app_id, bootstrap, tmp_path / "old", source, sink, None,
                       session_timeout_ms=6000, heartbeat_interval_ms=1000)
    new = counting_app(app_id, bootstrap, tmp_path / "new", source, sink, None,
                       session_timeout_ms=6000, heartbeat_interval_ms=1000)
    async with running(old):
        await wait_until(lambda: bool(old.threads) and len(old.threads[0].tasks) == 4,
                         timeout_s=90, message="the first member to run every task")
        traffic.start()
        first_round: set[str] = set()
        #: The owner's records processed, sampled while the newcomer only learned (its
        #: learners restoring, no task of its own yet).
        owner_while_learning: list[float] = []

        def after_first_round() -> None:
            thread = new.threads[0] if new.threads else None
            if thread is not None and thread.learners and not thread.tasks:
                owner_while_learning.append(records_processed(old))
            if thread is not None and thread.status.rebalances == 1:
                first_round.update(thread.tasks, thread.restoring)

        async with running(new), Watch(new) as watch:
            await wait_until(
                lambda: (after_first_round(), bool(new.threads)
                         and len(new.threads[0].tasks) == 2
                         and len(old.threads[0].tasks) == 2)[1],
                timeout_s=180, interval_s=0.02,
                message="the new member to learn and take over two tasks")
            moved = set(new.threads[0].tasks)
            # The owner kept processing while the learners restored.
            assert len(owner_while_learning) >= 2, "no sample while the newcomer learned"
            assert owner_while_learning[-1] > owner_while_learning[0], (
                f"the owner processed nothing while its learner restored: "
                f"{owner_while_learning}")
            # Every task it took over, it learned first: before it joined (it is new to a
            # running group, so it warmed them up), and it got them in its first round.
            assert moved <= watch.learned[id(new)]
            assert moved <= first_round
            # The group's leader counted each move, with its cause.
            counted = sum(app.metrics.registry.get_sample_value(
                "relay_tasks_moved_total", {"thread": t.status_key.decode(),
                                            "cause": "learner_ready"}) or 0
                for app in (old, new) for t in app.threads)
            assert counted == len(moved)
            # Its owner gave each one up as it joined the round its learner asked for, so
            # the task moved in that round, not in a follow-up one.
            assert sum(t.listener.handover.released for t in old.threads) == len(moved)
            await traffic.stop()
            await exact_counts(bootstrap, sink, traffic.produced)
            await each_knows_the_other_s_learners(bootstrap, app_id, old, new)


def records_processed(app: App) -> float:
    """The input records ``app`` processed, by its metrics (a counter: it never goes back)."""
    return sum(sample.value for family in app.metrics.registry.collect()
               if family.name == "relay_records_processed"
               for sample in family.samples if sample.name == "relay_records_processed_total")


async def each_knows_the_other_s_learners(bootstrap: str, app_id: str,
                                          *apps: App) -> None:
    """Read from the status topic, the way a member batching its ready learners does, every
    member's learners are known to each of them (none catching up: the group is settled)."""
    group = GroupLearning()
    stop = asyncio.Event()
    follower = asyncio.create_task(StatusFollower(bootstrap, app_id, group).run(stop))
    threads = [t for app in apps for t in app.threads]
    try:
        await wait_until(lambda: all(
            group.catching_up(t.status_key.decode(), t.status.generation, len(threads),
                              int(time.time() * 1000)) == {} for t in threads),
            timeout_s=30, message="every member's learners on the status topic")
    finally:
        stop.set()
        await follower
    assert group.rejected == 0


@pytest.mark.parametrize("timeout_ms", [None, 1])
async def test_a_member_marked_leaving_hands_over_and_shuts_down(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], timeout_ms: int | None,
    launched: Launched,
) -> None:
    app_id = unique("scale-down")
    source, sink, traffic = await counting_topics(bootstrap, app_id)
    launched.traffic_for(traffic)
    # Nobody restarts here, so a static session shorter than a restart needs keeps rounds short.
    short = {"session_timeout_ms": 12_000}
    stays = counting_app(app_id, bootstrap, tmp_path / "a", source, sink, "node-a", **short)
    leaves = counting_app(app_id, bootstrap, tmp_path / "b", source, sink, "node-b", **short)
    launched.app(stays)
    leaving_run = launched.app(leaves)
    await wait_until(
        lambda: bool(stays.threads and leaves.threads)
        and len(stays.threads[0].tasks) == 2 and len(leaves.threads[0].tasks) == 2,
        timeout_s=150, message="the two members to share the tasks",
    )
    traffic.start()
    await published(bootstrap, app_id, {"node-a-thread-0": 2, "node-b-thread-0": 2})
    args = ["mark-leaving", app_id, "node-b"]
    if timeout_ms is not None:
        args += ["--timeout-ms", str(timeout_ms)]
    code, out = await run_relay(*args, bootstrap=bootstrap)
    assert code == 0, out
    async with Watch(stays) as watch:
        await wait_until(leaving_run.done, timeout_s=180, interval_s=0.05,
                         message="node-b to hand over and shut down")
    leaving_run.result()  # ended cleanly, not with an error
    assert leaves.threads[0].shutdown_requested
    await wait_until(lambda: len(stays.threads[0].tasks) == 4, timeout_s=90,
                     message="node-a to run every task")
    if timeout_ms is None:
        assert watch.learned[id(stays)], "node-a should have learned node-b's tasks first"
    # The leader counted node-b's two tasks as moved for its leaving (with ready learners,
    # or when the scale-down deadline passed first).
    moved = {cause: sum(app.metrics.registry.get_sample_value(
        "relay_tasks_moved_total", {"thread": t.status_key.decode(), "cause": cause}) or 0
        for app in (stays, leaves) for t in app.threads)
        for cause in ("leaving", "scale_down_timeout", "lost", "balance", "learner_ready")}
    assert moved["leaving"] + moved["scale_down_timeout"] == 2, moved
    if timeout_ms is None:
        assert moved["leaving"] == 2, moved
    await traffic.stop()
    await exact_counts(bootstrap, sink, traffic.produced)
