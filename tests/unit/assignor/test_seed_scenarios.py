"""Every scenario of learner-based task migration, replayed round by round.

T1..T5 are tasks ``0_1``..``0_5``. Where the seed assigns a moved task to its new owner in
the same round it is revoked from the old one, Relay's cooperative protocol takes two rounds
(revoke, then assign): the tests check the revoke round and then the seed's picture.
"""

from __future__ import annotations

from assignor import AssignorConfig, Task
from tests.unit.assignor.simulation import Group

T = {i: f"0_{i}" for i in range(1, 6)}
TASKS = [Task(T[i]) for i in range(1, 6)]


def stable(layout: dict[str, list[int]], config: AssignorConfig | None = None) -> Group:
    numbers = sorted(n for ns in layout.values() for n in ns)
    group = Group([Task(T[n]) for n in numbers], config or AssignorConfig())
    for instance, tasks in layout.items():
        group.join(instance, active=tuple(T[i] for i in tasks))
    group.round()  # the leader learns the stable state
    assert group.active_by_instance() == {
        i: sorted(T[t] for t in ts) for i, ts in layout.items()
    }
    return group


def tasks(*numbers: int) -> list[str]:
    return sorted(T[n] for n in numbers)


def test_scale_up_over_four_rebalances() -> None:
    group = stable({"S1": [1, 2], "S2": [3, 4], "S3": [5]})
    # 1: S4 joins and learns T1 from the heaviest instance; nobody stops anything.
    group.join("S4")
    group.round()
    assert group.active_by_instance()["S1"] == tasks(1, 2)
    assert group.learners_by_instance() == {"S4": tasks(1)}
    # 2: S5 joins while S4 is not ready: S5 learns T3.
    group.join("S5")
    group.round()
    assert group.active_by_instance() == {
        "S1": tasks(1, 2), "S2": tasks(3, 4), "S3": tasks(5), "S4": [], "S5": []}
    assert group.learners_by_instance() == {"S4": tasks(1), "S5": tasks(3)}
    # 3: S4 is ready: T1 is revoked from S1, then S4 runs it.
    group.catch_up("S4")
    revoke = group.round()
    assert revoke["S1-0"].revoked == (T[1],) and revoke["S1-0"].rejoin_after_ms == 0
    assert T[1] not in {t for a in revoke.values() for t in a.active}
    group.round()
    assert group.active_by_instance()["S4"] == tasks(1)
    assert group.active_by_instance()["S1"] == tasks(2)
    # 4: S5 is ready: T3 moves the same way.
    group.catch_up("S5")
    group.round()
    group.round()
    assert group.active_by_instance() == {
        "S1": tasks(2), "S2": tasks(4), "S3": tasks(5), "S4": tasks(1), "S5": tasks(3)}
    assert group.learners_by_instance() == {}
    # Balanced and stable: another round changes nothing.
    before = group.active_by_instance()
    out = group.round()
    assert group.active_by_instance() == before
    assert all(not a.revoked and not a.learners for a in out.values())


def test_scale_down_with_s2_leaving() -> None:
    group = stable({"S1": [1, 2], "S2": [3, 4], "S3": [5]})
    group.mark_leaving("S2")
    group.round()
    # S2's tasks get learners on the instances that stay; S2 keeps running them.
    assert group.active_by_instance()["S2"] == tasks(3, 4)
    learners = group.learners_by_instance()
    assert sorted(t for ts in learners.values() for t in ts) == tasks(3, 4)
    assert "S2" not in learners
    # S3 catches up first: T4 moves (revoke, then assign).
    learner_of = {t: i for i, ts in learners.items() for t in ts}
    first = learner_of[T[4]]
    group.catch_up(first)
    group.round()
    group.round()
    assert T[4] in group.active_by_instance()[first]
    # Then the other learner: T3 is revoked from S2 in one round, and S2, with nothing left,
    # shuts down upon that instruction; in the next, S3's neighbour runs it.
    second = learner_of[T[3]]
    group.catch_up()
    revoke = group.round()
    assert revoke["S2-0"].revoked == (T[3],) and revoke["S2-0"].shutdown
    assert T[3] not in {t for a in revoke.values() for t in a.active}
    final = group.round()
    assert "S2-0" not in final
    assert T[3] in final[f"{second}-0"].active
    assert "S2" not in {m.instance_id for m in group.members.values()}
    assert sorted(t for ts in group.active_by_instance().values() for t in ts) == tasks(
        1, 2, 3, 4, 5)


def test_scale_down_timeout_hands_over_unready_learners() -> None:
    group = stable({"S1": [1, 2], "S2": [3, 4], "S3": [5]},
                   AssignorConfig(scale_down_timeout_ms=10_000))
    group.mark_leaving("S2")
    first = group.round()
    assert any(a.rejoin_after_ms == 10_000 for a in first.values())
    # Before the deadline, the unready learners wait and S2 keeps running its tasks.
    group.now_ms = 9_999
    early = group.round()
    assert early["S2-0"].active == tuple(tasks(3, 4)) and not early["S2-0"].revoked
    assert early["S2-0"].rejoin_after_ms == 1
    # At the deadline (the learners never caught up), S2 hands both over in that round...
    group.now_ms = 10_000
    handover = group.round()
    assert handover["S2-0"].revoked == tuple(tasks(3, 4)) and handover["S2-0"].active == ()
    # ...and shuts down upon that instruction; its learners run them in the next.
    assert handover["S2-0"].shutdown
    learners = {t: i for i, ts in group.learners_by_instance().items() for t in ts}
    final = group.round()
    assert "S2-0" not in final
    for task in tasks(3, 4):
        assert task in final[f"{learners[task]}-0"].active
    assert "S2" not in {m.instance_id for m in group.members.values()}
    assert sorted(t for ts in group.active_by_instance().values() for t in ts) == tasks(
        1, 2, 3, 4, 5)


def test_online_host_swapping() -> None:
    group = stable({"S1": [1, 2], "S2": [3, 4]}, AssignorConfig(max_learners=4))
    group.join("S3")
    group.join("S4")
    group.round()
    assert group.active_by_instance()["S1"] == tasks(1, 2)
    assert group.active_by_instance()["S2"] == tasks(3, 4)
    group.mark_leaving("S1")
    group.mark_leaving("S2")
    group.round()
    learners = group.learners_by_instance()
    assert sorted(t for ts in learners.values() for t in ts) == tasks(1, 2, 3, 4)
    assert set(learners) <= {"S3", "S4"}
    group.catch_up()
    for _ in range(3):
        group.round()
    assert set(group.active_by_instance()) == {"S3", "S4"}
    assert sorted(t for ts in group.active_by_instance().values() for t in ts) == tasks(
        1, 2, 3, 4)


def test_leader_crash_during_scaling() -> None:
    group = stable({"S1": [1, 2], "S2": [3, 4], "S3": [5]})
    group.join("S4")
    group.round()
    assert group.learners_by_instance() == {"S4": tasks(1)}
    # S1 (the leader) crashes before S4 is ready; S2 leads with no memory.
    group.crash("S1")
    group.memory = None
    group.round()
    assert group.active_by_instance() == {"S2": tasks(3, 4), "S3": tasks(2, 5), "S4": tasks(1)}


def test_leader_crash_before() -> None:
    group = stable({"S1": [1], "S2": [2, 3, 4, 5]})
    group.crash("S1")
    group.memory = None
    group.join("S3")
    group.join("S4")
    group.round()
    active = group.active_by_instance()
    assert active["S2"] == tasks(2, 3, 4, 5)  # nobody stops what runs
    assert active["S3"] == tasks(1)
