"""The leader's memory between rounds holds only rounds that took effect (no broker): on
Apache Kafka a member joining while the leader's SyncGroup is under way makes the broker
answer it with a rebalance, and that round placed nothing."""

from __future__ import annotations

from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from assignor import AssignorConfig
from assignor.protocol import Subscription, decode_assignment, encode_subscription
from streams.group.partition_assignor import RelayAssignor, TaskLayout
from tests.unit.streams.fakes import counting_subs


def metadata(instance: str, active: tuple[str, ...] = ()) -> ConsumerProtocolMemberMetadata:
    return ConsumerProtocolMemberMetadata(0, ["in"], encode_subscription(Subscription(
        instance, 0, 1, active=active, static=True)))


def leader() -> RelayAssignor:
    own = Subscription("node-b", 0, 1, static=True)
    return RelayAssignor(TaskLayout(tuple(counting_subs(4))), AssignorConfig(),
                         lambda: own, lambda assignment: None)


def actives(result: dict[str, ConsumerProtocolMemberAssignment]) -> dict[str, tuple[str, ...]]:
    return {m: decode_assignment(a.user_data).active for m, a in result.items()}


def test_a_round_that_never_synced_leaves_no_previous_owners() -> None:
    assignor = leader()
    assignor.metadata(["in"])
    alone = assignor.assign(None, {"b": metadata("node-b")})  # type: ignore[arg-type]
    assert actives(alone) == {"b": ("0_0", "0_1", "0_2", "0_3")}
    # node-a joins before the SyncGroup completes: the leader rejoins without an assignment.
    assignor.metadata(["in"])
    both = actives(assignor.assign(  # type: ignore[arg-type]
        None, {"a": metadata("node-a"), "b": metadata("node-b")}))
    # Nothing runs anywhere: the tasks are spread at once, none waits on a learner.
    assert sorted(len(tasks) for tasks in both.values()) == [2, 2]


def test_the_leader_keeps_the_memory_of_a_round_it_received_its_assignment_of() -> None:
    assignor = leader()
    assignor.metadata(["in"])
    result = assignor.assign(None, {"b": metadata("node-b")})  # type: ignore[arg-type]
    assert assignor.memory is None
    assignor.on_assignment(result["b"])
    assert assignor.is_leader
    assert assignor.memory is not None
    assert set(assignor.memory.owners) == {"0_0", "0_1", "0_2", "0_3"}
