"""A member whose membership the broker ended (its session expired while it was stopped:
its generation reset) loses its partitions before it rejoins: the cooperative coordinator
calls the listener's ``on_partitions_lost``, and the listener stops the tasks uncommitted;
until then, and while nothing has confirmed the member for a session, the driver hands out
no fetched record. So the member writes no output older than the new owner's (no broker)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from aiokafka.structs import TopicPartition

from streams.kafka.cooperative import CooperativeGroupCoordinator
from streams.kafka.driver import GroupConsumer
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


class FencedError(Exception):
    pass


class _Coordinator(CooperativeGroupCoordinator):
    """Only what ``_on_join_prepare`` touches: a cooperative assignor and the subscription."""

    def __init__(self, generation: int, listener: _Listener | None = None,
                 owned: frozenset[TopicPartition] = frozenset({TP})) -> None:  # no client
        self.group_id = "app"
        self.generation = generation
        self._assignors = [SimpleNamespace(cooperative=True)]
        self._subscription = SimpleNamespace(
            listener=listener,
            subscription=SimpleNamespace(assignment=SimpleNamespace(tps=set(owned))))
        self._group_instance_id = "w3"
        self._session_timeout_ms = 10_000
        self.pending: Exception | None = None

    def check_errors(self) -> None:
        if self.pending is not None:
            raise self.pending


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


def test_a_member_is_in_doubt_once_expired_or_unconfirmed_for_a_session() -> None:
    member = _Coordinator(7)
    assert not member.membership_in_doubt(now=100.0)  # never confirmed yet: just joined
    member.confirmed_at = 95.0
    assert not member.membership_in_doubt(now=100.0)
    assert member.membership_in_doubt(now=105.1)  # SIGCONT after a stop past the session
    member.confirmed_at = 104.0  # its heartbeat was answered: a member after all
    assert not member.membership_in_doubt(now=105.1)
    member.generation = -1  # ... or the broker said it knows it no more
    assert member.membership_in_doubt(now=105.1)
    assert not _Coordinator(-1, owned=frozenset()).membership_in_doubt(now=105.1)


class _Fetching:
    def __init__(self, coordinator: _Coordinator) -> None:
        self._coordinator = coordinator
        self.fetches = 0

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list]:
        self.fetches += 1
        return {TP: [1, 2, 3]}


async def test_the_driver_holds_fetched_records_while_the_membership_is_in_doubt() -> None:
    member = _Coordinator(-1)
    fetching = _Fetching(member)
    consumer = GroupConsumer(fetching)  # type: ignore[arg-type]
    assert await consumer.getmany(timeout_ms=0, max_records=10) == {}
    assert fetching.fetches == 0  # left in the fetcher: nothing read, nothing dropped
    member.generation = 8  # the next round made it a member again
    assert await consumer.getmany(timeout_ms=0, max_records=10) == {TP: [1, 2, 3]}


async def test_a_fenced_member_hears_of_it_while_its_records_are_held() -> None:
    """The group's errors come through getmany: a frozen duplicate of a static member whose
    place a newcomer took learns it is fenced, and stops, while its records are held."""
    member = _Coordinator(-1)
    member.pending = FencedError()
    consumer = GroupConsumer(_Fetching(member))  # type: ignore[arg-type]
    with pytest.raises(FencedError):
        await consumer.getmany(timeout_ms=0, max_records=10)
