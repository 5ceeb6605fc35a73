"""The leader keeps arriving tasks off a thread that never reported its last assignment: the
pure decision over the round reports, and the leader's assignor that applies it (no broker).

On Tansu a follower's SyncGroup answer is lost when a new round starts right after the last
one (the session of a crashed member expiring): that member waits a round or two for it. A
task the leader gave it meanwhile (a crashed member's task whose standby it held) ran nowhere
until then."""

from __future__ import annotations

from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from assignor import AssignorConfig
from assignor.protocol import Subscription, decode_assignment, encode_subscription
from streams.group.partition_assignor import RelayAssignor, TaskLayout
from streams.quirks.synced_round import unsynced_members
from tests.unit.streams.fakes import counting_subs


def test_members_of_the_leaders_last_round_without_its_generation_are_unsynced() -> None:
    reports = {"leader": 7, "a": 7, "b": 6, "gone": 7}
    assert unsynced_members(["leader", "a", "b", "c"], "leader", reports) == {"b", "c"}


def test_a_leader_without_a_report_of_its_own_names_nobody() -> None:
    assert unsynced_members(["a", "b"], "leader", {"a": 3}) == set()
    assert unsynced_members([], "leader", {"leader": 3}) == set()


def metadata(instance: str, thread: int, active: tuple[str, ...] = (),
             standbys: dict[str, int] | None = None) -> ConsumerProtocolMemberMetadata:
    return ConsumerProtocolMemberMetadata(0, ["in"], encode_subscription(Subscription(
        instance, thread, 1, active=active, standbys=standbys or {})))


def test_the_leader_gives_a_lost_task_to_the_sibling_of_a_thread_still_waiting() -> None:
    waiting: set[str] = set()
    seen: list[list[str]] = []

    def unsynced(previous_round: list[str]) -> set[str]:
        seen.append(previous_round)
        return waiting

    assignor = RelayAssignor(TaskLayout(tuple(counting_subs(4))),
                             AssignorConfig(num_standbys=1), lambda: None,
                             lambda assignment: None, unsynced=unsynced)
    first = {"w0": metadata("W", 0, ("0_0",)), "w1": metadata("W", 1, ("0_1",)),
             "v0": metadata("V", 0, ("0_2",)), "x0": metadata("X", 0, ("0_3",))}
    assignor.assign(None, first)  # type: ignore[arg-type]
    # X crashed; w0 holds the standby of X's task but never reported its last assignment.
    waiting.add("w0")
    second = {"w0": metadata("W", 0, ("0_0",), {"0_3": 0}), "w1": metadata("W", 1, ("0_1",)),
              "v0": metadata("V", 0, ("0_2",))}
    result = assignor.assign(None, second)  # type: ignore[arg-type]
    assert seen == [[], ["v0", "w0", "w1", "x0"]]  # the ids of the last round it assigned
    active = {m: decode_assignment(a.user_data).active for m, a in result.items()}
    assert "0_3" in active["w1"] and active["w0"] == ("0_0",)

