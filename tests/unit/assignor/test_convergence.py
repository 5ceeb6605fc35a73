"""Randomized histories of group changes (hypothesis): joins, leaves through the leaving flag,
crashes of instances and of single threads, restarts, returns within and after the lost-task
delay, leader changes, learners catching up, and timeouts. Every round keeps the safety rules,
holds last until their deadline (or the member's return, which gets its tasks back), and an
unowned task goes to a copy when one exists; once the history stops changing, the group
settles on an assignment balanced across instances and threads within a bounded number of
rounds and then stays there.

Single changes to a settled group, in time: each new copy takes its own time to catch up
(uneven between instances and between tasks, from 0 to three times the wait), a round takes
3 s, rounds happen only when someone asks (the change, a member that revoked tasks or shut
down, a member whose learners are ready, as the runtime's ``learner_rejoin="batched"``
decides). The group settles within 2 * ceil(moves / max_learners) + 3 rounds, a new leader
(even a restarting one) moves nothing, a join or a leave moves exactly the fewest tasks that
balance needs, and over many groups each kind of change moves at most 1.1 times that.

Why that bound holds: a promotion round is followed by the round that assigns what it revoked,
so a move of m tasks takes at least 2 * ceil(m / max_learners) rounds, and it takes no more
when every promotion round finds every learner of the group ready. Three things see to that.
The leader promotes every ready learner of the group at once and refills the freed slots in
the same round; it promotes only in a round a member asked for (a follow-up or a departure
promotes nothing, so it cannot split a batch); and a member asks only once every learner of
the group is ready, knowing the other members' learners from their status records, for as
long as the rest keep getting closer (a copy whose lag stops going down for
``learner_batch_wait_ms`` holds nobody back; the simulation's copies always get closer). All
learners in place were placed in the last promotion round (or the change's), so the round
the last of them asks for finds them all ready, whatever the lags. A leaving instance shuts
down upon revoking its last tasks, so its departure costs no round of its own. Asking on each
ready learner (``eager``) gives copies that get ready at different times a promotion round
each."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from assignor import (
    AssignorConfig,
    LeaderMemory,
    Member,
    MemberAssignment,
    Task,
    memory_from_notes,
)
from streams.config import LEARNER_BATCH_WAIT_MS
from tests.conftest import examples
from tests.unit.assignor.measures import (
    balanced,
    fewest_moves,
    moves,
    placement,
    settle,
    settle_timed,
)
from tests.unit.assignor.simulation import Group

INSTANCES = [f"i{n}" for n in range(6)]


events = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.sampled_from(INSTANCES), st.integers(1, 2)),
        st.tuples(st.just("crash"), st.sampled_from(INSTANCES), st.just(0)),
        st.tuples(st.just("leave"), st.sampled_from(INSTANCES), st.just(0)),
        st.tuples(st.just("leader"), st.just(""), st.just(0)),
        st.tuples(st.just("ready"), st.sampled_from(INSTANCES), st.just(0)),
        st.tuples(st.just("time"), st.just(""), st.integers(1, 20_000)),
        st.tuples(st.just("bounce"), st.sampled_from(INSTANCES), st.just(0)),
        st.tuples(st.just("thread"), st.sampled_from(INSTANCES), st.just(0)),
    ),
    min_size=1, max_size=25,
)


def check_round(group: Group, out: dict[str, MemberAssignment]) -> None:
    instance_of = {mid: m.instance_id for mid, m in group.members.items()}
    instance_of.update({mid: mid.rsplit("-", 1)[0] for mid in out if mid not in instance_of})
    owners: dict[str, str] = {}
    for mid, assignment in out.items():
        for task in assignment.active:
            assert task not in owners, f"{task} active on {owners[task]} and {mid}"
            owners[task] = mid
    for mid, assignment in out.items():
        for task in (*assignment.learners, *assignment.standbys):
            if task in owners:
                assert instance_of[owners[task]] != instance_of[mid], (
                    f"copy of {task} on the instance that runs it")
    revoked = {t for a in out.values() for t in a.revoked}
    # Cooperative: what is revoked this round is assigned to nobody until the next one.
    assert not revoked & set(owners), f"revoked and assigned at once: {revoked & set(owners)}"
    held = set(group.memory.lost) if group.memory else set()
    waiting = set(group.memory.moving) if group.memory else set()
    if out and not all(a.error for a in out.values()):
        for task in group.tasks:
            assert task.task_id in owners or task.task_id in revoked | held | waiting, (
                f"{task.task_id} has no owner")


def check_warm(views: list[Member], memory: LeaderMemory, acceptable_lag: int,
               stateful: dict[str, bool], out: dict[str, MemberAssignment]) -> None:
    """An unowned stateful task with no previous owner or destination to go back to runs on an
    instance that held a copy of it, if any open instance did: the most caught-up one (copies
    within the acceptable lag count as equally caught up)."""
    running = {t for m in views for t in m.active}
    instance_of = {m.member_id: m.instance_id for m in views}
    open_ = {m.instance_id for m in views if not m.leaving}
    for mid, assignment in out.items():
        for task in assignment.active:
            if task in running or not stateful[task] or mid not in instance_of:
                continue
            back = {k[0] for k in (memory.owners.get(task), memory.moving.get(task)) if k}
            if back & open_:
                continue
            lags: dict[str, int] = {}
            for member in views:
                for copies in (member.learners, member.standbys):
                    if task in copies and member.instance_id in open_:
                        lag = copies[task]
                        lags[member.instance_id] = min(lag, lags.get(member.instance_id, lag))
            if lags:
                best = max(min(lags.values()), acceptable_lag)
                assert lags.get(instance_of[mid], best + 1) <= best, (
                    f"{task} placed on {instance_of[mid]} cold; copies: {lags}")


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=events,
    n_tasks=st.integers(1, 12),
    stateless_every=st.integers(2, 5),
    max_learners=st.integers(1, 3),
    num_standbys=st.integers(0, 1),
    delay=st.sampled_from([0, 5_000]),
)
def test_random_histories_stay_safe_and_converge(
    events: list[tuple[str, str, int]], n_tasks: int, stateless_every: int,
    max_learners: int, num_standbys: int, delay: int,
) -> None:
    tasks = [Task(f"0_{p}", stateful=p % stateless_every != 0) for p in range(n_tasks)]
    config = AssignorConfig(max_learners=max_learners, num_standbys=num_standbys,
                            lost_task_delay_ms=delay, scale_down_timeout_ms=30_000)
    stateful = {t.task_id: t.stateful for t in tasks}
    group = Group(tasks, config)
    group.join("i0")
    check_round(group, group.round())
    holds: dict[str, tuple[str, int]] = {}  # task -> (member it is held for, until when)
    for kind, instance, value in events:
        present = {m.instance_id for m in group.members.values()}
        vanished: list[str] = []
        if kind == "join" and instance not in present:
            group.join(instance, threads=value)
        elif kind == "crash" and instance in present and len(present) > 1:
            vanished = [mid for mid, m in group.members.items() if m.instance_id == instance]
        elif kind == "thread" and instance in present and len(group.members) > 1:
            vanished = sorted(mid for mid, m in group.members.items()
                              if m.instance_id == instance)[-1:]
        elif kind == "leave" and instance in present and len(present) > 1:
            group.mark_leaving(instance)
            for task, (mid, _) in list(holds.items()):
                # Nothing is held for a thread of a leaving instance: its tasks go to the
                # instances that stay.
                if mid.rsplit("-", 1)[0] == instance:
                    del holds[task]
        elif kind == "leader":
            group.memory = None
        elif kind == "bounce" and instance in present:
            group.bounce(instance)
            group.memory = None  # it was the leader
            for task in list(holds):
                # The notes of a hold live on two members of two instances where there are
                # two (the vanished member's sibling threads count): only when every member
                # left is on the restarting instance is the hold lost.
                if present <= {instance}:
                    del holds[task]
        elif kind == "ready":
            group.catch_up(instance)
        elif kind == "time":
            group.now_ms += value
        for mid in vanished:
            member = group.members.pop(mid)
            if delay and member.leaving_since_ms is None:
                for task in member.active:
                    holds[task] = (mid, group.now_ms + delay)
        views = [m.view() for m in group.members.values()]
        memory = group.memory or memory_from_notes(views)
        out = group.round()
        check_round(group, out)
        check_warm(views, memory, config.acceptable_lag, stateful, out)
        here = {m.member_id for m in views}
        for task, (mid, until) in list(holds.items()):
            if group.now_ms >= until:
                del holds[task]
                continue
            owners = [m for m, a in out.items() if task in a.active]
            if mid in here:  # the member returned within the delay: its instance gets it
                inst = mid.rsplit("-", 1)[0]
                assert [o.rsplit("-", 1)[0] for o in owners] == [inst], (
                    f"{task} not given back to {mid}: {owners}")
                del holds[task]
            else:
                assert not owners, f"{task} held for {mid} until {until} runs on {owners}"
        if not group.members:
            group.join("i0")
    # The history stops changing: learners catch up, time passes beyond every timer.
    stateful_tasks = sum(t.stateful for t in tasks)
    bound = 2 * (math.ceil(stateful_tasks / max_learners) + 2)
    rounds = 0
    while True:
        group.catch_up()
        group.now_ms += 31_000
        before = {mid: (sorted(m.active), sorted(m.learners)) for mid, m in
                  group.members.items()}
        out = group.round()
        check_round(group, out)
        rounds += 1
        after = {mid: (sorted(m.active), sorted(m.learners)) for mid, m in
                 group.members.items()}
        quiet = all(not a.revoked and not a.learners and not a.shutdown for a in out.values())
        if quiet and before == after and balanced(group):
            break
        assert rounds <= bound, f"not settled after {rounds} rounds: {after}"
    settled = {mid: sorted(m.active) for mid, m in group.members.items()}
    for _ in range(3):
        group.catch_up()
        check_round(group, group.round())
        assert {mid: sorted(m.active) for mid, m in group.members.items()} == settled
    owned = sorted(t for m in group.members.values() for t in m.active)
    assert owned == sorted(t.task_id for t in tasks)


CHANGES = ("crash", "join", "swap", "leave", "leader", "bounce")


def settled_group(rng: random.Random | None, instances: int, threads: list[int], n_tasks: int,
                  stateless_every: int, num_standbys: int, max_learners: int,
                  speeds: list[int]) -> Group:
    """A settled group whose new copies catch up in ``speeds`` rounds (per instance)."""
    tasks = [Task(f"0_{p}", stateful=p % stateless_every != 0) for p in range(n_tasks)]
    config = AssignorConfig(num_standbys=num_standbys, max_learners=max_learners,
                            acceptable_lag=0)
    group = Group(tasks, config)
    for i in range(instances):
        group.join(f"i{i}", threads=threads[i % len(threads)])
    group.rounds_to_ready = {f"i{i}": speeds[i % len(speeds)] for i in range(instances)}
    group.rounds_to_ready.update({f"n{i}": speeds[-1 - i % len(speeds)] for i in range(4)})
    settle(group)
    return group


def apply(group: Group, change: str, which: int, count: int, threads: int) -> None:
    names = sorted({m.instance_id for m in group.members.values()})
    victim = names[which % len(names)]
    if change == "crash":
        group.crash(victim)
    elif change == "join":
        group.join("n0", threads=threads)
    elif change == "swap":
        swapped = names[: max(1, min(count, len(names) - 1))]
        for n in range(len(swapped)):
            group.join(f"n{n}", threads=threads)
        group.round()
        for name in swapped:
            group.mark_leaving(name)
    elif change == "leave":
        group.mark_leaving(victim)
    elif change == "leader":
        group.memory = None
    elif change == "bounce":
        group.bounce(victim)
        group.memory = None  # the restarting instance led the group


def uneven(seed: int, slowest_ms: int, spread_ms: int) -> Callable[[str, str], int]:
    """Catch-up times that differ between instances and between tasks: each new copy takes
    between ``slowest_ms - spread_ms`` and ``slowest_ms`` (at least 0) to be ready."""
    def catch_up(instance: str, task: str) -> int:
        return max(0, slowest_ms - random.Random(f"{seed}/{instance}/{task}").randint(
            0, spread_ms))
    return catch_up


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    instances=st.integers(2, 5), threads=st.lists(st.integers(1, 3), min_size=1, max_size=5),
    n_tasks=st.integers(3, 16), stateless_every=st.integers(2, 6),
    num_standbys=st.integers(0, 2), max_learners=st.integers(1, 4),
    # Copies catch up within the wait and well beyond it (up to three times).
    seed=st.integers(0, 2**16), slowest_s=st.integers(0, 3 * LEARNER_BATCH_WAIT_MS // 1000),
    spread_s=st.integers(0, 3 * LEARNER_BATCH_WAIT_MS // 1000),
    change=st.sampled_from(CHANGES), which=st.integers(0, 4), count=st.integers(1, 3),
    new_threads=st.integers(1, 3),
)
def test_one_change_settles_in_bounded_rounds_and_a_new_leader_moves_nothing(
    instances: int, threads: list[int], n_tasks: int, stateless_every: int,
    num_standbys: int, max_learners: int, seed: int, slowest_s: int, spread_s: int,
    change: str, which: int, count: int, new_threads: int,
) -> None:
    event("uneven lags" if spread_s else "even lags")
    group = settled_group(None, instances, threads, n_tasks, stateless_every, num_standbys,
                          max_learners, [1])
    group.rounds_to_ready = {}
    group.catch_up_ms = uneven(seed, slowest_s * 1000, spread_s * 1000)
    before = placement(group)
    steady = group.active_by_member()
    apply(group, change, which, count, new_threads)
    least_stateful = fewest_moves(group, before, stateful_only=True)
    rounds = settle_timed(group, "batched", LEARNER_BATCH_WAIT_MS)
    stateful = {t.task_id for t in group.tasks if t.stateful}
    stateful_moved = sum(1 for t, i in before.items()
                         if t in stateful and placement(group).get(t) != i)
    assert rounds <= 2 * math.ceil(stateful_moved / max_learners) + 3, (
        rounds, stateful_moved)
    assert balanced(group)
    if change in ("leader", "bounce"):
        assert group.active_by_member() == steady
    if change in ("join", "leave"):
        # A crash may take one move more (a lost task goes to its warm copy first, and
        # balance may then move a task on), a host swap more (its join moves tasks before the
        # old instances are marked leaving); and a stateless task may move once more to even
        # the totals out where a leaving instance's task went to its warm copy rather than
        # where the totals wanted it: the aggregate test below bounds those.
        assert stateful_moved == least_stateful, (stateful_moved, least_stateful)


def test_each_kind_of_change_moves_at_most_a_tenth_more_than_balance_needs() -> None:
    """Over 120 random settled groups (40 in make test, 24 in make test-fast) per kind of
    change (copies and learners of every count), tasks moved / the fewest moves balance
    needs, with a crashed instance's tasks counted on both sides (they must go somewhere)."""
    for change in CHANGES:
        moved = least = 0
        for seed in range(examples(120)):
            rng = random.Random(seed)
            instances = rng.randint(2, 5)
            group = settled_group(
                rng, instances, [rng.randint(1, 3) for _ in range(instances)],
                rng.randint(3, 16), rng.randint(2, 6), rng.randint(0, 2), rng.randint(1, 4),
                [rng.randint(1, 4) for _ in range(instances)])
            before = placement(group)
            apply(group, change, rng.randrange(instances), rng.randint(1, 3),
                  rng.randint(1, 3))
            least += fewest_moves(group, before)
            settle(group, catch_up=False)
            moved += moves(before, placement(group))
        assert moved <= 1.1 * least, f"{change}: {moved} moves, balance needs {least}"


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    threads=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    stateful=st.lists(st.booleans(), min_size=1, max_size=12),
    joining=st.integers(1, 4), num_standbys=st.integers(0, 2), max_learners=st.integers(1, 3),
)
def test_a_join_to_a_settled_group_of_any_mix_of_kinds_settles_balanced(
    threads: list[int], stateful: list[bool], joining: int, num_standbys: int,
    max_learners: int,
) -> None:
    """Any mix of kinds, few stateful tasks among many stateless ones included: the totals
    balance too. (An independent check found a group settled at 2, 1.5 and 0.67 tasks per
    thread: one stateful and six stateless tasks, instances of 1, 2 and 3 threads, where the
    test groups above all had at least half their tasks stateful.)"""
    group = Group([Task(f"{p % 3}_{p}", stateful=s) for p, s in enumerate(stateful)],
                  AssignorConfig(acceptable_lag=0, num_standbys=num_standbys,
                                 max_learners=max_learners))
    for i, count in enumerate(threads):
        group.join(f"api-{i}", threads=count)
    settle(group)
    group.join("node-x7", threads=joining)
    settle(group)  # fails unless quiet and balanced
    assert balanced(group)
