"""A member whose membership the broker ended (its session expired while it was stopped:
its generation reset) loses its partitions before it rejoins: the cooperative coordinator
calls the listener's ``on_partitions_lost``, and the listener stops the tasks uncommitted;
until then, and while nothing has confirmed the member for a session, the driver hands out
no fetched record. A member whose own process did not run for longer than its session (a
SIGSTOP) does the same as it resumes, whatever the broker answers: Tansu may keep a member
stopped in a forming round in the group and tell it nothing. So the member writes no output
older than the new owner's (no broker)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.structs import TopicPartition

from streams.kafka.cooperative import CooperativeGroupCoordinator
from streams.kafka.driver import GroupConsumer
from streams.kafka.silence import SilenceWatch
from tests.conftest import wait_until
from tests.unit.streams.fakes import SINK, SOURCE, assign, record, rig

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
        self.rejoin_requested = False

    def request_rejoin(self) -> None:
        self.rejoin_requested = True

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


def test_the_silence_watch_measures_the_event_loop_s_gaps() -> None:
    watch = SilenceWatch(session_s=10.0)
    assert watch.tick(100.0) is None and not watch.silent(105.0)
    assert watch.tick(109.0) is None  # a slow loop, far below the session
    assert watch.silent(119.5)  # stopped: what a check sees before the watch's turn
    assert watch.tick(119.5) == pytest.approx(10.5)
    assert not watch.silent(120.0)  # told once


def _stopped_for(member: _Coordinator, seconds: float) -> None:
    """The member's event loop last ran ``seconds`` ago: its process was stopped since."""
    member._silence = SilenceWatch(member._session_timeout_ms / 1000,
                                   alive_at=time.monotonic() - seconds)


async def test_a_member_silent_past_its_session_loses_its_partitions_whatever_the_broker_says(
) -> None:
    """Stopped (SIGSTOP) in a forming round for longer than its session, it resumes with the
    generation it had: no broker error tells it anything (Tansu). Its own silence does."""
    listener = _Listener()
    member = _Coordinator(7, listener)
    member.confirmed_at = time.monotonic()  # a heartbeat answered after the SIGCONT
    _stopped_for(member, 25.0)
    assert member.membership_in_doubt()  # held from the first instant it runs again
    await member._on_join_prepare(SimpleNamespace(tps={TP}))
    assert listener.lost == [{TP}] and listener.revoked == []
    assert member.generation == -1 and member.rejoin_requested
    await member._on_join_prepare(SimpleNamespace(tps={TP}))
    assert listener.lost == [{TP}]  # lost once


async def test_a_member_that_ran_keeps_its_partitions() -> None:
    """A slow loop, or a long round it waited in while running: nothing is lost."""
    listener = _Listener()
    member = _Coordinator(7, listener)
    _stopped_for(member, 9.0)
    await member._on_join_prepare(SimpleNamespace(tps={TP}))
    assert listener.lost == [] and member.generation == 7


def test_a_member_waiting_in_a_long_round_is_not_in_doubt() -> None:
    """The broker keeps a member waiting for a round's answers; it sends no heartbeat then."""
    member = _Coordinator(7)
    member.confirmed_at = 95.0
    member._awaiting_round = 1
    assert not member.membership_in_doubt(now=130.0)
    member._awaiting_round = 0
    assert member.membership_in_doubt(now=130.0)


async def test_the_watch_loses_a_silent_member_s_partitions_at_its_first_turn() -> None:
    listener = _Listener()
    member = _Coordinator(7, listener)
    member._silenced(25.0)
    assert member.membership_in_doubt()  # until the loss is done ...
    assert member._silent_loss is not None
    await member._silent_loss
    assert listener.lost == [{TP}] and member.generation == -1
    assert member.membership_in_doubt()  # ... and then until a round makes it a member again


async def test_a_thread_in_doubt_processes_ships_and_commits_nothing(tmp_path: Path) -> None:
    """Batches fetched before the doubt (a process stopped inside its fetch) go back to the
    fetcher unprocessed; once the member is confirmed, they are processed."""
    r = rig(tmp_path, commit_interval_ms=1)
    run = asyncio.create_task(r.thread.run([SOURCE]))
    try:
        await assign(r, ("0_0",))
        r.consumer.membership_in_doubt = True
        commits = len(r.consumer.commits)
        batch = {TopicPartition(SOURCE, 0): [record(0, 5, "a"), record(0, 6, "a")]}
        r.consumer.feed(batch)
        await wait_until(lambda: r.consumer.given_back, timeout_s=5, message="given back")
        assert r.consumer.seeks[TopicPartition(SOURCE, 0)] == 5
        assert r.thread.tasks["0_0"].records_processed == 0
        assert r.producer.to(SINK) == [] and len(r.consumer.commits) == commits
        r.consumer.membership_in_doubt = False
        r.consumer.feed(batch)  # fetched again from where it was given back
        await wait_until(lambda: len(r.producer.to(SINK)) == 2, timeout_s=5,
                         message="processed once confirmed")
    finally:
        r.thread.stop()
        await asyncio.wait_for(run, 15)


def _described(holder: str) -> object:
    from streams.kafka.membership import GroupDescription, GroupMember
    return GroupDescription("app", "PreparingRebalance", "consumer",
                            (GroupMember(holder, "client", "/127.0.0.1", "w3"),))


@pytest.mark.parametrize(("holder", "replaced"), [
    ("w3-new", False),  # this member, under the id it rejoined with after the loss
    ("w3-lost", False),  # the broker still lists the lost id
    ("w3-other", True),  # another process joined with the instance id
])
async def test_a_static_member_that_rejoined_after_a_loss_is_not_fenced_by_itself(
        monkeypatch: pytest.MonkeyPatch, holder: str, replaced: bool) -> None:
    """A member stopped past its session rejoins: its first JoinGroup, with the lost member
    id, is refused; the next one joins with a new id. Its next round checks who holds its
    instance id, and finds itself there: that is no fencing (a soak's resumed worker had
    stopped on it)."""
    from streams.kafka import cooperative
    from streams.kafka.membership import FencedMemberError

    async def describe(_client: object, _group: str) -> object:
        return _described(holder)

    monkeypatch.setattr(cooperative, "describe_group", describe)
    coordinator = _Coordinator(7)
    coordinator._client = None
    coordinator._lost_member_id = "w3-lost"
    coordinator.member_id = "w3-new"
    if replaced:
        with pytest.raises(FencedMemberError):
            await coordinator._check_not_replaced()
    else:
        await coordinator._check_not_replaced()
        await coordinator._check_not_replaced()  # checked once per loss, then nothing


class _Subscription(SimpleNamespace):
    def assign_from_subscribed(self, partitions: set[TopicPartition]) -> None:
        self.subscription = SimpleNamespace(assignment=SimpleNamespace(tps=set(partitions)))


class _Assigned(_Listener):
    def __init__(self) -> None:
        super().__init__()
        self.assigned: list[set[TopicPartition]] = []

    async def on_partitions_assigned(self, partitions: set[TopicPartition]) -> None:
        self.assigned.append(set(partitions))


@pytest.mark.parametrize("ended_by", ["its own silence", "the broker",
                                      "its silence, then a JoinGroup answer"])
async def test_a_round_s_answer_read_after_the_membership_ended_is_not_taken_up(
    ended_by: str,
) -> None:
    """A leader stopped (SIGSTOP) for 25 s as it waited for its SyncGroup answer read that
    answer as it resumed, and took up its assignment: three tasks another member had run
    since started beside their owner. The membership ended during the round, so the answer
    is the round's of before: the member loses what it held, takes nothing up, rejoins."""
    listener = _Assigned()
    member = _Coordinator(7, listener)
    member._subscription = _Subscription(
        listener=listener, subscription=SimpleNamespace(assignment=SimpleNamespace(tps={TP})))
    member.rebalancing = True
    member.round_started = time.monotonic() - 30.0  # its JoinGroup was sent before the stop
    if ended_by == "its own silence":
        _stopped_for(member, 25.0)
    elif ended_by == "the broker":
        member.generation = -1  # a heartbeat answered UNKNOWN_MEMBER_ID meanwhile
    else:
        # The watch found the silence as the process resumed; the JoinGroup answer, read
        # next, set a generation again (Tansu answered the round it had kept it in).
        member._silenced(25.0)
        assert member._silent_loss is not None
        await member._silent_loss
        member.generation = 8
    await member._on_join_complete(member.generation, "member-1", "relay", b"")
    assert listener.lost == [{TP}] and listener.assigned == [] and listener.revoked == []
    assert member._subscription.subscription.assignment.tps == set()
    assert member.rejoin_requested and not member.rebalancing and member.generation == -1


async def test_a_member_silent_past_its_session_joins_again_only_after_its_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Resumed (SIGCONT) while the others were handing a task over to a learner, its
    JoinGroup made their SyncGroups vain on the embedded broker: the moved task stalled two
    rounds more. Its next JoinGroup (a round it joined before it froze may still end first)
    now awaits the others' round; a member that ran does not wait."""
    events: list[str] = []

    async def wait() -> None:
        events.append("waited")

    async def join(self: Any, subscription: Any) -> bool:
        events.append("joined")
        return True

    monkeypatch.setattr(GroupCoordinator, "_do_rejoin_group", join)
    member = _Coordinator(7, _Listener())
    member._awaiting_round = 0
    member.before_rejoin_after_silence = wait
    assert await member._do_rejoin_group(None)
    assert events == ["joined"]  # asked to rejoin while it ran: no wait
    member._silenced(25.0)
    assert await member._do_rejoin_group(None)
    assert events == ["joined", "waited", "joined"]
    assert await member._do_rejoin_group(None)
    assert events == ["joined", "waited", "joined", "joined"]  # once per silence
    assert member._silent_loss is not None
    await member._silent_loss


async def test_a_member_frozen_in_a_round_is_not_taken_for_stuck_joining_it() -> None:
    """Its join watch asked the leader for a round at once as it resumed (it had been "joining
    for 34 s"), and the others' extra round held its own join back."""
    member = _Coordinator(7, _Listener())
    member.rebalancing, member.rebalancing_since = True, time.monotonic() - 30.0
    member._silenced(25.0)
    assert time.monotonic() - (member.rebalancing_since or 0.0) < 1.0
    assert member._silent_loss is not None
    await member._silent_loss
