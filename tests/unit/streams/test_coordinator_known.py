"""The group's coordinator as the member's consumer knows it: since when it has had the one it
has (after a broker's SIGKILL, a transactional call still waiting on the old one long after
that is given up)."""

from __future__ import annotations

import asyncio

from streams.kafka.cooperative import CooperativeGroupCoordinator


def _coordinator() -> CooperativeGroupCoordinator:
    coordinator = CooperativeGroupCoordinator.__new__(CooperativeGroupCoordinator)  # no client
    coordinator.group_id = "app"
    coordinator.coordinator_id = None
    return coordinator


async def test_the_member_knows_since_when_it_has_its_coordinator() -> None:
    coordinator = _coordinator()
    assert coordinator.coordinator_known_since is None
    coordinator.coordinator_id = 1  # discovered, as aiokafka sets it
    coordinator._coordinator_dead_fut = asyncio.get_running_loop().create_future()
    first = coordinator.coordinator_known_since
    assert first is not None and coordinator.coordinator_id == 1
    coordinator.coordinator_id = 1  # the same one again: still known since then
    assert coordinator.coordinator_known_since == first
    coordinator.coordinator_dead()  # aiokafka marks it dead: none is known
    assert coordinator.coordinator_id is None and coordinator.coordinator_known_since is None
    coordinator.coordinator_id = 3
    since = coordinator.coordinator_known_since
    assert since is not None and since >= first


async def test_a_coordinator_found_again_on_the_same_node_has_not_moved() -> None:
    # A new coordinator still loading answers COORDINATOR_LOAD_IN_PROGRESS: aiokafka marks it
    # dead and finds it again, on the same node, many times a second.
    coordinator = _coordinator()
    assert coordinator.coordinator_found_at is None
    coordinator.coordinator_id = 1
    coordinator._coordinator_dead_fut = asyncio.get_running_loop().create_future()
    first = coordinator.coordinator_found_at
    assert first is not None
    coordinator.coordinator_dead()
    coordinator.coordinator_id = 1
    assert coordinator.coordinator_found_at == first
    coordinator._coordinator_dead_fut = asyncio.get_running_loop().create_future()
    coordinator.coordinator_dead()
    assert coordinator.coordinator_found_at == first  # none now: the last find stays
    coordinator.coordinator_id = 2  # moved
    moved = coordinator.coordinator_found_at
    assert moved is not None and moved >= first
    coordinator.coordinator_id = 2
    assert coordinator.coordinator_found_at == moved


async def test_the_member_knows_when_it_last_lost_its_coordinator() -> None:
    coordinator = _coordinator()
    assert coordinator.coordinator_lost_at is None
    coordinator.coordinator_id = None  # none known yet: nothing was lost
    assert coordinator.coordinator_lost_at is None
    coordinator.coordinator_id = 1
    coordinator._coordinator_dead_fut = asyncio.get_running_loop().create_future()
    coordinator.coordinator_dead()
    lost = coordinator.coordinator_lost_at
    assert lost is not None
    coordinator.coordinator_id = 1  # found again: the loss stays on record
    assert coordinator.coordinator_lost_at == lost
