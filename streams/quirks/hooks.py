"""The one seam between a round and the broker's quirks: :class:`RoundHooks`, the steps of a
round that a quirk may add to, and :func:`hooks_for`, the one switch that turns each on.

The thread, its group member, its rebalance listener and the leader's assignor call these
steps and never ask which quirks are on. ``RoundHooks()`` adds nothing: what a broker that
follows Apache Kafka's group protocol gets. Each step names the quirk it serves; the work
itself lives in that quirk's module (see :mod:`streams.quirks.switch` for the list).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from streams.group.control import ROUND_KEY, control_topic_name, encode_round_report
from streams.kafka.driver import GroupConsumer, producer_client
from streams.quirks.departed_members import removable_after_ms, remove_departed_members
from streams.quirks.formed_group import wait_for_formed_group
from streams.quirks.static_followers import ControlSender, StaticFollowers, StaticMember
from streams.quirks.switch import BrokerQuirks, Quirk
from streams.quirks.synced_round import (
    SYNC_WAIT_LIMIT_S,
    RoundReports,
    RoundView,
    may_ask_after_others_synced,
    may_join_after_loss,
    may_rejoin,
    members_synced,
    sync_answer_lost,
    unsynced_members,
)
from streams.quirks.task_positions import TaskPositions

log = logging.getLogger(__name__)

#: How often a member waiting for its round's members to sync looks at their reports.
ROUND_CHECK_INTERVAL_S = 0.05


class RoundMember(StaticMember, Protocol):
    """What a quirk reads of a group member."""

    @property
    def generation(self) -> int: ...

    @property
    def static_digests(self) -> dict[str, str]: ...

    def round_view(self, waited_s: float) -> RoundView: ...


#: A join round on a broker without timer-driven rounds, before one is measured (seconds).
ROUND_S_NOT_MEASURED = 1.0
#: A join round on a broker whose rounds run on its timers, in session timeouts.
ROUNDS_ON_TIMERS_SESSIONS = 0.8


@dataclass
class RoundHooks:
    """The steps of a round a broker quirk adds to; a part left at None (or False) adds
    nothing."""

    #: ``cached-static-rejoin``: the static-follower digest protocol.
    static_followers: StaticFollowers | None = None
    #: ``late-follower-sync``: which generation each member reports having its assignment of.
    round_reports: RoundReports | None = None
    #: ``leader-wedge``: leave only from a formed group.
    leave_from_formed_group: bool = False
    #: ``departed-static-leader``: a member stuck joining removes departed static members.
    remove_departed: bool = False
    #: ``stuck-last-stable-offset``: read committed records by their transaction markers.
    committed_by_markers: bool = False
    #: ``deferred-transactional-offsets``: exactly-once tasks record their input positions.
    records_positions: bool = False
    #: Where they record them, once the app has created the topic.
    positions: TaskPositions | None = None
    #: ``no-delete-records``: repartition topics are not purged after commits.
    keeps_repartition_records: bool = False
    #: ``skipped-batches``: a fetch that skipped offsets is made again.
    refetch_skipped: bool = False

    # -- the leader's assignor ------------------------------------------------------------

    def fresh_subscription(self, static_id: str) -> bytes | None:
        """cached-static-rejoin: the latest subscription a static member published."""
        if self.static_followers is None:
            return None
        return self.static_followers.fresh_subscription(static_id)

    def unsynced(self, previous_round: list[str], leader: str) -> set[str]:
        """late-follower-sync: members of the leader's last round still without their
        assignment of it."""
        if self.round_reports is None:
            return set()
        return unsynced_members(previous_round, leader, self.round_reports.generations)

    # -- a member asking for a round ------------------------------------------------------

    def add_member(self, member: StaticMember) -> None:
        if self.static_followers is not None:
            self.static_followers.add_member(member)

    def ask_leader(self, member: StaticMember, reason: str) -> None:
        """cached-static-rejoin: a static follower asking for a round asks the leader too."""
        if self.static_followers is not None:
            self.static_followers.ask_leader(member, reason)

    def restarted(self, reason: str) -> None:
        """cached-static-rejoin: a restarted static instance asks the leader for a round."""
        if self.static_followers is not None:
            self.static_followers.restarted(reason)

    def assignment_applied(self, member: StaticMember) -> None:
        """cached-static-rejoin: a follower compares the assignment it just applied with the
        leader's digest that arrived while it waited for it."""
        if self.static_followers is not None:
            self.static_followers.assignment_applied(member)

    def publish_subscription(self, member: StaticMember, data: bytes) -> None:
        """cached-static-rejoin: the leader reads a static member's latest subscription."""
        if self.static_followers is not None:
            self.static_followers.publish_subscription(member, data)

    def round_s_before_measured(self, session_timeout_ms: int) -> float:
        """How long a join round takes, for a member that has no measured one to go by.
        late-follower-sync (rounds on the broker's timers: a JoinGroup answered half a session
        after it is sent, a static member's SyncGroup 3 s after): most of a session. A broker
        that runs a round as fast as its members join: a second, above what a cooperative
        round of a formed group takes there."""
        if self.round_reports is not None:
            return ROUNDS_ON_TIMERS_SESSIONS * session_timeout_ms / 1000
        return ROUND_S_NOT_MEASURED

    @property
    def waits_for_synced_round(self) -> bool:
        """late-follower-sync: a member asks for the next round only once every member of
        its round has its assignment."""
        return self.round_reports is not None

    async def until_round_synced(self, member: RoundMember, stopped: asyncio.Event
                                 ) -> RoundView | None:
        """late-follower-sync: wait (bounded) until every member of ``member``'s round has
        its assignment; the round as it stood then, or None when the thread stops first."""
        reports = self.round_reports.generations if self.round_reports is not None else {}
        since = time.monotonic()
        generation = member.generation
        in_round = False
        while True:
            if stopped.is_set():
                return None
            now = time.monotonic()
            view = member.round_view(now - since)
            if member.generation != generation or (in_round and not view.rebalancing):
                # A new round's members have their assignments to wait for, whether its
                # generation is new or not (Tansu keeps one over several rounds: counted
                # from an earlier round's end, the wait was over at once, and the request
                # made the syncs of the round just ended vain).
                generation, since = member.generation, now
                view = member.round_view(0.0)
            in_round = view.rebalancing
            if may_rejoin(view, reports):
                return view
            await asyncio.sleep(ROUND_CHECK_INTERVAL_S)

    async def until_before_asking(self, others_in_round: Callable[[], list[str] | None],
                                  in_round: Callable[[], bool],
                                  limit_s: float = SYNC_WAIT_LIMIT_S) -> None:
        """late-follower-sync: a member about to ask for a round waits (at most ``limit_s``)
        while a member of another instance says it is in a round (see
        :func:`streams.quirks.synced_round.may_ask_after_others_synced`), and not once it is
        in a round itself (that round serves its request); at once with the quirk off."""
        if self.round_reports is None:
            return
        started = time.monotonic()
        waited = 0.0
        while not in_round() and not may_ask_after_others_synced(others_in_round(), waited,
                                                                 limit_s):
            await asyncio.sleep(ROUND_CHECK_INTERVAL_S)
            waited = time.monotonic() - started
        if waited >= ROUND_CHECK_INTERVAL_S and not in_round():
            log.info("asking for a round once the other instances' members had their "
                     "assignments: %.1f s later", waited)

    async def until_others_out_of_round(self, others_in_round: Callable[[], list[str] | None],
                                        limit_s: float) -> None:
        """late-follower-sync: a member whose membership ended waits (at most ``limit_s``)
        until no member of another instance is in a round, before it joins again (see
        :func:`streams.quirks.synced_round.may_join_after_loss`); at once with the quirk
        off."""
        if self.round_reports is None:
            return
        started = time.monotonic()
        waited = 0.0
        while not may_join_after_loss(others_in_round(), waited, limit_s):
            await asyncio.sleep(ROUND_CHECK_INTERVAL_S)
            waited = time.monotonic() - started
        if waited >= ROUND_CHECK_INTERVAL_S:
            log.info("joining again after its membership ended, once the others' round "
                     "ended: %.1f s later", waited)

    def members_synced(self, generation: int) -> int:
        reports = self.round_reports.generations if self.round_reports is not None else {}
        return members_synced(generation, reports)

    # -- after a round ----------------------------------------------------------------------

    def round_applied(self, member: RoundMember, producer: Any, application_id: str,
                      member_id: str, generation: int, tell_followers: bool,
                      background: set[asyncio.Task[None]]) -> None:
        """late-follower-sync: tell the group this member has its assignment of its
        generation (in the background); cached-static-rejoin: a leader tells its static
        followers the digests of their assignments (a leaving leader only once it left)."""
        if self.round_reports is not None:
            report = encode_round_report(member_id, generation)

            async def send() -> None:
                with contextlib.suppress(Exception):
                    await producer.send(control_topic_name(application_id), key=ROUND_KEY,
                                        value=report)

            task = asyncio.get_running_loop().create_task(send())
            background.add(task)
            task.add_done_callback(background.discard)
        if tell_followers:
            self.tell_followers(member)

    def tell_followers(self, member: RoundMember) -> None:
        if self.static_followers is not None:
            self.static_followers.tell_followers(member, member.static_digests)

    # -- a member stuck joining -------------------------------------------------------------

    def lost_sync_generation(self, consumer: GroupConsumer, applied_generation: int
                             ) -> int | None:
        """late-follower-sync: the generation whose SyncGroup answer this member waits for
        although another member reports having its own."""
        if self.round_reports is None:
            return None
        generation = consumer.generation
        lost = sync_answer_lost(consumer.member_id, generation, applied_generation,
                                consumer.rebalancing, self.round_reports.generations)
        return generation if lost else None

    def departed_remover(self, producer: Any, bootstrap_servers: str | None,
                         application_id: str, session_timeout_ms: int, own: str | None,
                         ) -> DepartedRemover | None:
        """departed-static-leader: what removes the static members that are gone but still
        in the group (None: nothing does)."""
        if not self.remove_departed or bootstrap_servers is None:
            return None
        return DepartedRemover(producer, bootstrap_servers, application_id,
                               session_timeout_ms, own)

    # -- leaving ------------------------------------------------------------------------------

    async def before_leave(self, member: RoundMember, consumer: GroupConsumer,
                           session_timeout_ms: int, heartbeat_interval_ms: int,
                           handed_over: bool, sends_leave_group: bool, waits_for_syncs: bool,
                           name: str) -> None:
        """Before a member's LeaveGroup (or before a static one stops).

        cached-static-rejoin: a member that handed everything over lets a round under way
        finish. late-follower-sync: every member of its last round has its assignment, then
        leader-wedge: the group is formed, with nothing awaited in between. Waiting for the
        others' syncs after the formed check left a window of up to a second in which they
        started their next round; a leaving *leader* that left in it wedged the group on the
        embedded broker (a host swap joining for minutes)."""
        if handed_over and self.static_followers is not None:
            await self.static_followers.settle(consumer, session_timeout_ms,
                                               heartbeat_interval_ms)
        if not sends_leave_group:
            return
        for _ in range(3):
            if waits_for_syncs:
                await self.until_others_synced(member)
            if not self.leave_from_formed_group:
                return
            generation = consumer.generation
            with contextlib.suppress(Exception):
                await wait_for_formed_group(consumer, session_timeout_ms / 1000, name)
            if consumer.generation == generation:
                return  # formed, and no round taken part in since the others synced

    async def until_others_synced(self, member: RoundMember,
                                  limit_s: float = SYNC_WAIT_LIMIT_S) -> bool:
        """late-follower-sync, before leaving: let every member of this member's round get
        its assignment (a LeaveGroup starts a round too, and would stall them the way a
        rejoin does), for at most ``limit_s``. False when the limit ended the wait."""
        if self.round_reports is None:
            return True
        started = time.monotonic()
        while time.monotonic() - started < limit_s:
            # A round under way was just taken part in (or given up on): only the others'
            # syncs are waited for here.
            view = replace(member.round_view(time.monotonic() - started), rebalancing=False)
            # The loop bounds the wait: may_rejoin only says whether they all synced.
            if may_rejoin(view, self.round_reports.generations, limit_s=float("inf")):
                return True
            await asyncio.sleep(ROUND_CHECK_INTERVAL_S)
        return False

    # -- the control topic's side -----------------------------------------------------------

    def on_subscription(self, static_id: str, data: bytes) -> None:
        if self.static_followers is not None:
            self.static_followers.on_subscription(static_id, data)

    def on_fetch_request(self, digests: dict[str, str]) -> None:
        if self.static_followers is not None:
            self.static_followers.on_fetch_request(digests)

    def on_round_report(self, member_id: str, generation: int) -> None:
        if self.round_reports is not None:
            self.round_reports.record(member_id, generation)


@dataclass
class DepartedRemover:
    """departed-static-leader: removes one thread's group's departed static members."""

    producer: Any
    bootstrap_servers: str
    application_id: str
    session_timeout_ms: int
    own: str | None

    def removable_after_ms(self, leader: bool) -> int:
        """How long a member must have been silent before it is removed (``leader``: it led
        the group, as its last status record says)."""
        return removable_after_ms(self.session_timeout_ms, leader)

    async def remove(self) -> list[str]:
        client = producer_client(self.producer)
        if client is None:
            return []
        return await remove_departed_members(client, self.bootstrap_servers,
                                             self.application_id, self.session_timeout_ms,
                                             self.own)


def hooks_for(quirks: BrokerQuirks, control: ControlSender | None = None) -> RoundHooks:
    """The one switch: the hooks of the quirks that are on (``control``: the process's
    control channel, which the static-follower protocol talks over)."""
    return RoundHooks(
        static_followers=(StaticFollowers(True, control)
                          if Quirk.CACHED_STATIC_REJOIN in quirks else None),
        round_reports=RoundReports() if Quirk.LATE_FOLLOWER_SYNC in quirks else None,
        leave_from_formed_group=Quirk.LEADER_WEDGE in quirks,
        remove_departed=Quirk.DEPARTED_STATIC_LEADER in quirks,
        committed_by_markers=Quirk.STUCK_LAST_STABLE_OFFSET in quirks,
        records_positions=Quirk.DEFERRED_TRANSACTIONAL_OFFSETS in quirks,
        keeps_repartition_records=Quirk.NO_DELETE_RECORDS in quirks,
        refetch_skipped=Quirk.SKIPPED_BATCHES in quirks,
    )

