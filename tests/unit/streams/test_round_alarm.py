"""The round alarm: a member that hears its group has begun a round makes the process's other
members, and the other instances, join it at once rather than at their next heartbeats."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.protocol.group import HeartbeatRequest

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

    def join_begun_round(self, begun_after: int) -> bool:
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
    assert decode_round_begun(encode_round_begun(12)) == 12
    for raw in (b"\xc1", encode_round_begun(-3), b"\xc3"):  # not msgpack, negative, a bool
        with pytest.raises(ValueError):
            decode_round_begun(raw)


@dataclass
class Answer:
    error_code: int


async def test_a_heartbeat_answered_rebalance_in_progress_tells_the_alarm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    coordinator = CooperativeGroupCoordinator.__new__(CooperativeGroupCoordinator)  # no client
    coordinator.generation = 9
    told: list[int] = []
    coordinator.on_round_heard = told.append
    answers = [Answer(0), Answer(REBALANCE_IN_PROGRESS)]

    async def answer(self: Any, request: Any) -> Answer:
        return answers.pop(0)

    monkeypatch.setattr(GroupCoordinator, "_send_req", answer)
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
