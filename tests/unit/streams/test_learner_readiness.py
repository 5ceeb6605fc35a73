"""When a member asks for the round that promotes its ready learners, per policy, and what
its subscription says of it; then the state updater applying that decision."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from assignor import LeaderNotes, MemberNotes
from streams.config import AppConfig, ConfigError
from streams.group.group_learning import GroupLearning
from streams.group.learner_readiness import (
    LearnerView,
    asks_now,
    asks_promotion,
    being_promoted,
)
from streams.runtime.state_updater import StateUpdater
from streams.runtime.tasks import Tasks
from streams.runtime.transitions import Role
from tests.unit.streams.fakes import FakeChangelogReader

HELD = frozenset({"0_1", "0_2"})


def view(ready: dict[str, float], asked: set[str] = frozenset(),  # type: ignore[assignment]
         group: int = 0) -> LearnerView:
    return LearnerView(HELD, frozenset(ready),
                       {t: s for t, s in ready.items() if t not in asked}, group)


def test_no_ready_learner_nothing_to_ask_for_under_any_policy() -> None:
    for policy in ("batched", "eager", "conservative"):
        assert not asks_now(policy, view({}), now=100.0, wait=30.0)
        # Ready learners it already asked for: not again.
        assert not asks_now(policy, view({"0_1": 0.0, "0_2": 0.0}, {"0_1", "0_2"}), 100.0, 30.0)


def test_eager_asks_on_the_first_ready_learner() -> None:
    assert asks_now("eager", view({"0_1": 10.0}, group=4), now=10.0, wait=30.0)


def test_conservative_waits_for_all_of_its_own_learners_however_long() -> None:
    assert not asks_now("conservative", view({"0_1": 0.0}), now=1e9, wait=30.0)
    assert asks_now("conservative", view({"0_1": 0.0, "0_2": 5.0}, group=4), 5.0, 30.0)


def test_batched_asks_at_once_when_it_holds_every_learner_of_the_group_and_all_are_ready(
) -> None:
    assert asks_now("batched", view({"0_1": 0.0, "0_2": 5.0}, group=2), now=5.0, wait=30.0)
    # An older leader does not say how many the group holds: its own are all it knows of.
    assert asks_now("batched", view({"0_1": 0.0, "0_2": 5.0}, group=0), now=5.0, wait=30.0)


def test_batched_waits_for_the_other_members_learners_up_to_the_wait() -> None:
    # Its two learners are ready, but the group holds four: the others may be ready soon.
    ready = view({"0_1": 0.0, "0_2": 5.0}, group=4)
    assert not asks_now("batched", ready, now=29.9, wait=30.0)
    assert asks_now("batched", ready, now=30.0, wait=30.0)
    # One ready learner of two: the wait runs from the first ready one.
    assert not asks_now("batched", view({"0_2": 10.0}, group=2), now=39.0, wait=30.0)
    assert asks_now("batched", view({"0_2": 10.0}, group=2), now=40.0, wait=30.0)


def test_batched_waits_for_the_group_s_learners_while_they_get_closer_however_long() -> None:
    ready = view({"0_1": 0.0, "0_2": 5.0}, group=4)
    # Knowing every member's learners: another member's copy got closer 10 s ago.
    closer = LearnerView(ready.held, ready.ready, ready.unasked_since, 4, {"1_7": 990.0})
    assert not asks_now("batched", closer, now=1000.0, wait=30.0)  # long past the wait
    # It has not got closer for the wait (stalled, or unable to keep up): nobody waits.
    stalled = LearnerView(ready.held, ready.ready, ready.unasked_since, 4, {"1_7": 970.0})
    assert asks_now("batched", stalled, now=1000.0, wait=30.0)
    # Every learner of the group is ready: at once, though the group holds more than it.
    done = LearnerView(ready.held, ready.ready, {"0_2": 5.0}, 4, {})
    assert asks_now("batched", done, now=5.0, wait=30.0)
    # Its own learner still getting closer holds its batch too.
    mine = LearnerView(HELD, frozenset({"0_1"}), {"0_1": 0.0}, 2, {"0_2": 99.0})
    assert not asks_now("batched", mine, now=100.0, wait=30.0)
    # Other policies do not look at the group.
    assert asks_now("eager", closer, now=1000.0, wait=30.0)


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="learner_rejoin"):
        asks_now("lazy", view({"0_1": 0.0}), 0.0, 1.0)


def test_a_member_asks_for_promotion_until_the_learners_it_asked_for_are_promoted() -> None:
    promoted = being_promoted(
        LeaderNotes(round_ms=1, members={("a", 0): MemberNotes(incoming=("0_1", "0_9")),
                                         ("b", 0): MemberNotes(incoming=("0_2",))}),
        ("a", 0))
    assert promoted == {"0_1", "0_9"}
    assert being_promoted(None, ("a", 0)) == frozenset()
    # It asked for 0_1: the round promoted it (a copy until the next round): nothing to ask.
    assert not asks_promotion(frozenset({"0_1"}), HELD, promoted)
    # It asked for 0_2 (a round already under way did not see the request): still asking.
    assert asks_promotion(frozenset({"0_2"}), HELD, promoted)
    assert not asks_promotion(frozenset(), HELD, frozenset())


def test_the_policy_and_its_wait_are_validated() -> None:
    assert AppConfig("a").learner_rejoin == "batched"
    assert AppConfig("a").learner_batch_wait_ms == 30_000
    with pytest.raises(ConfigError, match="learner_rejoin"):
        AppConfig("a", learner_rejoin="lazy")
    with pytest.raises(ConfigError, match="learner_batch_wait_ms"):
        AppConfig("a", learner_batch_wait_ms=-1)


class _Store:
    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.name = "counts"


def test_the_state_updater_asks_for_batched_learners_once_the_wait_runs_out() -> None:
    tasks = Tasks()
    follower = FakeChangelogReader()
    asked: list[list[str]] = []
    updater = StateUpdater(FakeChangelogReader(), follower, tasks, commit_interval_ms=1000,
                           acceptable_lag=10, learner_rejoin="batched",
                           on_restored=lambda t, s: asyncio.sleep(0),  # type: ignore[arg-type,return-value]
                           on_learners_ready=asked.append, learner_batch_wait_ms=20_000)
    for p in (1, 2, 3):
        tasks.add_copy(f"0_{p}", Role.LEARNER, {"counts": _Store(p)})  # type: ignore[dict-item]
    # The group holds five learners; this thread three, and the last round promoted 0_3.
    updater.learners_assigned(5, frozenset({"0_3"}))
    follower.lags = {"1": 5, "2": 500, "3": 0}
    updater.check_learners_ready(now=100.0)
    updater.check_learners_ready(now=119.9)
    assert asked == [] and not updater.asks_promotion()
    follower.lags = {"1": 5, "2": 8, "3": 0}
    updater.check_learners_ready(now=119.95)
    assert asked == []  # all its own are ready, but other members hold learners too
    updater.check_learners_ready(now=120.0)
    assert asked == [["0_1", "0_2"]] and updater.asks_promotion()
    updater.check_learners_ready(now=200.0)
    assert asked == [["0_1", "0_2"]]


@dataclass
class _BatchingThread:
    """A state updater of member ``a-thread-0`` with one ready learner (0_1), in a round of
    generation 7 with one other member, ``b-thread-0``, whose status records it reads."""

    clock: list[float]
    group: GroupLearning
    updater: StateUpdater
    asked: list[list[str]]

    def publish(self, lag: int, at: float) -> None:
        """b's status record, read at ``at``: its learner of 0_2 has ``lag`` to go."""
        self.clock[0] = at
        now_ms = int(time.time() * 1000)
        self.group.apply("b-thread-0", {"generation": 7, "updated_ms": now_ms,
                                        "acceptable_lag": 10, "learning": {"0_2": lag}},
                         now_ms)


def batching_thread() -> _BatchingThread:
    tasks, follower, asked, clock = Tasks(), FakeChangelogReader(), [], [0.0]
    group = GroupLearning(clock=lambda: clock[0])
    updater = StateUpdater(FakeChangelogReader(), follower, tasks, commit_interval_ms=1000,
                           acceptable_lag=10, learner_rejoin="batched",
                           on_restored=lambda t, s: asyncio.sleep(0),  # type: ignore[arg-type,return-value]
                           on_learners_ready=asked.append, learner_batch_wait_ms=20_000,
                           group_learning=group, member="a-thread-0")
    tasks.add_copy("0_1", Role.LEARNER, {"counts": _Store(1)})  # type: ignore[dict-item]
    updater.learners_assigned(2, frozenset(), generation=7, group_size=2)
    follower.lags = {"1": 0}
    return _BatchingThread(clock, group, updater, asked)


def test_the_state_updater_waits_for_another_member_s_learner_while_it_gets_closer() -> None:
    thread = batching_thread()
    thread.publish(5_000, at=90.0)
    for lag, now in ((4_000, 100.0), (3_000, 130.0), (2_000, 160.0)):
        thread.publish(lag, at=now)
        thread.updater.check_learners_ready(now=now + 19.0)
        # b's copy keeps getting closer: past the wait, still waiting.
        assert thread.asked == []
    thread.publish(5, at=161.0)
    thread.updater.check_learners_ready(now=161.0)
    assert thread.asked == [["0_1"]]  # b's copy is ready: the whole batch at once


def test_the_state_updater_stops_waiting_for_a_learner_that_stopped_getting_closer() -> None:
    thread = batching_thread()
    # Up and down, never below its low of 3,900 at 0 s: it cannot keep up with its input.
    for at, lag in ((0.0, 3_900), (10.0, 4_100), (15.0, 3_950)):
        thread.publish(lag, at=at)
    thread.updater.check_learners_ready(now=19.9)
    assert thread.asked == []
    thread.updater.check_learners_ready(now=20.0)
    assert thread.asked == [["0_1"]]
