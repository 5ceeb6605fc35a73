"""A new instance restores the tasks it is about to take before it joins, and they move to it
in its first round: the plan (the leader's own assignor run on the status records), the
newcomer's thread warming up and announcing its joining ask, and an owner giving a task up
for it. The broker scale-out test checks the whole move
(tests/broker/streams/test_task_migration.py).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from assignor import AssignorConfig, Task
from streams.group.promotion_asks import (
    ASK_TTL_S,
    PROMOTION_KEY,
    PromotionAsk,
    PromotionAsks,
    decode_ask,
    encode_ask,
    to_release,
)
from streams.group.warm_up import (
    WarmUpGate,
    WarmUpPlan,
    catches_up_within,
    group_settled,
    join_round_s,
    plan_warm_up,
)
from streams.runtime import state_updater
from streams.runtime.thread import ThreadState
from tests.conftest import wait_until
from tests.unit.streams.fakes import SOURCE, assign, partitions_of, rig

NOW = 1_000_000
TASKS = [Task(f"0_{p}") for p in range(4)] + [Task(f"1_{p}", stateful=False) for p in range(2)]
CONFIG = AssignorConfig(max_learners=2)


def status(instance: str, thread: int, active: list[str], generation: int = 5,
           updated_ms: int = NOW - 500, state: str = "running", **extra: Any) -> dict[str, Any]:
    return {"instance_id": instance, "thread": thread, "active": active, "restoring": [],
            "standbys": {}, "learners": {}, "leaving": False, "generation": generation,
            "state": state, "updated_ms": updated_ms, **extra}


def plan(statuses: dict[str, dict[str, Any]], instance: str = "new", threads: int = 1,
         ) -> WarmUpPlan | None:
    return plan_warm_up(statuses, instance, threads, TASKS, CONFIG, NOW, stale_after_ms=10_000)


def test_a_newcomer_warms_up_what_the_leader_would_have_it_learn() -> None:
    statuses = {"a-thread-0": status("a", 0, ["0_0", "0_1", "0_2", "0_3", "1_0", "1_1"])}
    warm = plan(statuses)
    assert warm is not None and warm.generation == 5
    # One instance of four stateful tasks, a second one joins: two move, both at once.
    assert len(warm.by_thread[0]) == 2 and set(warm.by_thread[0]) <= {"0_0", "0_1", "0_2", "0_3"}

    # Two threads: the learners go to both, as the leader's per-thread balance has them.
    two = plan(statuses, threads=2)
    assert two is not None and sorted(len(t) for t in two.by_thread.values()) == [1, 1]


def test_the_plan_takes_the_shortest_join_round_the_members_measured() -> None:
    statuses = {
        "a-thread-0": status("a", 0, ["0_0", "0_1"], round_s=3.4),
        "a-thread-1": status("a", 1, ["0_2", "0_3"], round_s=3.01),
        "b-thread-0": status("b", 0, [], round_s=None),
    }
    warm = plan(statuses)
    assert warm is not None and warm.join_lead_s == 3.01
    # Older members say nothing, and nonsense is ignored: no lead, the warm-up runs to the end.
    for bad in (None, "3", True, -1.0, 0, 3600.0, [3]):
        assert join_round_s({"a": status("a", 0, [], round_s=bad)}) == 0.0


def test_copies_catch_up_within_the_lead_at_the_rate_they_were_read() -> None:
    # 60,000 records read in 3 s (20,000/s): 50,000 left take 2.5 s.
    assert catches_up_within(3.0, 3.0, 60_000, 50_000)
    assert not catches_up_within(2.0, 3.0, 60_000, 50_000)
    # No lead, a rate not trusted yet (under a second), or nothing read: no prediction.
    assert not catches_up_within(0.0, 3.0, 60_000, 0)
    assert not catches_up_within(3.0, 0.5, 60_000, 10)
    assert not catches_up_within(3.0, 3.0, 0, 10)


def test_a_newcomer_to_a_balanced_share_warms_up_its_share_only() -> None:
    statuses = {"a-thread-0": status("a", 0, ["0_0", "0_1", "1_0"], generation=8),
                "b-thread-0": status("b", 0, ["0_2", "0_3", "1_1"], generation=7)}
    warm = plan(statuses)
    assert warm is not None and warm.generation == 8
    assert len(warm.tasks) == 1


def test_a_restart_or_an_empty_group_joins_at_once() -> None:
    running = {"a-thread-0": status("a", 0, ["0_0", "0_1", "0_2", "0_3"])}
    assert plan({}) is None
    # Its own record, even one a killed process left behind: a restart moves nothing.
    left_behind = status("new", 0, ["0_2"], updated_ms=NOW - 600_000)
    assert plan({**running, "new-thread-0": left_behind}) is None
    # Only stale or stopping members: no running group to warm up for.
    assert plan({"a-thread-0": status("a", 0, ["0_0"], updated_ms=NOW - 60_000)}) is None
    assert plan({"a-thread-0": status("a", 0, ["0_0"], state="pending_shutdown")}) is None
    # A stateful task that runs nowhere is held for a member that is away: maybe this one,
    # restarted after a clean stop took its records away (its state directory lost too).
    assert plan({"a-thread-0": status("a", 0, ["0_0", "0_1", "0_2", "1_0", "1_1"])}) is None


def test_malformed_status_records_are_skipped() -> None:
    statuses: dict[str, Any] = {
        "a-thread-0": status("a", 0, ["0_0", "0_1", "0_2", "0_3"]),
        "junk-1": {"instance_id": 7, "state": "running", "updated_ms": NOW},
        "junk-2": "not a record",
        "junk-3": status("c", "x", "0_0", generation="g", standbys=[1], learners={"0_1": "?"}),
    }
    warm = plan(statuses)  # type: ignore[arg-type]
    assert warm is not None and warm.tasks


def test_a_joining_ask_survives_its_encoding_and_malformed_ones_are_refused() -> None:
    ask = PromotionAsk("new-thread-0", 5, ("0_1",), joining=True)
    assert decode_ask(encode_ask(ask)) == ask
    plain = PromotionAsk("b-thread-0", 5, ("0_1",))
    assert decode_ask(encode_ask(plain)) == plain

    for fields in (["m", 5, ["0_1"], "yes"], ["m", 5, ["0_1"], True, 1], {"m": 1}):
        with pytest.raises(ValueError, match="malformed promotion ask"):
            decode_ask(msgpack.packb(fields))


def test_an_owner_releases_a_task_a_newcomer_asks_for_once() -> None:
    now = [0.0]
    asks = PromotionAsks(clock=lambda: now[0])
    asks.record(PromotionAsk("new-thread-0", 5, ("0_1", "0_7"), joining=True))
    assert asks.asked(5) == frozenset()  # not an ask of a learner the leader placed
    assert asks.joining_asked(5) == {"0_1", "0_7"} and asks.joining_asked(6) == frozenset()
    assert to_release(["0_0", "0_1"], [], asks.asked(5), asks.joining_asked(5)) == ["0_1"]
    asks.acted_on(5, ["0_1"])
    assert asks.joining_asked(5) == {"0_7"}
    # A newcomer that died between its ask and its join: the ask lapses, and no later round
    # of the same generation takes the task from its owner.
    now[0] += ASK_TTL_S + 1
    assert asks.joining_asked(5) == frozenset()


@pytest.mark.asyncio
async def test_a_new_thread_restores_its_copies_then_announces_them_then_joins(
    tmp_path: Path,
) -> None:
    asks = PromotionAsks()
    r = rig(tmp_path, promotion_asks=asks,
            warm_up_gate=WarmUpGate(WarmUpPlan(9, {0: ("0_1", "0_2")}), num_threads=1))
    r.follower.lags = {"1": 50_000, "2": 0}  # 0_1 still far behind
    started = asyncio.Event()
    start = r.consumer.start

    async def consumer_start() -> None:
        started.set()
        await start()

    r.consumer.start = consumer_start  # type: ignore[method-assign]
    run = asyncio.create_task(r.thread.run([SOURCE]))
    try:
        await wait_until(lambda: r.thread.learners.get("0_1") == 50_000, timeout_s=5,
                         message="the copies opened")
        assert not started.is_set()  # not a member while it warms up
        warming = [s for s in r.producer.sent if s.topic.endswith("-status")]
        assert warming  # the copies' catch-up is visible before it joins
        r.follower.lags["1"] = 10
        await asyncio.wait_for(started.wait(), 5)
        (sent,) = [decode_ask(s.value) for s in r.producer.sent if s.key == PROMOTION_KEY]
        assert sent == PromotionAsk(r.thread.status_key.decode(), 9, ("0_1", "0_2"), True)
        first = r.thread.member.subscription()
        assert first.learners == {"0_1": 10, "0_2": 0} and first.asks_promotion
        assert first.active == ()

        # Its first round gives it both tasks: promoted from the warm copies, not reopened.
        copies = dict(r.thread.registry.copies)
        await assign(r, ("0_1", "0_2"))
        assert sorted(r.thread.tasks) == ["0_1", "0_2"]
        assert r.thread.tasks["0_1"].stores is copies["0_1"]
        assert r.thread.state is ThreadState.RUNNING
    finally:
        r.thread.stop()
        await asyncio.wait_for(run, 10)


@pytest.mark.asyncio
async def test_a_thread_joins_when_its_copies_will_catch_up_during_the_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The restore and the round overlap: the copies read 1,000 records per 20 ms poll, so
    with 150,000 left and a 3 s round the thread joins well before they are caught up, and
    its first subscription says it expects them ready by the assignment. The 20 ms pass on
    the state updater's clock, not for real. That clock starts at the real one: the warm-up's
    deadline is read from the real clock, which on a machine up for less than a quarter of an
    hour was already behind a fixed start and ended the warm-up at once."""
    clock = [time.monotonic()]
    monkeypatch.setattr(state_updater, "time",
                        SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    r = rig(tmp_path, promotion_asks=PromotionAsks(), acceptable_lag=100,
            warm_up_gate=WarmUpGate(WarmUpPlan(9, {0: ("0_1",)}, join_lead_s=3.0),
                                    num_threads=1))
    r.follower.lags = {"1": 300_000}

    async def steady_read(timeout_ms: int = 200) -> int:
        await asyncio.sleep(0)
        clock[0] += 0.02
        for store in r.follower.registered:
            store.position += 1_000
        r.follower.lags["1"] = max(0, (r.follower.lags["1"] or 0) - 1_000)
        return 1_000

    r.follower.poll = steady_read  # type: ignore[method-assign]
    run = asyncio.create_task(r.thread.run([SOURCE]))
    try:
        await wait_until(lambda: r.consumer.listener is not None, timeout_s=10,
                         message="the join before the copies caught up")
        left = r.follower.lags["1"] or 0
        assert 100 < left < 300_000
        (sent,) = [decode_ask(s.value) for s in r.producer.sent if s.key == PROMOTION_KEY]
        assert sent.tasks == ("0_1",) and sent.joining
        first = r.thread.member.subscription()
        assert first.ready_by_assignment == ("0_1",) and first.asks_promotion
        assert first.learners["0_1"] > 100  # the lag is reported as it is
        # Said of the first round only.
        await assign(r, ("0_1",))
        assert r.thread.member.subscription().ready_by_assignment == ()
    finally:
        r.thread.stop()
        await asyncio.wait_for(run, 10)


@pytest.mark.asyncio
async def test_a_thread_that_cannot_catch_up_in_time_joins_without_asking(
    tmp_path: Path,
) -> None:
    r = rig(tmp_path, promotion_asks=PromotionAsks(), warm_up_timeout_ms=300,
            warm_up_gate=WarmUpGate(WarmUpPlan(9, {0: ("0_1",)}), num_threads=1))
    r.follower.lags = {"1": 50_000}
    run = asyncio.create_task(r.thread.run([SOURCE]))
    try:
        await wait_until(lambda: r.consumer.listener is not None, timeout_s=5,
                         message="the join after the warm-up's time ran out")
        assert not [s for s in r.producer.sent if s.key == PROMOTION_KEY]
        assert r.thread.learners == {"0_1": 50_000}
        assert not r.thread.member.subscription().asks_promotion
    finally:
        r.thread.stop()
        await asyncio.wait_for(run, 10)


@pytest.mark.asyncio
async def test_an_owner_gives_up_a_task_a_newcomer_warmed_up_as_it_joins(
    tmp_path: Path,
) -> None:
    asks = PromotionAsks()
    r = rig(tmp_path, promotion_asks=asks)
    try:
        await assign(r, ("0_0", "0_1"))  # nothing learned from here: the newcomer is no member
        generation = r.thread.status.generation
        asks.record(PromotionAsk("new-thread-0", generation, ("0_1",), joining=True))
        await r.thread.listener.before_join()
        assert sorted(r.thread.tasks) == ["0_0"]
        assert r.thread.member.subscription().active == ("0_0",)
        assert r.thread.standbys == {"0_1": 0} and partitions_of("0_1") <= r.consumer.paused
        # The leader placed it elsewhere after all: it comes back from the copy, and the
        # spent ask does not give it up again.
        kept = r.thread.registry.copies["0_1"]
        await assign(r, ("0_0", "0_1"))
        assert r.thread.tasks["0_1"].stores is kept
        r.thread.status.generation = generation  # a round redone under the same generation
        await r.thread.listener.before_join()
        assert sorted(r.thread.tasks) == ["0_0", "0_1"]
    finally:
        r.thread.task_manager.close_all()


def test_a_second_newcomer_plans_around_one_that_warms_up() -> None:
    statuses = {
        "a-thread-0": status("a", 0, ["0_0", "0_1", "0_2", "0_3"]),
        "b-thread-0": status("b", 0, [], state="starting", warming_up=True,
                             learners={"0_0": 900, "0_1": 0}),
    }
    assert group_settled(statuses, NOW, 10_000)
    warm = plan(statuses, instance="c")
    assert warm is not None and not {"0_0", "0_1"} & set(warm.tasks)
    # A member in the middle of a round is not planned from.
    statuses["a-thread-0"] = status("a", 0, ["0_0"], state="rebalancing")
    assert not group_settled(statuses, NOW, 10_000)
