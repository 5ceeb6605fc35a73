"""A member stuck joining a round, and what it does about it whatever the broker does.

A healthy round ends within about one join round. A member still joining long after that is
held by something only the group can undo, so it acts, each remedy at most every so often:

- after about two rounds it asks the leader to rejoin (on the control topic): the leader
  rejoining starts a round that the group completes;
- after about one round it removes static members that are gone but that the broker still
  keeps in the group (:mod:`streams.quirks.departed_members`), which can hold a newcomer's round
  for good on a broker that keeps a departed leader;
- on such a broker it does not wait to be stuck once another member's status shows it
  silent for longer than a session timeout (for a member that led the group, and the
  broker's grace after it: the remover's ``removable_after_ms``): a member frozen (SIGSTOP)
  just after it joined a round stays in the rounds that follow, given tasks it never runs,
  until the broker's next look at sessions (seen on Tansu 17 s after the stop, with 10-s
  sessions), and a frozen leader's follow-up round was never told to the others at all. It
  looks as that silence passes the limit, not at its next tick, since the round waits on the
  look;
  once it removed some, it sounds the round alarm (:mod:`streams.group.round_alarm`), since
  the broker has begun a round without them;
- as soon as the round's leader, whose assignment its SyncGroup answer waits for, has been
  silent for longer than a session timeout (its status records), it gives that SyncGroup
  up and joins again: a leader frozen just as it began a round never sends the assignment,
  and a broker that answers a connection's requests in order (Tansu) tells the followers
  of the leader's expiry only when it gives their SyncGroups up, at 0.8 of a session
  (2.4 s after the expiry, in a static soak's SIGSTOP of the leader);
- at once, when other members' round reports show that its own SyncGroup answer was lost
  (:func:`streams.quirks.synced_round.sync_answer_lost` for :data:`LOST_SYNC_AFTER_S`), it asks the
  leader to rejoin, once per generation, and gives up its own SyncGroup if it still waits
  for the answer, so that it joins that round with the others: waiting the stall limit would
  stop its tasks for about two rounds more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from streams.group.group_learning import past_session

log = logging.getLogger(__name__)

#: How often a member stuck joining looks for departed members.
DEPARTED_CHECK_EVERY_S = 5.0
#: How far ahead a member looks for another's silence passing a session timeout: the
#: thread's housekeeping tick.
LOOK_AHEAD_MS = 1_000
#: How long after the silence passes the session the look comes (it must be past it).
PAST_SESSION_MARGIN_MS = 20
#: How long a member waits with the evidence of a lost SyncGroup answer before it acts:
#: followers' answers come within about a second of each other, and a report takes a
#: moment to arrive.
LOST_SYNC_AFTER_S = 3.0


class Joining(Protocol):
    def rebalancing_for_s(self, now: float) -> float: ...

    def abandon_sync(self, generation: int, reason: str) -> bool: ...

    def pending_sync_leader(self) -> tuple[int, str] | None: ...


class RebalanceAsker(Protocol):
    def request_rebalance(self, reason: str) -> None: ...


class JoinWatch:
    """Checks, when asked (at least every second, by the thread's housekeeping), whether its
    member is stuck joining, and applies the remedies above."""

    def __init__(self, name: str, session_timeout_ms: int, consumer: Joining,
                 control: RebalanceAsker | None,
                 remove_departed: Callable[[], Awaitable[list[str]]] | None,
                 lost_sync: Callable[[], int | None] | None = None,
                 silences: Callable[[], dict[str, int]] | None = None,
                 on_removed: Callable[[], None] | None = None,
                 removable_after_ms: Callable[[str], int] | None = None,
                 leader_key: Callable[[str], str] | None = None) -> None:
        self.name = name
        #: The key of a member's status record from its member id; None: the follower's
        #: wait on a silent leader is never looked at.
        self.leader_key = leader_key
        self._leader_given_up: int | None = None
        #: How long each other member must have been silent before it is looked for (ms;
        #: None: a session timeout).
        self.removable_after_ms = removable_after_ms
        #: The other members -> how long each has been silent (ms; their status records):
        #: one silent for longer than a session timeout is looked for, as soon as its silence
        #: passes it; None: never looked at.
        self.silences = silences
        #: Told once members were removed: the broker has begun a round without them, and
        #: the group's members join it at once (the round alarm) rather than at their next
        #: heartbeat.
        self.on_removed = on_removed
        #: The generation whose SyncGroup answer the member's round reports show was lost
        #: (None: not lost); None: never looked at.
        self.lost_sync = lost_sync
        self._lost_since: tuple[int, float] | None = None
        self._lost_asked: int | None = None
        self.session_timeout_ms = session_timeout_ms
        self.consumer = consumer
        self.control = control
        #: Removes static members that are gone but still in the group; None: never.
        self.remove_departed = remove_departed
        self._last_stall_request = 0.0
        self._last_departed_check = 0.0
        self._departed_check: asyncio.Task[None] | None = None
        self._silent_told: list[str] = []

    @property
    def stall_s(self) -> float:
        """About two join rounds: a member joining longer than that is stuck."""
        return (self.session_timeout_ms + 6_000) / 1000

    @property
    def departed_after_s(self) -> float:
        """About one join round: a member joining longer than that looks for departed
        members that hold the round."""
        return self.session_timeout_ms / 2000 + 6

    def next_look_in_s(self) -> float | None:
        """Seconds until another member's silence passes a session timeout, if that comes
        within a tick (a second): the thread looks for departed members then rather than at
        its next tick, since the round their removal begins waits on that look. None: no
        such member, or nothing to remove them with."""
        if self.silences is None:
            return None
        silences = self.silences()
        left = [self._limit(member) - silent for member, silent in silences.items()
                if self.remove_departed is not None
                and 0 <= self._limit(member) - silent < LOOK_AHEAD_MS]
        leader = self._waited_leader()
        if leader is not None and leader[1] in silences:
            to_session = self.session_timeout_ms - silences[leader[1]]
            if 0 <= to_session < LOOK_AHEAD_MS:
                left.append(to_session)
        return (min(left) + PAST_SESSION_MARGIN_MS) / 1000 if left else None

    def check(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.check_silent_leader()
        self.check_lost_sync(now)
        self.check_stall(now)
        self.check_departed(now)

    def check_lost_sync(self, now: float | None = None) -> bool:
        """Ask the leader to rejoin once the member's SyncGroup answer of a generation has
        looked lost for :data:`LOST_SYNC_AFTER_S`; once per generation."""
        now = time.monotonic() if now is None else now
        generation = self.lost_sync() if self.lost_sync is not None else None
        if generation is None:
            self._lost_since = None
            return False
        if self._lost_since is None or self._lost_since[0] != generation:
            self._lost_since = (generation, now)
        if now - self._lost_since[1] < LOST_SYNC_AFTER_S or self._lost_asked == generation:
            return False
        self._lost_asked = generation
        self._last_stall_request = now
        log.warning("%s: its SyncGroup answer of generation %d looks lost (other members have "
                    "theirs): asking the leader to rejoin", self.name, generation)
        # Still waiting for it, the member would join the round it asks for only once the
        # broker gives up its SyncGroup (Tansu: 0.8 of a session): that round would go on
        # without it, and the next one wait for it, round after round.
        self.consumer.abandon_sync(generation, "its answer looks lost")
        if self.control is not None:
            self.control.request_rebalance(
                f"{self.name}: SyncGroup answer of generation {generation} lost")
        return True

    def _waited_leader(self) -> tuple[int, str] | None:
        """``(generation, the leader's status key)`` while the member waits for a SyncGroup
        answer of a round another member leads."""
        if self.leader_key is None:
            return None
        pending = self.consumer.pending_sync_leader()
        return None if pending is None else (pending[0], self.leader_key(pending[1]))

    def check_silent_leader(self) -> bool:
        """Give up the SyncGroup the member waits for once the leader of its round has been
        silent for longer than a session timeout; once per generation."""
        waited = self._waited_leader()
        if waited is None or self.silences is None:
            return False
        generation, leader = waited
        silent = self.silences().get(leader)
        if silent is None or silent <= self.session_timeout_ms or (
                self._leader_given_up == generation):
            return False
        self._leader_given_up = generation
        return self.consumer.abandon_sync(
            generation, f"its round's leader {leader} has been silent for {silent / 1000:.1f}s")

    def check_stall(self, now: float | None = None) -> bool:
        """Ask the leader to rejoin if joining for longer than :attr:`stall_s`, and again
        every while it stays stuck."""
        now = time.monotonic() if now is None else now
        joining = self.consumer.rebalancing_for_s(now)
        if joining < self.stall_s or now - self._last_stall_request < self.stall_s:
            return False
        self._last_stall_request = now
        log.warning("%s has been joining for %.0fs: asking the leader to rejoin", self.name,
                    joining)
        if self.control is not None:
            self.control.request_rebalance(f"{self.name}: joining for {joining:.0f}s")
        return True

    def check_departed(self, now: float | None = None) -> bool:
        """While joining for longer than :attr:`departed_after_s`, or while another member
        has been silent for longer than a session timeout, every
        :data:`DEPARTED_CHECK_EVERY_S` remove static members that are gone (one look at a
        time, in the background)."""
        now = time.monotonic() if now is None else now
        if (self.remove_departed is None
                or now - self._last_departed_check < DEPARTED_CHECK_EVERY_S
                or (self._departed_check is not None and not self._departed_check.done())):
            return False
        if self.consumer.rebalancing_for_s(now) < self.departed_after_s:
            silent = self._removable()
            if not silent:
                return False
            if silent != self._silent_told:  # once per silence, not at each look
                self._silent_told = silent
                log.info("%s: %s silent for longer than a session timeout: removing them if "
                         "the broker still keeps them in the group", self.name,
                         ", ".join(silent))
        self._last_departed_check = now
        self._departed_check = asyncio.create_task(self._look_for_departed())
        return True

    def _limit(self, member: str) -> int:
        if self.removable_after_ms is None:
            return self.session_timeout_ms
        return self.removable_after_ms(member)

    def _removable(self) -> list[str]:
        """Members silent past a session timeout, and for :attr:`removable_after_ms`."""
        if self.silences is None:
            return []
        silences = self.silences()
        return [member for member in past_session(silences, self.session_timeout_ms)
                if silences[member] > self._limit(member)]

    async def _look_for_departed(self) -> None:
        assert self.remove_departed is not None
        try:
            removed = await self.remove_departed()
        except Exception as exc:
            log.info("%s: looking for departed members failed: %s", self.name, exc)
            return
        if removed:
            log.warning("%s removed departed members: %s", self.name, ", ".join(removed))
            if self.on_removed is not None:
                self.on_removed()

    async def close(self) -> None:
        if self._departed_check is not None:
            self._departed_check.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._departed_check
