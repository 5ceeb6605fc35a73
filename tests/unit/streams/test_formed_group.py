"""A leaving member leaves only from a formed group (the leader wedge): the decision and the
wait over a fake member, without a broker."""

from __future__ import annotations

import asyncio

from streams.quirks.formed_group import Step, next_step, wait_for_formed_group


def test_leaves_when_its_heartbeat_is_answered_without_error() -> None:
    assert next_step(None, now=0, deadline=10) is Step.LEAVE


def test_leaves_when_it_is_not_a_member() -> None:
    assert next_step("UnknownMemberIdError", now=0, deadline=10) is Step.LEAVE
    assert next_step("NOT_A_MEMBER", now=0, deadline=10) is Step.LEAVE


def test_joins_the_round_while_the_group_is_forming() -> None:
    assert next_step("RebalanceInProgressError", now=0, deadline=10) is Step.JOIN_ROUND
    assert next_step("IllegalGenerationError", now=0, deadline=10) is Step.JOIN_ROUND
    assert next_step("RequestTimedOutError", now=0, deadline=10) is Step.JOIN_ROUND


def test_leaves_anyway_after_the_session_timeout() -> None:
    assert next_step("RebalanceInProgressError", now=10, deadline=10) is Step.LEAVE_ANYWAY


class FakeMember:
    """Answers heartbeats from a script; a requested rejoin runs as a round of ``round_polls``
    polls."""

    def __init__(self, answers: list[str | None], round_polls: int = 3) -> None:
        self.answers = list(answers)
        self.heartbeats = 0
        self.rejoins = 0
        self.round_polls = round_polls
        self._round_left = 0
        self.rejoin_pending = False

    @property
    def rebalancing(self) -> bool:
        # Each look at the member advances the round, the way the coordinator's task would.
        if self.rejoin_pending:
            self.rejoin_pending = False
            self._round_left = self.round_polls
        if self._round_left:
            self._round_left -= 1
            return True
        return False

    def request_rejoin(self) -> None:
        self.rejoins += 1
        self.rejoin_pending = True

    async def heartbeat(self) -> str | None:
        self.heartbeats += 1
        return self.answers.pop(0) if self.answers else None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_a_formed_group_costs_one_heartbeat() -> None:
    member = FakeMember([None])
    step = asyncio.run(wait_for_formed_group(member, 30, poll_s=0))
    assert step is Step.LEAVE
    assert (member.heartbeats, member.rejoins) == (1, 0)


def test_takes_part_in_the_round_before_leaving() -> None:
    member = FakeMember(["RebalanceInProgressError", "RebalanceInProgressError", None])
    step = asyncio.run(wait_for_formed_group(member, 1_000, poll_s=0))
    assert step is Step.LEAVE
    assert member.heartbeats == 3
    assert member.rejoins == 2
    assert not member.rebalancing


def test_does_not_ask_again_for_a_round_already_pending() -> None:
    member = FakeMember(["RebalanceInProgressError", None])
    member.rejoin_pending = True
    asyncio.run(wait_for_formed_group(member, 1_000, poll_s=0))
    assert member.rejoins == 0


def test_leaves_anyway_when_the_group_never_forms() -> None:
    member = FakeMember(["RebalanceInProgressError"] * 1_000, round_polls=1)
    clock = Clock()
    step = asyncio.run(wait_for_formed_group(member, 20, clock=clock, poll_s=0))
    assert step is Step.LEAVE_ANYWAY
    assert clock.now >= 20
    assert member.heartbeats < 20
