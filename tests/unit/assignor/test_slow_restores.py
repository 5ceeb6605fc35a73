"""A member that restores an active task from far behind (its state directory lost, a store
found corrupt) while a caught-up copy waits elsewhere: the copy takes the task over after one
more round, and the owner learns the task back instead of making it wait for its restore."""

from __future__ import annotations

from assignor import AssignorConfig, Member, MemberAssignment, Task, assign
from assignor.protocol import (
    Subscription,
    decode_subscription,
    encode_subscription,
    member_from_subscription,
)

TASKS = [Task(f"0_{n}", stateful=True) for n in range(4)]
CONFIG = AssignorConfig(num_standbys=1, acceptable_lag=100, max_learners=2)


def _round(members: list[Member], memory=None, now_ms: int = 1_000
           ) -> tuple[dict[str, MemberAssignment], object]:
    return assign(TASKS, members, CONFIG, now_ms, memory)


def _restarted_without_state(slow: dict[str, int]) -> list[Member]:
    """A (restarted, its state gone) runs 0_0 and 0_1 again and restores them from far behind;
    B runs 0_2 and 0_3 and holds caught-up standbys of A's tasks."""
    return [
        Member("a", "A", 0, active=frozenset({"0_0", "0_1"}), standbys={"0_2": 0, "0_3": 0},
               slow_restores=slow),
        Member("b", "B", 0, active=frozenset({"0_2", "0_3"}), standbys={"0_0": 3, "0_1": 0}),
    ]


def test_a_slow_restore_goes_to_the_caught_up_copy_and_its_owner_learns_it_back() -> None:
    out, memory = _round(_restarted_without_state({"0_0": 80_000, "0_1": 80_000}))
    assert out["a"].revoked == ("0_0", "0_1")
    assert out["a"].learners == ("0_0", "0_1"), "the owner should keep restoring, as a learner"
    assert set(out["b"].active) == {"0_2", "0_3"}
    assert set(out["b"].learners) == {"0_0", "0_1"}

    # The next round: the revoked tasks run on B's caught-up copies; A learns them.
    members = [
        Member("a", "A", 0, learners={"0_0": 60_000, "0_1": 61_000}, standbys={"0_2": 0},
               notes=out["a"].notes),
        Member("b", "B", 0, active=frozenset({"0_2", "0_3"}), learners={"0_0": 0, "0_1": 0},
               notes=out["b"].notes),
    ]
    out, memory = _round(members, memory, now_ms=2_000)
    assert set(out["b"].active) == {"0_0", "0_1", "0_2", "0_3"}
    assert set(out["a"].learners) == {"0_0", "0_1"}

    # A's learners caught up: they take their tasks back, and the group is as before.
    members = [
        Member("a", "A", 0, learners={"0_0": 10, "0_1": 0}, notes=out["a"].notes),
        Member("b", "B", 0, active=frozenset({"0_0", "0_1", "0_2", "0_3"}),
               notes=out["b"].notes),
    ]
    out, _ = _round(members, memory, now_ms=3_000)
    assert set(out["b"].revoked) == {"0_0", "0_1"}


def test_a_restore_the_owner_does_not_call_slow_stays_with_it() -> None:
    out, _ = _round(_restarted_without_state({}))
    assert out["a"].active == ("0_0", "0_1")
    assert out["a"].revoked == ()


def test_a_slow_restore_without_a_caught_up_copy_stays_with_its_owner() -> None:
    members = _restarted_without_state({"0_0": 80_000, "0_1": 80_000})
    members[1] = Member("b", "B", 0, active=frozenset({"0_2", "0_3"}),
                        standbys={"0_0": 5_000, "0_1": 900})
    out, _ = _round(members)
    assert out["a"].active == ("0_0", "0_1")
    assert out["a"].revoked == ()


def test_learning_back_counts_against_max_learners() -> None:
    slow = {"0_0": 80_000, "0_1": 80_000}
    members = _restarted_without_state(slow)
    out, _ = assign(TASKS, members, AssignorConfig(num_standbys=1, acceptable_lag=100,
                                                   max_learners=1), 1_000, None)
    assert out["a"].revoked == ("0_0", "0_1"), "both go to their caught-up copies"
    assert out["a"].learners == ("0_0",), "one learner at most"


def test_the_subscription_carries_slow_restores_of_actives_only() -> None:
    sub = Subscription("A", 0, 1, active=("0_0", "1_2"),
                       slow_restores={"0_0": 80_000, "1_2": 5, "0_3": 7})
    decoded = decode_subscription(encode_subscription(sub))
    assert decoded.slow_restores == {"0_0": 80_000, "1_2": 5, "0_3": 7}
    member = member_from_subscription("a", decoded)
    assert member.slow_restores == {"0_0": 80_000, "1_2": 5}
    plain = decode_subscription(encode_subscription(Subscription("A", 0, 1)))
    assert plain.slow_restores == {}


def test_a_corrupt_slow_restores_field_makes_the_member_new_not_the_round_fail() -> None:
    from assignor.protocol import _frame, _unframe, decode_subscription_or_none

    payload = _unframe(encode_subscription(Subscription("A", 0, 1, active=("0_0",))),
                       "subscription")
    payload["sr"] = "not a map"
    assert decode_subscription_or_none("a", _frame(payload)) is None
