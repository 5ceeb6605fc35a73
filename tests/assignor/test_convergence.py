"""Randomized histories of group changes (hypothesis): joins, leaves through the leaving flag,
crashes, returns within and after the lost-task delay, leader changes, learners catching up,
and timeouts. Every round keeps the safety rules; once the history stops changing, the group
settles on a balanced assignment within a bounded number of rounds and then stays there."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assignor import AssignorConfig, MemberAssignment, Task
from tests.assignor.simulation import Group

INSTANCES = [f"i{n}" for n in range(6)]

events = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.sampled_from(INSTANCES), st.integers(1, 2)),
        st.tuples(st.just("crash"), st.sampled_from(INSTANCES), st.just(0)),
        st.tuples(st.just("leave"), st.sampled_from(INSTANCES), st.just(0)),
        st.tuples(st.just("leader"), st.just(""), st.just(0)),
        st.tuples(st.just("ready"), st.sampled_from(INSTANCES), st.just(0)),
        st.tuples(st.just("time"), st.just(""), st.integers(1, 20_000)),
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


def balanced(group: Group) -> bool:
    loads: dict[str, dict[bool, int]] = {}
    threads: dict[str, int] = {}
    stateful = {t.task_id: t.stateful for t in group.tasks}
    for member in group.members.values():
        if member.leaving_since_ms is not None:
            continue
        threads[member.instance_id] = threads.get(member.instance_id, 0) + 1
        per = loads.setdefault(member.instance_id, {True: 0, False: 0})
        for task in member.active:
            per[stateful[task]] += 1
    if not loads:
        return True
    for kind in (True, False):
        ratios = [loads[i][kind] / threads[i] for i in loads]
        if max(ratios) - min(ratios) > 1 + 1e-9:
            return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
    group = Group(tasks, config)
    group.join("i0")
    check_round(group, group.round())
    for kind, instance, value in events:
        present = {m.instance_id for m in group.members.values()}
        if kind == "join" and instance not in present:
            group.join(instance, threads=value)
        elif kind == "crash" and instance in present and len(present) > 1:
            group.crash(instance)
        elif kind == "leave" and instance in present and len(present) > 1:
            group.mark_leaving(instance)
        elif kind == "leader":
            group.memory = None
        elif kind == "ready":
            group.catch_up(instance)
        elif kind == "time":
            group.now_ms += value
        check_round(group, group.round())
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
