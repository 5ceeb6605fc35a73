"""The expiry probe: a member hears that a silent peer's session ended at once, not at its
next heartbeat."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import for_code

from streams.group.expiry_probe import (
    LATE_EXPIRY_MS,
    ROUND_BEGUN,
    STATUS_EVERY_MS,
    ExpiryProbe,
    ending_sessions,
    session_may_end,
)

SESSION_MS = 10_000
HEARTBEAT_MS = 1_000


@pytest.mark.parametrize(("silent_for_ms", "may_end"), [
    (0, False),
    (8_999, False),  # its last heartbeat came at most a heartbeat before its last status
    (9_000, True),
    (10_000, True),
    (SESSION_MS + STATUS_EVERY_MS + LATE_EXPIRY_MS, True),
    (SESSION_MS + STATUS_EVERY_MS + LATE_EXPIRY_MS + 1, False),  # its heartbeats take over
])
def test_when_a_silent_peer_s_session_may_end(silent_for_ms: int, may_end: bool) -> None:
    assert session_may_end(silent_for_ms, SESSION_MS, HEARTBEAT_MS) is may_end


def test_only_the_peers_whose_sessions_may_end_now() -> None:
    silences = {"w3-thread-0": 9_500, "w2-thread-0": 300, "w4-thread-0": 60_000}
    assert ending_sessions(silences, SESSION_MS, HEARTBEAT_MS) == ["w3-thread-0"]


def test_the_round_answer_is_named_as_the_driver_names_a_heartbeat_s_error() -> None:
    # The driver's heartbeat names an error by its class; REBALANCE_IN_PROGRESS is code 27.
    assert for_code(27).__name__ == ROUND_BEGUN


class FakeMember:
    """A member whose broker answers its heartbeats from a script."""

    def __init__(self, answers: list[str | None], generation: int = 4) -> None:
        self.answers = answers
        self.generation = generation
        self.rebalancing = False
        self.heartbeats = 0

    async def heartbeat(self) -> str | None:
        self.heartbeats += 1
        return self.answers.pop(0) if self.answers else None


async def no_wait(_seconds: float) -> None:
    await asyncio.sleep(0)


def probe_of(member: FakeMember, silences: dict[str, int],
             heard: list[int]) -> ExpiryProbe:
    return ExpiryProbe("w1-thread-0", member, lambda: dict(silences), SESSION_MS,
                       HEARTBEAT_MS, heard.append, sleep=no_wait)


async def test_a_peer_s_session_end_is_heard_at_the_first_probe_that_sees_the_round() -> None:
    member = FakeMember([None, None, ROUND_BEGUN])
    heard: list[int] = []
    probe = probe_of(member, {"w3-thread-0": 9_400, "w2-thread-0": 200}, heard)
    assert probe.check()
    assert not probe.check()  # one probing at a time
    await asyncio.wait_for(probe._probing, 1)  # type: ignore[arg-type]
    assert heard == [4]
    assert member.heartbeats == 3
    assert probe.rounds_heard == 1
    await probe.close()


async def test_no_probe_while_every_peer_publishes_or_is_long_gone() -> None:
    member = FakeMember([ROUND_BEGUN])
    heard: list[int] = []
    probe = probe_of(member, {"w2-thread-0": 800, "w3-thread-0": 45_000}, heard)
    assert not probe.check()
    assert member.heartbeats == 0 and heard == []


async def test_no_probe_while_the_member_joins_a_round_or_has_none() -> None:
    heard: list[int] = []
    joining = FakeMember([ROUND_BEGUN])
    joining.rebalancing = True
    assert not probe_of(joining, {"w3-thread-0": 9_500}, heard).check()
    unjoined = FakeMember([ROUND_BEGUN], generation=-1)
    assert not probe_of(unjoined, {"w3-thread-0": 9_500}, heard).check()
    assert heard == []


async def test_probing_stops_when_the_peer_publishes_again_or_the_member_joins() -> None:
    silences = {"w3-thread-0": 9_500}
    member = FakeMember([])
    heard: list[int] = []
    probe = probe_of(member, silences, heard)

    async def peer_back(_seconds: float) -> None:
        if member.heartbeats == 3:
            silences["w3-thread-0"] = 100  # back within its session: no round
        await asyncio.sleep(0)

    probe._sleep = peer_back
    assert probe.check()
    await asyncio.wait_for(probe._probing, 1)  # type: ignore[arg-type]
    assert member.heartbeats == 3 and heard == []

    silences["w3-thread-0"] = 9_500

    async def joins(_seconds: float) -> None:
        member.rebalancing = member.heartbeats >= 5  # its own heartbeat heard the round
        await asyncio.sleep(0)

    probe._sleep = joins
    assert probe.check()
    await asyncio.wait_for(probe._probing, 1)  # type: ignore[arg-type]
    assert member.heartbeats == 5 and heard == []


async def test_a_round_answer_for_a_generation_the_member_left_is_not_told() -> None:
    member = FakeMember([])

    async def answer_after_a_new_generation() -> str | None:
        member.generation = 5  # the member's own heartbeat took it into the next round
        return ROUND_BEGUN

    member.heartbeat = answer_after_a_new_generation  # type: ignore[method-assign]
    heard: list[int] = []
    probe = probe_of(member, {"w3-thread-0": 9_500}, heard)
    assert probe.check()

    async def stop(_seconds: float) -> None:
        member.rebalancing = True
        await asyncio.sleep(0)

    probe._sleep = stop
    await asyncio.wait_for(probe._probing, 1)  # type: ignore[arg-type]
    assert heard == []


async def test_a_peer_whose_end_a_round_followed_is_not_probed_for_again() -> None:
    # After the round its session's end began, the peer is still silent for a while within
    # the window: probing again would only repeat heartbeats.
    silences = {"w2-thread-0": 9_300}
    member = FakeMember([ROUND_BEGUN])
    heard: list[int] = []
    probe = probe_of(member, silences, heard)
    assert probe.check()
    await asyncio.wait_for(probe._probing, 1)  # type: ignore[arg-type]
    assert heard == [4]
    member.generation = 6  # the round, and its follow-up
    silences["w2-thread-0"] = 10_400
    assert not probe.check()
    # Silent since before a round only once: back, then silent again, it is probed for.
    silences["w2-thread-0"] = 200
    assert not probe.check()
    silences["w2-thread-0"] = 9_100
    member.answers = [ROUND_BEGUN]
    assert probe.check()
    await asyncio.wait_for(probe._probing, 1)  # type: ignore[arg-type]
    assert heard == [4, 6]


async def test_a_probe_that_fails_ends_without_raising() -> None:
    member = FakeMember([])

    async def broken() -> str | None:
        raise RuntimeError("no connection object")

    member.heartbeat = broken  # type: ignore[method-assign]
    heard: list[int] = []
    probe = probe_of(member, {"w3-thread-0": 9_500}, heard)
    assert probe.check()
    await asyncio.wait_for(probe._probing, 1)  # type: ignore[arg-type]
    assert probe._probing.exception() is None  # type: ignore[union-attr]
    assert heard == []
