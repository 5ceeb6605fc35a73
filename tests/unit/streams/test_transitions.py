"""Task transitions: only what moved changes; copies are promoted and demoted in place."""

from __future__ import annotations

from assignor import MemberAssignment
from streams.runtime.transitions import Role, plan_transitions


def assignment(active=(), learners=(), standbys=()) -> MemberAssignment:
    return MemberAssignment(
        active=tuple(active), being_learned=(), learners=tuple(learners),
        standbys=tuple(standbys), revoked=(), rejoin_after_ms=None, shutdown=False, error=None,
    )


def test_kept_tasks_stay_and_moved_ones_close() -> None:
    plan = plan_transitions(
        {"0_0": Role.ACTIVE, "0_1": Role.ACTIVE, "0_2": Role.STANDBY},
        assignment(active=["0_0"]),
    )
    assert plan.keep_active == ("0_0",)
    assert set(plan.close) == {"0_1", "0_2"}
    assert plan.start == ()


def test_a_ready_learner_is_promoted_and_the_old_active_becomes_a_standby() -> None:
    plan = plan_transitions(
        {"0_0": Role.LEARNER, "0_1": Role.ACTIVE},
        assignment(active=["0_0"], standbys=["0_1"]),
    )
    assert plan.start == ("0_0",) and plan.promote == ("0_0",)
    assert plan.demote == (("0_1", Role.STANDBY),)
    assert plan.roles == {"0_0": Role.RESTORING, "0_1": Role.STANDBY}


def test_new_copies_are_added_and_retagged() -> None:
    plan = plan_transitions(
        {"0_0": Role.STANDBY}, assignment(learners=["0_0", "0_3"], standbys=["0_4"])
    )
    assert plan.retag == (("0_0", Role.LEARNER),)
    assert set(plan.add_copies) == {("0_3", Role.LEARNER), ("0_4", Role.STANDBY)}
    assert plan.close == ()


def test_a_restoring_task_keeps_restoring() -> None:
    plan = plan_transitions({"0_0": Role.RESTORING}, assignment(active=["0_0"]))
    assert plan.start == () and plan.roles == {"0_0": Role.RESTORING}
