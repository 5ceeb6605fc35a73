"""The group's learners from the members' status records: which are still catching up and
when each last got closer, and when a member cannot know them all."""

from __future__ import annotations

from typing import Any

import pytest

from streams.group.group_learning import FRESH_WITHIN_MS, GroupLearning, past_session

NOW_MS = 1_000_000


def record(generation: int = 7, lags: dict[str, int] | None = None,
           updated_ms: int = NOW_MS, **extra: Any) -> dict[str, Any]:
    return {"generation": generation, "updated_ms": updated_ms, "acceptable_lag": 10,
            "learning": {} if lags is None else lags, **extra}


def test_the_other_members_learners_not_ready_with_when_each_last_got_closer() -> None:
    clock = [5.0]
    group = GroupLearning(clock=lambda: clock[0])
    group.apply("b-thread-0", record(lags={"0_1": 900, "0_2": 3}), NOW_MS)
    group.apply("c-thread-0", record(lags={"0_3": 50}), NOW_MS)
    group.apply("a-thread-0", record(lags={"0_4": 999}), NOW_MS)  # the asking member itself
    assert group.catching_up("a-thread-0", 7, 3, NOW_MS) == {"0_1": 5.0, "0_3": 5.0}
    clock[0] = 9.0
    group.apply("b-thread-0", record(lags={"0_1": 800, "0_2": 0}), NOW_MS)  # a new low
    group.apply("c-thread-0", record(lags={"0_3": 60}), NOW_MS)  # further off: no new low
    assert group.catching_up("a-thread-0", 7, 3, NOW_MS) == {"0_1": 9.0, "0_3": 5.0}
    group.apply("c-thread-0", record(lags={"0_3": 2}), NOW_MS)
    assert group.catching_up("a-thread-0", 7, 3, NOW_MS) == {"0_1": 9.0}


def test_unknown_while_some_member_of_the_round_has_no_fresh_record_of_it() -> None:
    group = GroupLearning(clock=lambda: 0.0)
    group.apply("b-thread-0", record(lags={"0_1": 900}), NOW_MS)
    # The round had three members: c has published nothing yet.
    assert group.catching_up("a-thread-0", 7, 3, NOW_MS) is None
    # c's record is of the round before (it has not applied this one yet).
    group.apply("c-thread-0", record(generation=6), NOW_MS)
    assert group.catching_up("a-thread-0", 7, 3, NOW_MS) is None
    group.apply("c-thread-0", record(), NOW_MS)
    assert group.catching_up("a-thread-0", 7, 3, NOW_MS) == {"0_1": 0.0}
    # b stopped publishing (crashed): its last record says nothing of now.
    later = NOW_MS + FRESH_WITHIN_MS + 1
    group.apply("c-thread-0", record(updated_ms=later), later)
    assert group.catching_up("a-thread-0", 7, 3, later) is None
    # b stopped (a tombstone); a member too old to say what it learns counts as unknown.
    group.apply("b-thread-0", None, later)
    assert group.catching_up("a-thread-0", 7, 3, later) is None
    group.apply("b-thread-0", {"generation": 7, "updated_ms": later}, later)
    assert group.catching_up("a-thread-0", 7, 3, later) is None
    assert group.catching_up("a-thread-0", 7, 0, later) is None  # no round size known


def test_a_malformed_status_record_is_counted_and_its_member_unknown(
        caplog: pytest.LogCaptureFixture) -> None:
    group = GroupLearning(clock=lambda: 0.0)
    group.apply("b-thread-0", record(lags={"0_1": 900}), NOW_MS)
    for bad in (record(lags={"0_1": "far"}), record(lags=["0_1"]),  # type: ignore[arg-type]
                record(generation="7"), record(updated_ms=True), "not a map"):
        group.apply("b-thread-0", bad, NOW_MS)  # type: ignore[arg-type]
        assert group.catching_up("a-thread-0", 7, 2, NOW_MS) is None
        group.apply("b-thread-0", record(lags={"0_1": 900}), NOW_MS)
        assert group.catching_up("a-thread-0", 7, 2, NOW_MS) == {"0_1": 0.0}
    assert group.rejected == 5
    assert "b-thread-0" in (group.last_rejection or "")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 5 and "'learning' is not a map" in warnings[0]
    # The same bad record each second is logged once.
    group.apply("b-thread-0", record(acceptable_lag=None), NOW_MS)
    group.apply("b-thread-0", record(acceptable_lag=None), NOW_MS)
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 6


def test_a_learner_placed_again_starts_its_lows_over() -> None:
    clock = [0.0]
    group = GroupLearning(clock=lambda: clock[0])
    group.apply("b-thread-0", record(lags={"0_1": 100}), NOW_MS)
    group.apply("b-thread-0", record(), NOW_MS)  # promoted, or moved away
    clock[0] = 50.0
    group.apply("b-thread-0", record(lags={"0_1": 5_000}), NOW_MS)  # a new copy, far behind
    assert group.catching_up("a-thread-0", 7, 2, NOW_MS) == {"0_1": 50.0}


def test_the_status_topic_is_followed_from_the_first_question_on() -> None:
    started: list[bool] = []
    group = GroupLearning(clock=lambda: 0.0)
    group.start_following = lambda: started.append(True)
    assert started == []
    group.catching_up("a-thread-0", 7, 2, NOW_MS)
    group.catching_up("a-thread-0", 7, 2, NOW_MS)
    assert started == [True]


def test_members_silent_past_a_session_whatever_their_round() -> None:
    # A member frozen just after it joined a round stays in the broker's rounds on Tansu;
    # its silence past a session tells the others to have it removed.
    group = GroupLearning(clock=lambda: 0.0)
    group.apply("frozen-thread-0", record(generation=3, updated_ms=NOW_MS - 10_001), NOW_MS)
    group.apply("older-round-thread-0", record(generation=1, updated_ms=NOW_MS - 12_000),
                NOW_MS)
    group.apply("paused-thread-0", record(updated_ms=NOW_MS - 9_999), NOW_MS)
    group.apply("long-gone-thread-0", record(updated_ms=NOW_MS - 30_001), NOW_MS)
    group.apply("stopped-thread-0", record(updated_ms=NOW_MS - 20_000), NOW_MS)
    group.apply("stopped-thread-0", None, NOW_MS)  # a clean stop: it left the group
    group.apply("me-thread-0", record(updated_ms=NOW_MS - 900), NOW_MS)
    assert past_session(group.silences("me-thread-0", NOW_MS), 10_000) == [
        "frozen-thread-0", "older-round-thread-0"]
    # Counted up to now while the records are fresh: the newest is a publication old.
    group.apply("paused-thread-0", record(updated_ms=NOW_MS - 10_500), NOW_MS)
    assert past_session(group.silences("me-thread-0", NOW_MS + 400), 10_000) == [
        "frozen-thread-0", "older-round-thread-0", "paused-thread-0"]


def test_a_member_that_was_frozen_itself_does_not_take_the_others_for_silent() -> None:
    # Resumed from a 25-s SIGSTOP, a member's view of the status topic is as old as its stop
    # until its follower catches up: nobody is silent in it.
    group = GroupLearning(clock=lambda: 0.0)
    stopped_at = NOW_MS - 25_000
    group.apply("w1-thread-0", record(updated_ms=stopped_at - 400), NOW_MS)
    group.apply("w2-thread-0", record(updated_ms=stopped_at - 700), NOW_MS)
    group.apply("w3-thread-0", record(updated_ms=stopped_at), NOW_MS)
    assert past_session(group.silences("w3-thread-0", NOW_MS), 10_000) == []
    # Caught up (a follower reads the records in the order they were written).
    group.apply("w1-thread-0", record(updated_ms=NOW_MS - 200), NOW_MS)
    group.apply("w2-thread-0", record(updated_ms=NOW_MS - 500), NOW_MS)
    assert past_session(group.silences("w3-thread-0", NOW_MS), 10_000) == []
    # The others, meanwhile, saw w3 silent.
    assert past_session(group.silences("w1-thread-0", NOW_MS), 10_000) == ["w3-thread-0"]


def test_looking_for_silent_members_starts_following_the_status_topic() -> None:
    group = GroupLearning(clock=lambda: 0.0)
    started: list[int] = []
    group.start_following = lambda: started.append(1)
    assert past_session(group.silences("a-thread-0", NOW_MS), 10_000) == []
    assert past_session(group.silences("a-thread-0", NOW_MS), 10_000) == []
    assert started == [1]


def test_how_long_each_other_member_has_been_silent() -> None:
    group = GroupLearning(clock=lambda: 0.0)
    assert group.silences("me-thread-0", NOW_MS) == {}
    group.apply("killed-thread-0", record(updated_ms=NOW_MS - 9_200), NOW_MS)
    group.apply("running-thread-0", record(updated_ms=NOW_MS - 300), NOW_MS)
    group.apply("me-thread-0", record(updated_ms=NOW_MS - 100), NOW_MS)
    assert group.silences("me-thread-0", NOW_MS) == {"killed-thread-0": 9_200,
                                                     "running-thread-0": 300}
    # Its own view stale (it was frozen): counted up to the newest record, not to now.
    assert group.silences("me-thread-0", NOW_MS + 20_000) == {"killed-thread-0": 9_100,
                                                              "running-thread-0": 200}


def test_members_of_other_instances_in_a_round_as_their_fresh_records_say() -> None:
    group = GroupLearning(clock=lambda: 0.0)
    group.apply("b-thread-0", record(state="rebalancing"), NOW_MS)
    group.apply("b-thread-1", record(state="running"), NOW_MS)
    # A cooperative member runs its tasks through a round: its state says running.
    group.apply("d-thread-0", record(state="running", in_round=True), NOW_MS)
    group.apply("c-thread-0", record(state="rebalancing", updated_ms=NOW_MS - 3_000), NOW_MS)
    group.apply("a-thread-1", record(state="rebalancing"), NOW_MS)  # this instance's own
    # c's record is stale: frozen.
    assert group.in_round("a", NOW_MS) == ["b-thread-0", "d-thread-0"]
    group.apply("b-thread-0", record(state="running"), NOW_MS + 500)
    group.apply("d-thread-0", record(state="running", in_round=False), NOW_MS + 500)
    assert group.in_round("a", NOW_MS + 500) == []
    # Frozen itself, it has only the records of before its freeze: it knows nothing yet.
    assert group.in_round("a", NOW_MS + 25_000) is None
    assert GroupLearning(clock=lambda: 0.0).in_round("a", NOW_MS) == []  # no other instance


def test_the_groups_join_round_is_the_shortest_fresh_one_measured() -> None:
    group = GroupLearning(clock=lambda: 0.0)
    assert group.join_round_s(NOW_MS) is None
    group.apply("b-thread-0", record(round_s=0.4), NOW_MS)
    group.apply("c-thread-0", record(round_s=0.15, updated_ms=NOW_MS - FRESH_WITHIN_MS - 1),
                NOW_MS)  # stale
    group.apply("d-thread-0", record(round_s=None), NOW_MS)
    group.apply("e-thread-0", record(round_s=True), NOW_MS)  # not a figure
    assert group.join_round_s(NOW_MS) == 0.4


def test_caught_up_copies_are_those_of_other_instances_within_their_lag() -> None:
    group = GroupLearning(clock=lambda: 0.0)
    assert group.caught_up_copies("a", NOW_MS) is None
    group.apply("a-thread-1", record(standbys={"0_9": 0}), NOW_MS)  # the same instance
    assert group.caught_up_copies("a", NOW_MS) is None
    group.apply("b-thread-0", record(standbys={"0_1": 3, "0_2": 11}, learners={"0_3": 10}),
                NOW_MS)
    group.apply("c-thread-0", record(standbys={"0_4": 0}, updated_ms=NOW_MS - FRESH_WITHIN_MS - 1),
                NOW_MS)  # stale
    group.apply("d-thread-0", record(standbys=["0_5"], learners={"0_6": "x"}), NOW_MS)
    assert group.caught_up_copies("a", NOW_MS) == {"0_1", "0_3"}
