"""Against the real broker: a follower leaves, and while the others join the round that
starts, the group's leader leaves too, each after the formed-group check (the leader's
heartbeat is then answered REBALANCE_IN_PROGRESS and it takes part in the round first); the
members that stay converge. On Tansu a leader that leaves mid-round can wedge the group; this
ordering did not wedge it without the check either in the runs tried, so the test proves the
check works over a real broker and lets the group converge, not that the wedge is gone."""

from __future__ import annotations

import uuid
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from streams import cooperative
from streams.driver import GroupConsumer
from streams.formed_group import wait_for_formed_group
from tests.conftest import wait_until
from tests.streams.harness import create_topics

SESSION_MS = 6_000


class WatchedAssignor(RoundRobinPartitionAssignor):
    """Round robin that remembers that this member led a round."""

    def __init__(self) -> None:
        self.led = 0

    def assign(self, cluster: Any, members: Any) -> Any:
        self.led += 1
        return super().assign(cluster, members)


async def test_the_leader_leaving_after_a_follower_does_not_wedge_the_group(
    bootstrap: str,
) -> None:
    topic, group = f"wedge-{uuid.uuid4().hex[:8]}", f"wedge-{uuid.uuid4().hex[:8]}"
    await create_topics(bootstrap, {topic: 4})
    cooperative.install()
    assignors = [WatchedAssignor() for _ in range(4)]
    members = [GroupConsumer(AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, client_id=f"m{i}",
        partition_assignment_strategy=(assignors[i],), session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=1_000, enable_auto_commit=False,
    )) for i in range(4)]
    for member in members:
        await member.start()
        member.subscribe([topic], None)  # type: ignore[arg-type]

    async def converged(group_members: list[GroupConsumer]) -> bool:
        for member in group_members:
            await member.getmany(timeout_ms=50, max_records=1)
        owned = [member.assignment() for member in group_members]
        return (all(owned) and sum(len(o) for o in owned) == 4
                and len(set().union(*owned)) == 4
                and not any(m.rebalancing or m.rejoin_pending for m in group_members))

    try:
        await wait_until(lambda: converged(members), timeout_s=90, message="four members")
        leader = max(range(4), key=lambda i: (assignors[i].led, i))
        follower = next(i for i in range(4) if i != leader)
        staying = [members[i] for i in range(4) if i not in (leader, follower)]
        # The follower leaves; once the others are joining the round that starts, the leader
        # leaves too: the moment a departed leader would wedge the group.
        await wait_for_formed_group(members[follower], SESSION_MS / 1000, "follower")
        await members[follower].stop()
        await wait_until(lambda: any(m.rebalancing for m in staying), timeout_s=60,
                         interval_s=0.01, message="a round under way")
        await wait_for_formed_group(members[leader], SESSION_MS / 1000, "leader")
        await members[leader].stop()
        await wait_until(lambda: converged(staying), timeout_s=90,
                         message="the two staying members share the four partitions")
    finally:
        for member in members:
            await member.stop()
