"""A member whose membership the broker ended (its session expired while it was stopped:
its generation reset) loses its partitions before it rejoins: the cooperative coordinator
calls the listener's ``on_partitions_lost``, and the listener stops the tasks uncommitted,
so that the member writes no output older than the new owner's (no broker)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from aiokafka.structs import TopicPartition

from streams.kafka.cooperative import CooperativeGroupCoordinator
from tests.unit.streams.fakes import assign, rig

TP = TopicPartition("orders", 4)


class _Listener:
    def __init__(self) -> None:
        self.lost: list[set[TopicPartition]] = []
        self.revoked: list[set[TopicPartition]] = []

    async def on_partitions_lost(self, partitions: set[TopicPartition]) -> None:
        self.lost.append(set(partitions))

    async def on_partitions_revoked(self, partitions: set[TopicPartition]) -> None:
        self.revoked.append(set(partitions))


class _Coordinator(CooperativeGroupCoordinator):
    """Only what ``_on_join_prepare`` touches: a cooperative assignor and the subscription."""

    def __init__(self, generation: int, listener: _Listener) -> None:  # no client, no tasks
        self.group_id = "app"
        self.generation = generation
        self._assignors = [SimpleNamespace(cooperative=True)]
        self._subscription = SimpleNamespace(listener=listener)
        self._group_instance_id = "w3"


@pytest.mark.parametrize("generation", [-1, 7])
async def test_a_member_whose_membership_ended_loses_its_partitions_before_it_rejoins(
        generation: int) -> None:
    """Expired (generation reset): lost. Asked to rejoin (a live member): it keeps them and
    goes on processing through the round."""
    listener = _Listener()
    await _Coordinator(generation, listener)._on_join_prepare(SimpleNamespace(tps={TP}))
    assert listener.lost == ([{TP}] if generation == -1 else [])
    assert listener.revoked == []


async def test_the_listener_stops_lost_tasks_without_committing(tmp_path: Path) -> None:
    r = rig(tmp_path)
    try:
        await assign(r, ("0_0", "0_1"))
        assert set(r.thread.registry.active) == {"0_0", "0_1"}
        commits = len(r.consumer.commits)
        await r.thread.listener.on_partitions_lost(set(r.consumer.assigned))
        assert not r.thread.registry.active and not r.thread.registry.restoring
        assert r.thread.listener.awaiting_assignment  # fetched batches are dropped meanwhile
        assert len(r.consumer.commits) == commits
        await assign(r, ("0_1",))  # the round gives one back: it runs again
        assert set(r.thread.registry.active) == {"0_1"}
    finally:
        r.thread.task_manager.close_all()
