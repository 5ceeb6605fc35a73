"""A ready learner's task moves in the round its member asks for: the member announces the
ask on the control topic, and the task's owner gives it up as it joins that round. The
decisions as plain data, and both sides of a stream thread with fake clients (the broker
scale-out test checks the whole move: tests/broker/streams/test_task_migration.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest
from aiokafka.structs import TopicPartition

from streams.group.control import LeavingMark, LeavingState
from streams.group.promotion_asks import (
    ASK_TTL_S,
    PROMOTION_KEY,
    PromotionAsk,
    PromotionAsks,
    decode_ask,
    encode_ask,
    to_release,
)
from streams.quirks.static_followers import StaticFollowers
from streams.quirks.synced_round import RoundReports
from tests.conftest import wait_until
from tests.unit.streams.fakes import SOURCE, FakeControl, assign, partitions_of, rig


def test_an_ask_survives_its_encoding() -> None:
    ask = PromotionAsk("app-1-thread-0", 7, ("0_1", "0_3"))
    assert decode_ask(encode_ask(ask)) == ask



def marked_leaving() -> LeavingState:
    leaving = LeavingState()
    leaving.mark = LeavingMark(0, None)
    return leaving


@pytest.mark.parametrize("raw", [
    b"", b"\xc1", msgpack.packb([1, 2, 3]), msgpack.packb(["m", "7", ["0_1"]]),
    msgpack.packb(["m", 7, "0_1"]), msgpack.packb(["m", 7, [1]]), msgpack.packb(["m", True, []]),
    msgpack.packb({"member": "m"}),
])
def test_a_malformed_ask_is_a_value_error_that_names_it(raw: bytes) -> None:
    with pytest.raises(ValueError, match="malformed promotion ask"):
        decode_ask(raw)


def test_asks_count_per_generation_for_a_while_and_until_acted_on() -> None:
    now = [100.0]
    asks = PromotionAsks(clock=lambda: now[0])
    asks.record(PromotionAsk("a-thread-0", 3, ("0_1",)))
    asks.record(PromotionAsk("b-thread-0", 3, ("0_2",)))
    asks.record(PromotionAsk("b-thread-0", 4, ("0_3",)))
    asks.record(PromotionAsk("b-thread-0", -1, ("0_4",)))  # no generation: ignored
    assert asks.asked(3) == {"0_1", "0_2"} and asks.asked(4) == {"0_3"}
    assert asks.asked(5) == frozenset()
    asks.acted_on(3, ["0_2"])  # spent
    assert asks.asked(3) == {"0_1"}
    # A broker that keeps the generation across rounds: an old ask must not match them all.
    now[0] += ASK_TTL_S + 1
    assert asks.asked(3) == frozenset() and asks.asked(4) == frozenset()
    asks.record(PromotionAsk("a-thread-0", 3, ("0_5",)))
    assert asks.asked(3) == {"0_5"}


def test_only_running_tasks_learned_elsewhere_and_asked_for_are_given_up() -> None:
    running = ["0_0", "0_1", "0_2"]
    assert to_release(running, ["0_0", "0_1"], ["0_1", "0_5"]) == ["0_1"]
    assert to_release(running, ["0_0"], ["0_1"]) == []  # asked, but not learned from here
    assert to_release(running, ["0_0"], []) == []  # learned, not asked
    assert to_release(["0_2"], ["0_0"], ["0_0"]) == []  # no longer runs it


async def test_the_owner_gives_a_task_up_as_it_joins_the_round_its_learner_asked_for(
    tmp_path: Path,
) -> None:
    asks = PromotionAsks()
    r = rig(tmp_path, promotion_asks=asks)
    try:
        await assign(r, ("0_0", "0_1"), being_learned=("0_0",))
        generation = r.thread.status.generation
        tp = TopicPartition(SOURCE, 0)
        r.thread.tasks["0_0"].processed[tp] = 7
        # Asked in another generation, or for a task not learned from here: kept.
        asks.record(PromotionAsk("other-thread-0", generation + 1, ("0_0",)))
        asks.record(PromotionAsk("other-thread-0", generation, ("0_1",)))
        await r.thread.listener.before_join()
        assert sorted(r.thread.tasks) == ["0_0", "0_1"]
        assert r.thread.listener.handover.released == 0

        asks.record(PromotionAsk("other-thread-0", generation, ("0_0",)))
        await r.thread.listener.before_join()
        assert sorted(r.thread.tasks) == ["0_1"]
        assert r.consumer.commits[-1][tp] == 7  # committed before it stopped
        # Its subscription no longer claims it; its state stays, as a copy.
        assert r.thread.member.subscription().active == ("0_1",)
        assert r.thread.standbys == {"0_0": 0}
        assert partitions_of("0_0") <= r.consumer.paused
        assert r.thread.listener.handover.released == 1

        # The round gives it to its learner: the copy goes, the rest runs on.
        await assign(r, ("0_1",))
        assert sorted(r.thread.tasks) == ["0_1"] and r.thread.standbys == {}
    finally:
        r.thread.task_manager.close_all()


async def test_a_task_given_up_comes_back_from_its_copy_when_its_learner_does_not_take_it(
    tmp_path: Path,
) -> None:
    asks = PromotionAsks()
    r = rig(tmp_path, promotion_asks=asks)
    try:
        await assign(r, ("0_0",), being_learned=("0_0",))
        asks.record(PromotionAsk("other-thread-0", r.thread.status.generation, ("0_0",)))
        await r.thread.listener.before_join()
        kept = r.thread.registry.copies["0_0"]
        # The learner's member went away meanwhile: the leader gives it back to its owner.
        await assign(r, ("0_0",))
        assert sorted(r.thread.tasks) == ["0_0"]
        assert r.thread.tasks["0_0"].stores is kept  # from its copy, not reopened
        assert not partitions_of("0_0") & r.consumer.paused
    finally:
        r.thread.task_manager.close_all()


async def test_the_learner_s_member_announces_its_ask_before_it_rejoins(tmp_path: Path) -> None:
    r = rig(tmp_path, promotion_asks=PromotionAsks(), round_reports=RoundReports())
    try:
        await assign(r, ("0_1",), learners=("0_3",))
        r.thread.state_updater.check_learners_ready()  # the fake copy's lag is 0: ready
        await wait_until(lambda: r.consumer.rejoins > 0, timeout_s=5,
                         message="a rejoin for the ready learner")
        asks = [decode_ask(s.value) for s in r.producer.sent if s.key == PROMOTION_KEY]
        assert asks == [PromotionAsk(r.thread.status_key.decode(),
                                     r.thread.status.generation, ("0_3",))]
        assert r.thread.member.subscription().asks_promotion
    finally:
        r.thread.task_manager.close_all()


async def test_a_leaving_member_gives_tasks_up_for_ready_learners_like_any_owner(
    tmp_path: Path,
) -> None:
    """A leaving owner's task moves to its ready learner in the round that learner asks for,
    not in a follow-up (if the learner cannot take it, the leader gives it back: see
    ``test_a_leaving_owner_gets_back_a_task_it_gave_up_for_a_learner_that_could_not_take_it``)."""
    asks = PromotionAsks()
    r = rig(tmp_path, promotion_asks=asks, leaving=marked_leaving())
    try:
        await assign(r, ("0_0",), being_learned=("0_0",))
        asks.record(PromotionAsk("other-thread-0", r.thread.status.generation, ("0_0",)))
        await r.thread.listener.before_join()
        assert r.thread.tasks == {} and r.thread.listener.handover.released == 1
    finally:
        r.thread.task_manager.close_all()


async def test_a_leaving_member_asks_nobody_to_give_tasks_up_for_its_learners(
    tmp_path: Path,
) -> None:
    """The leader never promotes a leaving member's learners: an owner giving a task up for
    one would give it up for nobody."""
    r = rig(tmp_path, promotion_asks=PromotionAsks(), round_reports=RoundReports(),
            leaving=marked_leaving())
    try:
        await assign(r, ("0_1",), learners=("0_3",))
        r.thread.state_updater.check_learners_ready()
        await wait_until(lambda: r.consumer.rejoins > 0, timeout_s=5,
                         message="a rejoin for the ready learner")
        assert not [s for s in r.producer.sent if s.key == PROMOTION_KEY]
    finally:
        r.thread.task_manager.close_all()


async def test_a_static_owner_publishes_its_subscription_once_it_gave_a_task_up(
    tmp_path: Path,
) -> None:
    """A broker may hand the leader a static member's earlier metadata (claiming the task);
    the leader then takes the subscription published on the control topic."""
    asks, control = PromotionAsks(), FakeControl()
    r = rig(tmp_path, promotion_asks=asks, group_instance_id="node-a",
            static_followers=StaticFollowers(enabled=True, control=control))
    try:
        await assign(r, ("0_0", "0_1"), being_learned=("0_0",))
        asks.record(PromotionAsk("other-thread-0", r.thread.status.generation, ("0_0",)))
        published = len(control.subscriptions)
        await r.thread.listener.before_join()
        assert len(control.subscriptions) == published + 1
        assert r.thread.member.subscription().active == ("0_1",)
    finally:
        r.thread.task_manager.close_all()


async def test_an_owner_with_nothing_to_give_up_joins_without_waiting_for_its_thread(
    tmp_path: Path,
) -> None:
    """The whole group's round waits for every member to join: one whose running tasks no
    ask concerns does not queue for its thread's lock (held by a batch or a commit)."""
    asks = PromotionAsks()
    r = rig(tmp_path, promotion_asks=asks)
    try:
        await assign(r, ("0_0", "0_1"), being_learned=("0_0",))
        generation = r.thread.status.generation
        asks.record(PromotionAsk("other-thread-0", generation, ("0_1",)))  # not learned here
        handover = r.thread.listener.handover
        async with handover.lock:  # the thread is busy
            await asyncio.wait_for(r.thread.listener.before_join(), timeout=5)
        assert sorted(r.thread.tasks) == ["0_0", "0_1"] and handover.released == 0
    finally:
        r.thread.task_manager.close_all()
