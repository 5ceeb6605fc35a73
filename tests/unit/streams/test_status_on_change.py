"""A member publishes its status at once when what its readers act on changes (an assignment
applied, a learner ready), not only at its once-a-second tick, and never in a burst: a round
can promote a learner within a second of its catching up, and a reader of one record a
second (the web view) never saw it ready."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import pytest

from streams.group.promotion_asks import PROMOTION_KEY, PromotionAsks
from streams.group.status_topic import status_topic_name
from streams.quirks.synced_round import RoundReports
from streams.runtime.thread_status import (
    MIN_GAP_S,
    TICK_S,
    ThreadStatus,
    publish_delay,
    shape,
)
from tests.conftest import wait_until
from tests.unit.streams.fakes import Rig, assign, rig

STATUS_TOPIC = status_topic_name("unit")


def statuses(r: Rig) -> list[dict[str, Any]]:
    return [msgpack.unpackb(s.value) for s in r.producer.to(STATUS_TOPIC) if s.value]


async def turns(n: int = 20) -> None:
    """Let the loop run its ready callbacks ``n`` times (no timer waited on)."""
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_change_is_published_once_the_gap_has_passed_else_at_the_tick() -> None:
    assert publish_delay(10.0, None, changed=False) == 0.0  # the first record at once
    assert publish_delay(10.05, 10.0, changed=True) == pytest.approx(MIN_GAP_S - 0.05)
    assert publish_delay(11.0, 10.0, changed=True) == 0.0
    assert publish_delay(10.5, 10.0, changed=False) == pytest.approx(TICK_S - 0.5)
    assert publish_delay(12.0, 10.0, changed=False) == 0.0


def test_what_readers_act_on_changes_with_tasks_and_ready_learners_not_with_lags() -> None:
    before = ThreadStatus(active=["0_0"], learners={"0_1": 5_000})
    assert shape(ThreadStatus(active=["0_0"], learners={"0_1": 900}), 100, False) \
        == shape(before, 100, False)
    assert shape(ThreadStatus(active=["0_0"], learners={"0_1": 100}), 100, False) \
        != shape(before, 100, False)  # ready
    assert shape(ThreadStatus(active=["0_0", "0_2"], learners={"0_1": 5_000}), 100, False) \
        != shape(before, 100, False)
    assert shape(before, 100, True) != shape(before, 100, False)


async def test_an_assignment_applied_and_a_task_started_are_published_at_once(
    tmp_path: Path,
) -> None:
    r = rig(tmp_path)
    reporter = r.thread.reporter
    reporter.min_gap_s = 0.0
    housekeeping = asyncio.create_task(reporter.housekeeping(r.thread.join_watch))
    try:
        await wait_until(lambda: len(statuses(r)) == 1, timeout_s=5)
        await turns()
        assert len(statuses(r)) == 1  # nothing changed: the next one waits for the tick
        await assign(r, ("0_0",), learners=("0_1",))
        # Long before the tick (a wait that long would fail this tier's guard).
        await wait_until(lambda: any(s["active"] == ["0_0"] for s in statuses(r)), timeout_s=5)
        assigned, started = statuses(r)[1:]
        assert assigned["restoring"] == ["0_0"] and list(assigned["learners"]) == ["0_1"]
        assert started["active"] == ["0_0"] and started["restoring"] == []
    finally:
        r.thread.lifecycle.stopped.set()
        await housekeeping
        r.thread.task_manager.close_all()


async def test_a_burst_of_changes_waits_out_the_gap(tmp_path: Path) -> None:
    r = rig(tmp_path)
    reporter = r.thread.reporter
    reporter.min_gap_s = 60.0
    housekeeping = asyncio.create_task(reporter.housekeeping(r.thread.join_watch))
    try:
        await wait_until(lambda: len(statuses(r)) == 1, timeout_s=5)
        await assign(r, ("0_0",))
        await assign(r, ("0_0", "0_1"))
        await turns()
        assert len(statuses(r)) == 1
    finally:
        r.thread.lifecycle.stopped.set()
        await housekeeping
        r.thread.task_manager.close_all()


async def test_a_ready_learner_is_published_before_its_member_asks_for_the_round(
    tmp_path: Path,
) -> None:
    """Asked for once the round is synced (with the promotion announced): the status saying
    the learner is ready is on the topic first."""
    r = rig(tmp_path, promotion_asks=PromotionAsks(), round_reports=RoundReports())
    try:
        await assign(r, ("0_1",), learners=("0_3",))
        r.thread.state_updater.check_learners_ready()  # the fake copy's lag is 0: ready
        await wait_until(lambda: r.consumer.rejoins > 0, timeout_s=5,
                         message="a rejoin for the ready learner")
        sent = r.producer.sent
        ask = next(i for i, s in enumerate(sent) if s.key == PROMOTION_KEY)
        ready = [i for i, s in enumerate(sent) if s.topic == STATUS_TOPIC
                 and msgpack.unpackb(s.value)["learners"] == {"0_3": 0}]
        assert ready and ready[0] < ask
    finally:
        r.thread.task_manager.close_all()


async def test_a_ready_learner_asked_for_at_once_is_published_at_once(tmp_path: Path) -> None:
    r = rig(tmp_path)
    try:
        await assign(r, (), learners=("0_2",), group_size=2)
        r.thread.member.learners_ready(["0_2"])
        assert r.consumer.rejoins == 1
        await turns(3)
        assert [s["learners"] for s in statuses(r)] == [{"0_2": 0}]
    finally:
        r.thread.task_manager.close_all()


async def test_nothing_is_published_after_the_tombstone(tmp_path: Path) -> None:
    r = rig(tmp_path)
    try:
        await assign(r, (), learners=("0_2",), group_size=2)
        r.thread.member.learners_ready(["0_2"])  # its record would go out after the tombstone
        await r.thread.reporter.remove()
        await r.thread.reporter.publish()
        await turns()
        assert [s.value for s in r.producer.to(STATUS_TOPIC)] == [None]
    finally:
        r.thread.task_manager.close_all()


async def test_a_learner_ready_since_the_last_record_is_published_as_its_member_joins(
    tmp_path: Path,
) -> None:
    """A round another member asks for may promote a learner this one has not asked for yet:
    its status says the learner is ready before the round's outcome."""
    r = rig(tmp_path)
    try:
        await assign(r, (), learners=("0_2",), group_size=2)
        r.follower.lags["2"] = None  # its end not known yet
        await r.thread.reporter.publish()
        r.follower.lags["2"] = 0  # caught up since
        r.thread.member.subscription()  # the join
        await turns(3)
        assert [s["learners"] for s in statuses(r)][-1] == {"0_2": 0}
        r.thread.member.subscription()  # nothing new: nothing more
        await turns(3)
        assert len(statuses(r)) == 2
    finally:
        r.thread.task_manager.close_all()
