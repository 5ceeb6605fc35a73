"""The round alarm: once one member hears that its group rebalances, every member joins.

On the classic protocol a member hears of a round only through its next heartbeat (or
commit), so members join a round up to one heartbeat interval apart, and the round, with
every task it moves or gives out again, waits for the last of them. The first member of an
instance to hear of the round (its heartbeat or its SyncGroup answered
``REBALANCE_IN_PROGRESS``), or to ask for one, tells the instance's other threads at once, and
the other instances through the control topic; a member still in the generation that the
round ends then joins it without waiting for its heartbeat, and one still waiting for its
SyncGroup answer of that generation gives that SyncGroup up and joins once the broker has
begun the round (a broker may answer it only at a timeout, by when the round has gone on
without the member); the news of a round a member only asked for says so, since that round
begins after the asker's own answer and the SyncGroups meanwhile are not vain. The news only ever
makes a member join a round that has begun or that its asker's rejoin begins: it changes
nothing in its subscription, so it never starts a round of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

log = logging.getLogger(__name__)

#: Key of the records in which a member tells the group a round has begun.
ROUND_BEGUN_KEY = b"__round_begun__"
#: How long an announcement may take before it is given up (a heartbeat does it then).
ANNOUNCE_TIMEOUT_S = 2.0


def encode_round_begun(generation: int, begun: bool = True) -> bytes:
    """A round-begun record: the generation alone for a round the broker has begun (what
    members before the distinction read), ``[generation, false]`` for one only asked for."""
    return msgpack.packb(generation if begun else [generation, False])


def decode_round_begun(raw: bytes) -> tuple[int, bool]:
    """The generation the round ends, and whether the broker has begun it (rather than a
    member only asked for it); raises ValueError for a malformed record."""
    try:
        value = msgpack.unpackb(raw)
    except Exception as exc:
        raise ValueError(f"not a round-begun record: {exc}") from None
    begun = True
    if isinstance(value, list) and len(value) == 2 and isinstance(value[1], bool):
        value, begun = value
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"not a generation: {value!r}")
    return value, begun


class RoundMember(Protocol):
    """A stream thread's member of the group, as the alarm sees it."""

    def join_begun_round(self, begun_after: int, begun: bool = True) -> bool:
        """Join the round begun after generation ``begun_after`` if it should
        (:func:`should_join`); whether it did. ``begun``: the broker has begun it, so a
        SyncGroup of that generation still waiting for its answer is vain."""
        ...


def should_join(generation: int, rebalancing: bool, begun_after: int) -> bool:
    """Whether a member in ``generation`` joins a round begun after ``begun_after``: only a
    member of that very generation not yet joining (an earlier or a later one is either not
    in the round or already past it)."""
    return generation == begun_after and generation >= 0 and not rebalancing


@dataclass
class RoundAlarm:
    """A process's side of the alarm, shared by its stream threads."""

    #: Sends the news to the other instances (the control topic): the generation, and False
    #: for a round only asked for; None: this process only.
    announce: Callable[..., None] | None = None
    members: list[RoundMember] = field(default_factory=list)
    #: The generations whose round this process announced already (once per round), each
    #: with whether it was begun or asked for.
    _announced: set[tuple[int, bool]] = field(default_factory=set)

    def register(self, member: RoundMember) -> None:
        self.members.append(member)

    def heard(self, generation: int, begun: bool = True) -> None:
        """A member of this process heard that the round after ``generation`` has begun
        (``begun`` False: a member of this process asked for it, and the broker begins it
        once that member's JoinGroup comes)."""
        news = (generation, begun)
        if generation < 0 or news in self._announced:
            return
        self._announced = {n for n in self._announced if n[0] > generation - 8} | {news}
        self.wake(generation, begun)
        if self.announce is not None:
            if begun:
                self.announce(generation)
            else:
                self.announce(generation, False)

    def asked(self, generation: int) -> None:
        """A member of this process asked for the round after ``generation``: the others
        join it at once, but a SyncGroup still waiting for its answer is not vain yet (the
        asker's JoinGroup follows its own answer)."""
        self.heard(generation, begun=False)

    def began(self, generation: int) -> None:
        """A member of this process knows first-hand that its group, in ``generation``, began
        a round: it began it (it removed members from the group), or its probe's heartbeat
        was answered so (:mod:`streams.group.expiry_probe`). Announced even when a round
        after that generation was announced before, since a broker may keep the generation
        over rounds (Tansu does, when only the leader rejoins), and such a round would go
        untold until the members' heartbeats."""
        if generation < 0:
            return
        self._announced.discard((generation, True))
        self.heard(generation)

    def wake(self, generation: int, begun: bool = True) -> int:
        """Make this process's members of ``generation`` join its round; how many did.
        ``begun``: the broker has begun it (False: a member asked for it)."""
        woken = sum(1 for member in self.members if member.join_begun_round(generation, begun))
        if woken:
            log.info("the round after generation %d has begun: %d member(s) of this process "
                     "join it at once", generation, woken)
        return woken


class RoundAnnouncer:
    """Tells the other instances, on the control topic, through a thread's producer (already
    connected: a new one would take longer than the heartbeat it saves)."""

    def __init__(self, producer: Any, control_topic: str) -> None:
        self.producer = producer
        self.control_topic = control_topic
        self._sending: set[asyncio.Task[None]] = set()

    def __call__(self, generation: int, begun: bool = True) -> None:
        task = asyncio.get_running_loop().create_task(self._send(generation, begun))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, generation: int, begun: bool) -> None:
        try:
            await asyncio.wait_for(self.producer.send_and_wait(
                self.control_topic, key=ROUND_BEGUN_KEY,
                value=encode_round_begun(generation, begun)), ANNOUNCE_TIMEOUT_S)
        except Exception as exc:  # the others hear of the round by their heartbeats
            log.info("could not announce the round after generation %d (%s: %s)", generation,
                     type(exc).__name__, exc)
