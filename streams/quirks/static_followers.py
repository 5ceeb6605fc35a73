"""The static-follower digest protocol: how static members stay in step with the leader on a
broker that answers a static follower's rejoin with its cached assignment.

On such a broker (Tansu) a static follower that rejoins a stable group gets its old assignment
back, no rebalance starts, and the broker may keep the follower's old metadata. So, with this
protocol on (the quirk ``cached-static-rejoin``, see :mod:`streams.quirks.switch`):

- a static follower that needs a rebalance also asks the leader, on the control topic, to
  rejoin (the leader rejoining always starts one);
- a static member publishes its current subscription on the control topic after every
  change, and the leader's assignor uses the freshest copy;
- after each assignment the leader publishes, per static follower, a digest of the assignment
  it computed for it; a follower holding another one asks for a rebalance the way a ready
  learner does. A digest, not the generation: when only the leader rejoins, Tansu completes
  the round without moving the generation on;
- a member that hands over and leaves first lets a round under way finish (a leader that
  left during a round left the others joining rounds led by the departed member), and a
  leaving leader sends its followers their digests only once it has left.

On a broker that rebalances on a static member's rejoin (Apache Kafka) none of this is
needed; the messages would be harmless there, but the quirk is off there.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Protocol

from streams.kafka.driver import GroupConsumer

log = logging.getLogger(__name__)

#: How long a follower whose new assignment differs from a leader's digest that arrived while
#: it waited for it waits for a newer digest before it asks for a round (the leader's digest
#: of the follower's round follows the leader's SyncGroup answer, within about a second).
DIGEST_GRACE_S = 3.0

Schedule = Callable[[float, Callable[[], None]], object]


def _call_later(delay_s: float, callback: Callable[[], None]) -> object:
    return asyncio.get_running_loop().call_later(delay_s, callback)


class ControlSender(Protocol):
    def request_rebalance(self, reason: str) -> None: ...
    def publish_subscription(self, static_id: str, data: bytes) -> None: ...
    def request_fetch(self, digests: dict[str, str]) -> None: ...


class StaticMember(Protocol):
    static_id: str | None

    @property
    def is_leader(self) -> bool: ...

    @property
    def received_digest(self) -> str | None: ...

    @property
    def in_round(self) -> bool:
        """Joined a round whose assignment it has not received yet."""
        ...

    def request_rejoin(self, reason: str, broadcast: bool = True, news: bool = True) -> None: ...


class StaticFollowers:
    """The protocol for every stream thread of one process (they share the control topic)."""

    def __init__(self, enabled: bool, control: ControlSender | None = None,
                 schedule: Schedule | None = None) -> None:
        self.enabled = enabled
        self._control = control
        self._schedule: Schedule = schedule or _call_later
        self._members: list[StaticMember] = []
        self._subscriptions: dict[str, bytes] = {}
        #: The leader's latest digest for each member of this process that was in a round
        #: when it arrived: checked once that round's assignment is in.
        self._awaited: dict[str, str] = {}
        #: Digests that differed from the assignment their follower then applied, while
        #: the leader's digest of that round may still be on its way.
        self._late: dict[str, str] = {}

    def add_member(self, member: StaticMember) -> None:
        self._members.append(member)

    def _active_for(self, member: StaticMember) -> bool:
        return self.enabled and self._control is not None and member.static_id is not None

    # -- a member's side --------------------------------------------------------------------

    def ask_leader(self, member: StaticMember, reason: str) -> None:
        """A static follower asking for a rebalance also asks the leader to rejoin."""
        if self._active_for(member) and not member.is_leader:
            self._control.request_rebalance(f"{member.static_id}: {reason}")  # type: ignore[union-attr]

    def restarted(self, reason: str) -> None:
        """A static instance restarted within its session: the broker hands its rejoining
        members their cached assignment and starts no round, and the new process knows none
        of it, so they would wait for the join watch. Ask the leader to rejoin at once: its
        round gives them their tasks."""
        if self.enabled and self._control is not None:
            log.info("%s: asking the leader for a round", reason)
            self._control.request_rebalance(reason)

    def publish_subscription(self, member: StaticMember, data: bytes) -> None:
        if self._active_for(member):
            self._control.publish_subscription(member.static_id, data)  # type: ignore[union-attr, arg-type]

    def tell_followers(self, member: StaticMember, digests: dict[str, str]) -> None:
        """From the leader: the digest of the assignment it computed for each static
        follower."""
        if not (self._active_for(member) and member.is_leader):
            return
        followers = {s: d for s, d in digests.items() if s != member.static_id}
        if followers:
            self._control.request_fetch(followers)  # type: ignore[union-attr]

    async def settle(self, consumer: GroupConsumer, session_timeout_ms: int,
                     heartbeat_interval_ms: int) -> None:
        """Before a member that handed everything over leaves: let a round under way finish
        (bounded by the session timeout)."""
        if not self.enabled:
            return
        deadline = time.monotonic() + session_timeout_ms / 1000
        # A round another member started shows at this member's next heartbeat.
        await asyncio.sleep(heartbeat_interval_ms / 1000)
        while time.monotonic() < deadline and (consumer.rebalancing or consumer.rejoin_pending):
            await asyncio.sleep(0.1)

    # -- the control topic's side ------------------------------------------------------------

    def fresh_subscription(self, static_id: str) -> bytes | None:
        """The latest subscription ``static_id`` published (read by the leader's assignor)."""
        return self._subscriptions.get(static_id) if self.enabled else None

    def on_subscription(self, static_id: str, data: bytes) -> None:
        self._subscriptions[static_id] = data

    def on_fetch_request(self, digests: dict[str, str]) -> None:
        """The leader's digests, each checked against the assignment its follower holds,
        but not while that follower waits for a round's assignment: the broker may answer
        the leader's SyncGroup before the followers' (seconds before, on Tansu), so the
        digest of the round a follower is in often came before the follower's own
        assignment, and comparing it with the one before asked for a round nobody needed.
        Such a digest is checked once the follower has its assignment (see
        :meth:`assignment_applied`)."""
        if not self.enabled:
            return
        for member in self._members:
            static_id = member.static_id
            if static_id is None or static_id not in digests or member.is_leader:
                continue
            digest = digests[static_id]
            # A newer digest replaces any awaited one, and any one in its grace.
            self._late.pop(static_id, None)
            if member.in_round:
                if digest == member.received_digest:
                    self._awaited.pop(static_id, None)
                else:
                    self._awaited[static_id] = digest
            else:
                self._awaited.pop(static_id, None)
                rejoin_if_assignment_missed(member, digest)

    def assignment_applied(self, member: StaticMember) -> None:
        """A follower applied a round's assignment: compare it with the leader's digest that
        arrived while it waited for it, if one did. That digest may be of the round before
        (the leader's SyncGroup may be answered after the followers'), in which case the
        leader's digest of this round is on its way: a mismatch is acted on only if no newer
        digest came within :data:`DIGEST_GRACE_S`."""
        static_id = member.static_id
        if static_id is None:
            return
        digest = self._awaited.pop(static_id, None)
        if (digest is None or not self.enabled or member.is_leader
                or digest == member.received_digest):
            return
        self._late[static_id] = digest
        self._schedule(DIGEST_GRACE_S, functools.partial(self._grace_over, member, digest))

    def _grace_over(self, member: StaticMember, digest: str) -> None:
        static_id = member.static_id
        if static_id is None or self._late.get(static_id) != digest:
            return  # a newer digest came, and was checked
        del self._late[static_id]
        if member.in_round:
            self._awaited[static_id] = digest  # checked against that round's assignment
            return
        rejoin_if_assignment_missed(member, digest)


def rejoin_if_assignment_missed(member: StaticMember, digest: str) -> bool:
    """Ask for a rebalance if the leader computed another assignment (``digest``) for this
    member than the one it holds: a static follower the broker did not wait for missed the
    round. A plain rejoin is not enough on every broker (Tansu may hold the follower's join
    until the leader rejoins too), so it asks the way a ready learner does."""
    if member.received_digest == digest:
        return False
    member.request_rejoin("missed the leader's last assignment", news=False)
    return True
