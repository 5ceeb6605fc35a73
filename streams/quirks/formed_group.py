"""Leaving only from a formed group: the check a member makes just before its LeaveGroup.

Broker quirk (Tansu 0.6): in a forming group, LeaveGroup removes the member but keeps it as
the group's leader, and a later JoinGroup sets a leader only when none is set. A leader that
leaves mid-round leaves the others in rounds led by a departed member: their SyncGroup is
answered REBALANCE_IN_PROGRESS and they rejoin without end. So a leaving member (a static
member that handed everything over, or a dynamic member whose consumer sends LeaveGroup on
stop) first sends a Heartbeat of its own. Answered without error, the group is formed and it
leaves. Answered REBALANCE_IN_PROGRESS (or another error that a round clears), it takes part in
the round first and asks again, until the session timeout, after which it leaves anyway. On
Apache Kafka this costs one heartbeat. What is left is one round trip of a window.

:func:`next_step` is the decision over plain data; :func:`wait_for_formed_group` runs it over
a member (the driver's :class:`~streams.kafka.driver.GroupConsumer`, or a fake in tests).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

#: Answers after which leaving cannot wedge the group: formed, or not a member at all.
SAFE_ANSWERS = frozenset({None, "NOT_A_MEMBER", "UnknownMemberIdError"})
#: How often a member waiting to leave looks whether the round it took part in is over.
POLL_S = 0.1


class Step(enum.Enum):
    LEAVE = "leave"
    JOIN_ROUND = "join the round first"
    LEAVE_ANYWAY = "leave anyway"


def next_step(answer: str | None, now: float, deadline: float) -> Step:
    """What a leaving member does after its own heartbeat was answered with ``answer`` (the
    error name, None for no error)."""
    if answer in SAFE_ANSWERS:
        return Step.LEAVE
    if now >= deadline:
        return Step.LEAVE_ANYWAY
    return Step.JOIN_ROUND


class GroupMember(Protocol):
    @property
    def rebalancing(self) -> bool: ...

    @property
    def rejoin_pending(self) -> bool: ...

    def request_rejoin(self) -> None: ...

    async def heartbeat(self) -> str | None: ...


async def wait_for_formed_group(
    member: GroupMember, timeout_s: float, name: str = "member",
    clock: Callable[[], float] = time.monotonic, poll_s: float | None = None,
) -> Step:
    """Return once ``member`` may leave: its heartbeat was answered without error, or the
    timeout passed (logged). Meanwhile it takes part in the rounds under way."""
    deadline = clock() + timeout_s
    poll_s = POLL_S if poll_s is None else poll_s
    while True:
        answer = await member.heartbeat()
        step = next_step(answer, clock(), deadline)
        if step is Step.LEAVE:
            return step
        if step is Step.LEAVE_ANYWAY:
            log.warning("%s: the group was not formed within %.0f s (last heartbeat: %s); "
                        "leaving anyway", name, timeout_s, answer)
            return step
        log.info("%s: heartbeat before leaving answered %s; taking part in the round first",
                 name, answer)
        if not (member.rebalancing or member.rejoin_pending):
            member.request_rejoin()
        # The coordinator rejoins on its own task; wait until that round completes.
        await asyncio.sleep(poll_s)
        while clock() < deadline and (member.rebalancing or member.rejoin_pending):
            await asyncio.sleep(poll_s)
