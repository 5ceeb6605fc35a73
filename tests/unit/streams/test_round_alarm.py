"""The round alarm: a member that hears its group has begun a round makes the process's other
members, and the other instances, join it at once rather than at their next heartbeats."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiokafka.errors as Errors
import msgpack
import pytest
from aiokafka.client import ConnectionGroup
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.protocol.group import HeartbeatRequest, JoinGroupRequest, SyncGroupRequest

from streams.group.round_alarm import (
    RoundAlarm,
    decode_round_begun,
    encode_round_begun,
    should_join,
)
from streams.kafka.cooperative import REBALANCE_IN_PROGRESS, CooperativeGroupCoordinator
from tests.unit.streams.fakes import rig


@dataclass
class Member:
    generation: int
    rebalancing: bool = False
    stopping: bool = False
    rejoins: int = 0

    def join_begun_round(self, begun_after: int, begun: bool = True) -> bool:
        if self.stopping or not should_join(self.generation, self.rebalancing, begun_after):
            return False
        self.rejoins += 1
        return True


def test_only_a_member_of_the_ending_generation_not_yet_joining_joins() -> None:
    assert should_join(4, False, 4)
    assert not should_join(4, True, 4)  # joining already
    assert not should_join(3, False, 4)  # not in that generation: not in the round
    assert not should_join(5, False, 4)  # past it: the news is old
    assert not should_join(-1, False, -1)  # not a member yet


def test_the_first_to_hear_wakes_its_process_and_announces_once_per_round() -> None:
    announced: list[int] = []
    alarm = RoundAlarm(announce=announced.append)
    heard, other, later, joining = Member(4), Member(4), Member(5), Member(4, rebalancing=True)
    for member in (heard, other, later, joining):
        alarm.register(member)
    alarm.heard(4)
    alarm.heard(4)  # another thread's heartbeat, same round
    assert announced == [4]
    assert (heard.rejoins, other.rejoins, later.rejoins, joining.rejoins) == (1, 1, 0, 0)
    alarm.heard(5)
    assert announced == [4, 5]


def test_a_round_the_process_began_is_announced_even_after_one_of_the_same_generation(
) -> None:
    """A broker that keeps the generation over rounds (Tansu) would have a removal's round go
    untold: its generation's round was announced before."""
    announced: list[int] = []
    alarm = RoundAlarm(announce=announced.append)
    member = Member(4)
    alarm.register(member)
    alarm.heard(4)
    member.rebalancing = False  # that round ended, in generation 4 again
    alarm.began(4)
    assert announced == [4, 4] and member.rejoins == 2
    alarm.heard(4)  # the others' heartbeats tell of the round the process began
    alarm.began(-1)  # not a member
    assert announced == [4, 4]


def test_news_from_another_instance_wakes_without_announcing_again() -> None:
    announced: list[int] = []
    alarm = RoundAlarm(announce=announced.append)
    member = Member(7)
    alarm.register(member)
    assert alarm.wake(7) == 1
    assert alarm.wake(6) == 0
    assert announced == [] and member.rejoins == 1


def test_a_round_begun_record_round_trips_and_garbage_is_refused() -> None:
    assert decode_round_begun(encode_round_begun(12)) == (12, True)
    assert decode_round_begun(encode_round_begun(12, begun=False)) == (12, False)
    # A begun round's record is the generation alone, as members before the distinction
    # wrote and read it.
    assert encode_round_begun(12) == msgpack.packb(12)
    for raw in (b"\xc1", encode_round_begun(-3), b"\xc3",  # not msgpack, negative, a bool
                msgpack.packb([12, "yes"]), msgpack.packb([True, False])):
        with pytest.raises(ValueError):
            decode_round_begun(raw)


@dataclass
class Answer:
    error_code: int


def answering(monkeypatch: pytest.MonkeyPatch, generation: int, answers: list[Answer],
              told: list[int]) -> CooperativeGroupCoordinator:
    """A coordinator of ``generation`` (no client) whose requests get ``answers`` in turn and
    whose round news goes to ``told``."""
    coordinator = CooperativeGroupCoordinator.__new__(CooperativeGroupCoordinator)
    coordinator.generation = generation
    coordinator.on_round_heard = told.append

    async def answer(self: Any, request: Any) -> Answer:
        return answers.pop(0)

    monkeypatch.setattr(GroupCoordinator, "_send_req", answer)
    return coordinator


async def test_a_heartbeat_answered_rebalance_in_progress_tells_the_alarm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    told: list[int] = []
    coordinator = answering(monkeypatch, 9, [Answer(0), Answer(REBALANCE_IN_PROGRESS)], told)
    request = HeartbeatRequest("app", 9, "member")
    await coordinator._send_req(request)
    assert told == []
    await coordinator._send_req(request)
    assert told == [9]


async def test_a_member_asking_for_a_round_sounds_the_alarm(tmp_path: Path) -> None:
    # A leader that asked for a follow-up round froze (SIGSTOP) in Tansu's forming round,
    # which never told the others by their heartbeats: they ran on without its tasks for 53 s.
    # Told at once, they are in the round, and their join watch removes the frozen member.
    r = rig(tmp_path)
    asked: list[int] = []
    r.thread.member.round_asked = asked.append
    r.consumer.generation = 4
    r.thread.member.request_rejoin("learners ready")
    assert asked == [4]


async def test_a_sync_given_up_for_the_round_after_it_fails_as_a_rebalance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tansu answers a SyncGroup that the next round made vain only at 0.8 of a session: the
    member joined that round 8 s after the others, its SyncGroup then went vain too, and
    three static members formed no group for two minutes. Given up at the news of the round,
    the member joins it with the others (aiokafka rejoins after a failed SyncGroup)."""
    coordinator = CooperativeGroupCoordinator.__new__(CooperativeGroupCoordinator)  # no client
    coordinator.generation = 6
    coordinator.group_id = "app"
    coordinator.coordinator_id = 3
    closed: list[Any] = []
    conn = SimpleNamespace(close=lambda reason: closed.append(reason))
    coordinator._client = SimpleNamespace(_conns={(3, ConnectionGroup.COORDINATION): conn})
    answered: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()

    async def answer(self: Any, request: Any) -> Answer:
        return await answered

    monkeypatch.setattr(GroupCoordinator, "_send_req", answer)
    request = SyncGroupRequest("app", 6, "member", "w1", [])
    sync = asyncio.ensure_future(coordinator._send_req(request))
    await asyncio.sleep(0)
    assert not coordinator.abandon_sync(5, "an older round")  # not the one it waits for
    assert coordinator.abandon_sync(6, "the round after it has begun")
    with pytest.raises(Errors.RebalanceInProgressError, match="generation 6 given up"):
        await sync
    # A broker answers a connection's requests in order: the JoinGroup that follows goes on
    # a new one, not behind the SyncGroup given up.
    assert len(closed) == 1
    assert not coordinator.abandon_sync(6, "again")  # nothing waits any more
    await asyncio.sleep(0)
    assert answered.cancelled()  # the request is given up, not failed (no lost coordinator)


async def test_a_sync_answered_in_time_is_not_given_up_and_a_vain_one_tells_the_alarm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    told: list[int] = []
    coordinator = answering(monkeypatch, 6, [Answer(0), Answer(REBALANCE_IN_PROGRESS)], told)
    request = SyncGroupRequest("app", 6, "member", "w1", [])
    assert (await coordinator._send_req(request)).error_code == 0
    assert not coordinator.abandon_sync(6, "too late")
    assert told == []
    # Answered REBALANCE_IN_PROGRESS: the group began a round while it waited; the others
    # still waiting for their answers are told.
    assert (await coordinator._send_req(request)).error_code == REBALANCE_IN_PROGRESS
    assert told == [6]


async def test_a_member_waiting_for_its_sync_answer_gives_it_up_at_the_news_of_the_round(
        tmp_path: Path) -> None:
    r = rig(tmp_path)
    member = r.thread.member
    r.consumer.generation, r.consumer.rebalancing = 4, True
    r.consumer.pending_sync = 4
    assert not member.join_begun_round(3)  # an older round: not its own
    # A round only asked for begins after the asker's own answer: not vain yet.
    assert not member.join_begun_round(4, begun=False)
    assert r.consumer.abandoned_syncs == []
    assert member.join_begun_round(4)
    assert r.consumer.abandoned_syncs == [4] and r.consumer.rejoins == 0
    # Joining, with no SyncGroup waiting (its JoinGroup is): nothing to give up.
    assert not member.join_begun_round(4)


def test_an_asked_round_wakes_the_members_but_is_announced_and_heard_as_asked() -> None:
    """A member that asks for a round makes the others join it at once; a SyncGroup still
    waiting for its answer is given up only once the broker has begun that round."""
    announced: list[tuple[Any, ...]] = []
    alarm = RoundAlarm(announce=lambda *news: announced.append(news))
    woken: list[tuple[int, bool]] = []

    @dataclass
    class Recorder:
        def join_begun_round(self, begun_after: int, begun: bool = True) -> bool:
            woken.append((begun_after, begun))
            return True

    alarm.register(Recorder())
    alarm.asked(4)
    alarm.asked(4)  # once per round
    assert announced == [(4, False)] and woken == [(4, False)]
    alarm.heard(4)  # the broker's news of it, from a heartbeat: told again, as begun
    assert announced == [(4, False), (4,)] and woken == [(4, False), (4, True)]


async def test_a_follower_waiting_for_its_sync_answer_names_its_round_s_leader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The join watch gives a SyncGroup up once its round's leader is silent past its session:
    the coordinator tells which leader a pending SyncGroup waits on (never itself)."""
    coordinator = CooperativeGroupCoordinator.__new__(CooperativeGroupCoordinator)  # no client
    coordinator.generation = 6
    coordinator.member_id = "w1-thread-0-m"
    answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    joined = SimpleNamespace(error_code=0, leader_id="w3-thread-0-l")
    join = JoinGroupRequest("app", 10_000, 10_000, "w1-thread-0-m", "w1", "consumer", [])

    async def answer(self: Any, request: Any) -> Any:
        return joined if isinstance(request, JoinGroupRequest) else await answered

    monkeypatch.setattr(GroupCoordinator, "_send_req", answer)
    assert coordinator.pending_sync_leader() is None
    await coordinator._send_req(join)
    assert coordinator.pending_sync_leader() is None  # no SyncGroup waits yet
    sync = asyncio.ensure_future(coordinator._send_req(
        SyncGroupRequest("app", 6, "w1-thread-0-m", "w1", [])))
    await asyncio.sleep(0)
    assert coordinator.pending_sync_leader() == (6, "w3-thread-0-l")
    answered.set_result(SimpleNamespace(error_code=0))
    await sync
    assert coordinator.pending_sync_leader() is None
    joined.leader_id = "w1-thread-0-m"  # it leads: its own assignment is what the round waits on
    await coordinator._send_req(join)
    answered = asyncio.get_running_loop().create_future()
    sync = asyncio.ensure_future(coordinator._send_req(
        SyncGroupRequest("app", 6, "w1-thread-0-m", "w1", [])))
    await asyncio.sleep(0)
    assert coordinator.pending_sync_leader() is None
    answered.set_result(SimpleNamespace(error_code=0))
    await sync
