"""Histories that chain changes (``tests.unit.assignor.chains``): a change arriving before the last
one settled, a crash or a pause during a move, a leader change during a move, restarts and
rolling restarts, host swaps whose leaving marks come in the middle of the joins' moves.

Every round keeps the safety rules and the holds (a held task runs nowhere until its deadline
or its member's return, keeps its standbys and every copy that could take over); the group
settles balanced across instances and within each instance, per kind and in total; a
segment (settled to settled) takes at most 2 * ceil(stateful moves / max_learners) + 3
rounds, and two more per further change or deadline within it; and over many histories the
moves are at most 1.2 times the fewest that balance needs, counted for each change from
where the tasks are when it arrives."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from assignor import AssignorConfig, Task
from tests.conftest import examples
from tests.unit.assignor.chains import (
    FAMILIES,
    KINDS,
    Change,
    History,
    Outcome,
    Setup,
    random_changes,
    random_setup,
)

changes = st.lists(
    st.builds(Change, st.sampled_from([*KINDS, "retire"]), st.integers(0, 6), st.integers(1, 3),
              st.sampled_from([None, 0, 1_000, 4_000, 12_000, 50_000, 130_000])),
    min_size=1, max_size=6,
)


@st.composite
def setups(draw: st.DrawFn) -> Setup:
    subtopologies = draw(st.integers(1, 4))
    per_sub = draw(st.integers(1, 7))
    stateless = draw(st.sets(st.integers(0, subtopologies * per_sub - 1), max_size=6))
    tasks = tuple(Task(f"{s}_{p}", stateful=s * per_sub + p not in stateless)
                  for s in range(subtopologies) for p in range(per_sub))
    config = AssignorConfig(
        num_standbys=draw(st.integers(0, 2)),
        max_learners=draw(st.integers(1, 5)),
        acceptable_lag=0,
        lost_task_delay_ms=draw(st.sampled_from([0, 7_000, 45_000, 240_000])),
        scale_down_timeout_ms=draw(st.sampled_from([90_000, 300_000])),
        imbalance_tolerance=draw(st.sampled_from([None, 2])),
    )
    names = draw(st.lists(st.text("abcqrs-", min_size=1, max_size=5), min_size=12,
                          max_size=12, unique=True))
    return Setup(tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))), tasks,
                 config, lag_seed=draw(st.integers(0, 999)),
                 slowest_ms=draw(st.sampled_from([0, 8_000, 35_000, 110_000])),
                 spread_ms=draw(st.sampled_from([0, 25_000, 70_000])), names=tuple(names))


#: Three instances of one thread, one stateful task. The leader's instance crashes with the
#: task, which its hold keeps until the next leader gets it; that leader crashes too, and the
#: first comes back from its pause still claiming the task. The third member, leading from
#: the notes, took the stale claim: the hold for the second ended early. A claimant whose own
#: notes are older than those naming the task's owner is now taken for back from a pause.
LEADERS_GONE_HOLDER_BACK = Setup(
    threads=(1, 1, 1), tasks=(Task("0_0"),),
    config=AssignorConfig(num_standbys=0, acceptable_lag=0, max_learners=1,
                          lost_task_delay_ms=7_000, scale_down_timeout_ms=90_000),
    lag_seed=0, slowest_ms=0, spread_ms=0,
    names=("a", "-", "b", "c", "q", "aa", "a-", "ab", "-a", "aaa", "aaaa", "aaaaa"),
)


#: Instance a (4 threads) crashes and one of its threads comes back within the delay: when
#: the holds of the three others end, their tasks are the instance's again but not given back
#: to anyone, so balance must spread them (stateless ones at once) over the threads there are.
ONE_THREAD_BACK = Setup(
    threads=(4, 3),
    tasks=(*(Task(f"0_{p}", stateful=False) for p in range(4)), Task("1_0", False),
           Task("1_1", False), Task("1_2"), Task("1_3")),
    config=AssignorConfig(num_standbys=0, acceptable_lag=0, max_learners=1,
                          lost_task_delay_ms=7_000, scale_down_timeout_ms=90_000),
    lag_seed=0, slowest_ms=0, spread_ms=0,
    names=("a", "b", "c", "q", "r", "a-", "ab", "-a", "-", "aa", "aaa", "aaaa"),
)


#: Instance a (2 threads) crashes, c joins and a's threads come back within the delay, all
#: before the next round: they get their tasks back, more than balance allows now that c is
#: there, and nothing else would start the round that moves the stateless ones to c.
BACK_TO_A_BIGGER_GROUP = Setup(
    threads=(2, 2),
    tasks=(*(Task(f"0_{p}", stateful=False) for p in range(8)), Task("1_0"), Task("1_1")),
    config=AssignorConfig(num_standbys=0, acceptable_lag=0, max_learners=1,
                          lost_task_delay_ms=45_000),
    slowest_ms=0, spread_ms=0, names=("a", "b", "c"),
)


@settings(max_examples=examples(120), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@example(setup=LEADERS_GONE_HOLDER_BACK, chain=[
    Change("crash", 0, 1, None), Change("crash", 0, 1, None), Change("return", 0, 2, 0)], seed=1)
@example(setup=ONE_THREAD_BACK, chain=[Change("crash", 0, 1, None), Change("return", 0, 1, 0)],
         seed=0)
@example(setup=BACK_TO_A_BIGGER_GROUP, chain=[Change("crash", 0, 1, None),
                                              Change("join", 0, 2, 0), Change("return", 0, 1, 0),
                                              Change("return", 0, 1, 0)], seed=0)
@given(setup=setups(), chain=changes, seed=st.integers(0, 2**16))
def test_chained_changes_keep_every_promise_and_settle_within_the_bound(
    setup: Setup, chain: list[Change], seed: int,
) -> None:
    out = History(setup, random.Random(seed)).run(chain)
    assert not out.problems, out.problems
    assert not out.over, (out.excess, out.segment_log)


def test_chained_changes_move_at_most_a_fifth_more_than_balance_needs() -> None:
    """Over 300 random histories (100 in make test, 60 in make test-fast) of every family
    (their changes once settled or in the middle of a move), tasks moved / the fewest moves
    balance needs, each change counted from where the tasks are when it arrives; voluntary
    moves (off an instance that stays) apart too."""
    total = Outcome()
    for n in range(examples(300)):
        rng = random.Random(f"chains/{n}")
        setup = random_setup(rng)
        out = History(setup, rng).run(random_changes(rng, FAMILIES[n % len(FAMILIES)]))
        assert not out.problems, (n, out.problems)
        assert not out.over, (n, out.excess, out.segment_log)
        for name in ("moves", "fewest", "voluntary", "fewest_voluntary"):
            setattr(total, name, getattr(total, name) + getattr(out, name))
    assert total.moves <= 1.2 * total.fewest, (total.moves, total.fewest)
    assert total.voluntary <= 1.2 * total.fewest_voluntary, (total.voluntary,
                                                             total.fewest_voluntary)
    assert total.voluntary <= 1.2 * total.fewest_voluntary, (
        total.voluntary, total.fewest_voluntary)
