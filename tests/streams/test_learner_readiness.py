"""When a member asks for the round that promotes its ready learners, per policy, and what
its subscription says of it; then the state updater applying that decision."""

from __future__ import annotations

import asyncio

import pytest

from assignor import LeaderNotes, MemberNotes
from streams.config import AppConfig, ConfigError
from streams.learner_readiness import (
    LearnerView,
    asks_now,
    asks_promotion,
    being_promoted,
)
from streams.state_updater import StateUpdater
from streams.tasks import Tasks
from streams.transitions import Role
from tests.streams.fakes import FakeChangelogReader

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
