"""Cooperative rebalancing over aiokafka's eager group client.

aiokafka 0.14 speaks only the eager protocol: at every rebalance it revokes every partition,
stops fetching, and forgets every position. :class:`CooperativeGroupCoordinator` changes
that for consumers whose assignor opts in (``cooperative = True``):

- at join-prepare it revokes nothing, so fetching and processing go on while the group
  rebalances (a listener's ``before_join`` may give tasks up there, before the subscription
  is built); a member whose membership the broker ended (its generation reset) instead
  loses every partition it held, through the listener's ``on_partitions_lost``, and its
  fetched records are held meanwhile (:meth:`CooperativeGroupCoordinator.membership_in_doubt`);
  so does a member that was itself silent for longer than its session (its process stopped:
  :mod:`streams.kafka.silence`), as soon as it runs again, whatever the broker answers;
- at join-complete it revokes only the partitions that moved away, keeps the positions of the
  partitions it keeps, and hands the new assignment over.

The member then rejoins at once if it revoked something (the assignor says so), and the moved
partitions reach their new owner in that second round: KIP-429's two rounds.

This relies on aiokafka internals (``GroupCoordinator._on_join_prepare`` and
``_on_join_complete``, ``SubscriptionState``), which is why aiokafka is pinned to 0.14.*;
``tests/broker/streams/test_cooperative.py`` covers it against the real broker; what the runtime
reads of the coordinator goes through :mod:`streams.kafka.driver`. The consumer looks the
coordinator class up by name in ``aiokafka.consumer.consumer``; :func:`install` puts this one
there. Consumers whose assignors do not opt in behave exactly as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiokafka.consumer.consumer as consumer_module
import aiokafka.errors as Errors
from aiokafka.client import ConnectionGroup
from aiokafka.conn import CloseReason
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.coordinator.protocol import ConsumerProtocol
from aiokafka.protocol.commit import OffsetCommitRequest, OffsetFetchRequest
from aiokafka.protocol.group import HeartbeatRequest, JoinGroupRequest, SyncGroupRequest
from aiokafka.structs import TopicPartition
from aiokafka.util import create_task

from streams.kafka.membership import (
    FencedMemberError,
    describe_group,
    fenced,
    fenced_member_error,
    register_errors,
)
from streams.kafka.offset_fetch import raise_group_error
from streams.kafka.silence import SilenceWatch, watch_silence

log = logging.getLogger(__name__)

REBALANCE_IN_PROGRESS = 27
#: A member that takes this long (seconds) from hearing of a round to joining it says why.
SLOW_JOIN_S = 0.1


class CooperativeGroupCoordinator(GroupCoordinator):
    #: True from join-prepare to join-complete: the group is rebalancing.
    rebalancing = False
    #: When (monotonic seconds) the member entered the current round.
    rebalancing_since: float | None = None
    #: When (monotonic seconds) the member entered its latest round; kept after it ends, so
    #: that the round's duration can be measured once its assignment is applied.
    round_started: float | None = None
    #: When (monotonic seconds) this member last found itself silent past its session.
    _silenced_at: float | None = None

    #: When (monotonic seconds) this member last sent a heartbeat or a SyncGroup that the
    #: broker answered without error (None: not yet). The sending counts, not the answer: an
    #: answer read after the process was stopped says nothing of the time it was stopped.
    confirmed_at: float | None = None
    #: When (monotonic seconds) the group's coordinator became known, the one known now (None:
    #: none is, aiokafka marked it dead and looks it up again).
    coordinator_known_since: float | None = None
    #: When (monotonic seconds) the node that is (or was last) the group's coordinator was
    #: found to be it: a coordinator still loading is marked dead and found again, on the
    #: same node, many times a second, which does not count as a move.
    coordinator_found_at: float | None = None
    _found_node: int | None = None
    #: When (monotonic seconds) aiokafka last marked the group's coordinator dead (None:
    #: never).
    coordinator_lost_at: float | None = None

    @property  # type: ignore[override]
    def coordinator_id(self) -> int | None:
        return self.__dict__.get("_coordinator_id")

    @coordinator_id.setter
    def coordinator_id(self, node: int | None) -> None:
        # aiokafka sets it when it discovers a coordinator and clears it when it marks one
        # dead: the time tells how long the group has had a coordinator that answers.
        if node != self.__dict__.get("_coordinator_id"):
            self.coordinator_known_since = time.monotonic() if node is not None else None
        if node is not None and node != self._found_node:
            self._found_node, self.coordinator_found_at = node, time.monotonic()
        if node is None and self.__dict__.get("_coordinator_id") is not None:
            self.coordinator_lost_at = time.monotonic()
        self.__dict__["_coordinator_id"] = node
    #: Joining a round (JoinGroup to join-complete): the broker keeps a member waiting in a
    #: round, which sends no heartbeat meanwhile.
    _awaiting_round: int = 0
    #: The event loop's gaps (None: not watched, as in tests that build no coordinator).
    _silence: SilenceWatch | None = None
    _silence_task: asyncio.Task[None] | None = None
    #: Losing the partitions of a member found silent for its session (None: not).
    _silent_loss: asyncio.Future[None] | None = None
    #: The member's partitions were lost since its last round completed.
    _lost_since_round = False
    #: Told the generation whose round has begun when a heartbeat says the group rebalances
    #: (streams.group.round_alarm: the other members then join without waiting for theirs).
    on_round_heard: Callable[[int], None] | None = None
    #: When (monotonic seconds) the member heard that it must rejoin (None: it need not).
    _rejoin_heard_at: float | None = None
    #: The SyncGroup this member waits for the answer of: its generation, and what gives it
    #: up (None: none).
    _pending_sync: tuple[int, asyncio.Future[str]] | None = None
    #: The leader the broker named in this member's last JoinGroup answer.
    _round_leader: str | None = None
    #: Awaited before this member joins again once its membership ended by its own silence
    #: (None: it joins at once): see streams.quirks.synced_round.may_join_after_loss.
    before_rejoin_after_silence: Callable[[], Awaitable[None]] | None = None
    #: Its membership ended by its silence, and it has not joined again since.
    _rejoin_after_silence = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._silence = SilenceWatch(self._session_timeout_ms / 1000)
        self._silence_task = create_task(watch_silence(self._silence, self._silenced))

    async def close(self) -> None:
        if self._silence_task is not None:
            self._silence_task.cancel()
        await super().close()

    async def _do_rejoin_group(self, subscription: Any) -> bool:
        if self._rejoin_after_silence:
            # Before the JoinGroup that follows the silence (a round the member had joined
            # before it froze may still end first, its answer out of date).
            self._rejoin_after_silence = False
            if self.before_rejoin_after_silence is not None:
                await self.before_rejoin_after_silence()
        self._awaiting_round += 1
        try:
            return bool(await super()._do_rejoin_group(subscription))
        finally:
            self._awaiting_round -= 1

    async def _send_req(self, request: Any) -> Any:
        if isinstance(request, SyncGroupRequest):
            return await self._send_sync(request)
        return await self._send_noted(request)

    async def _send_sync(self, request: Any) -> Any:
        """A SyncGroup, given up (as a failed request: aiokafka then rejoins) if
        :meth:`abandon_sync` is called while it waits for its answer."""
        generation = int(self.generation)  # the request's, which aiokafka built from it
        abandoned: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._pending_sync = (generation, abandoned)
        sent = asyncio.ensure_future(self._send_noted(request))
        try:
            await asyncio.wait({sent, abandoned}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            sent.cancel()
            raise
        finally:
            self._pending_sync = None
        if not sent.done():
            # Given up: cancelled first, so that closing its connection does not fail it as
            # an error (aiokafka would mark the coordinator dead and look it up again).
            sent.cancel()
            self._drop_coordination_connection()
            raise Errors.RebalanceInProgressError(abandoned.result())
        response = sent.result()
        if response.error_code == REBALANCE_IN_PROGRESS and self.on_round_heard:
            # The group began a round while this member waited for its assignment: the
            # others still waiting for theirs give them up and join it too.
            self.on_round_heard(generation)
        return response

    def abandon_sync(self, generation: int, reason: str) -> bool:
        """Give up the SyncGroup of ``generation`` this member waits for, if it does: the
        group has begun the round after it, so the answer can only be an error, and the
        member joins that round now instead (see :mod:`streams.quirks.synced_round`: a
        broker that answers such a SyncGroup only at its timeout keeps the member out of
        the round meanwhile). Whether it gave one up."""
        pending = self._pending_sync
        if pending is None or pending[0] != generation or pending[1].done():
            return False
        log.info("%s: gives up its SyncGroup of generation %d: %s", self.group_id,
                 generation, reason)
        pending[1].set_result(f"SyncGroup of generation {generation} given up: {reason}")
        return True

    def pending_sync_leader(self) -> tuple[int, str] | None:
        """``(generation, leader's member id)`` while this member, a follower, waits for its
        SyncGroup answer: the round's assignment comes only once that leader sends it."""
        pending = self._pending_sync
        leader = self._round_leader
        if pending is None or pending[1].done() or leader is None or leader == self.member_id:
            return None
        return pending[0], leader

    def _drop_coordination_connection(self) -> None:
        """Close the connection a given-up SyncGroup waits on. A broker answers a
        connection's requests in order, so the JoinGroup that follows would be answered only
        after it (on the embedded broker, at the SyncGroup's timeout: 7.5 s later in a
        three-request probe); on a new connection it is answered as any other."""
        conns = getattr(getattr(self, "_client", None), "_conns", None)
        if not isinstance(conns, dict):
            return
        conn = conns.get((self.coordinator_id, ConnectionGroup.COORDINATION))
        if conn is not None:
            conn.close(reason=CloseReason.IDLE_DROP)

    async def _send_noted(self, request: Any) -> Any:
        sent_at = time.monotonic()
        response = await super()._send_req(request)
        if isinstance(request, JoinGroupRequest) and response.error_code == 0:
            self._round_leader = response.leader_id
        if isinstance(request, OffsetFetchRequest):
            # aiokafka reads only per-partition errors: a group-level one would read as "no
            # committed offset" (see streams.kafka.offset_fetch).
            raise_group_error(response, self.coordinator_dead)
        elif _confirms(request, response):
            self.confirmed_at = max(sent_at, self.confirmed_at or sent_at)
            if (response.error_code == REBALANCE_IN_PROGRESS
                    and isinstance(request, HeartbeatRequest) and self.on_round_heard):
                self.on_round_heard(self.generation)
        return response

    def request_rejoin(self) -> None:
        if self._rejoin_heard_at is None:
            self._rejoin_heard_at = time.monotonic()
        super().request_rejoin()

    def _check_silence(self) -> None:
        """A group step runs: the event loop runs. A gap longer than the session since it
        last ran ends the membership (see :meth:`_silenced`)."""
        if self._silence is not None:
            gap = self._silence.tick(time.monotonic())
            if gap is not None:
                self._silenced(gap)

    def _silenced(self, gap_s: float) -> None:
        """This member's process did not run for ``gap_s`` seconds, longer than its session:
        it sent nothing for that long, so the group has most likely moved its partitions on
        (Apache Kafka expired it; Tansu may keep it in a round and tell it nothing). Its
        partitions are lost now, before any of its tasks writes again, and it rejoins as a
        member with no generation; the broker then tells it who it is (its member id is
        kept: a broker that expired it answers UNKNOWN_MEMBER_ID, and it rejoins anew)."""
        log.warning("group %s: this member did not run for %.1f s, longer than its session "
                    "(%.1f s): its membership ended", self.group_id, gap_s,
                    self._session_timeout_ms / 1000)
        self.generation = OffsetCommitRequest.DEFAULT_GENERATION_ID
        self._silenced_at = time.monotonic()
        self._rejoin_after_silence = True
        if self.rebalancing:
            # Frozen in a round is not stuck joining it: the join watch would ask the leader
            # for a round it does not need, and the others' round would hold this member's
            # join back (streams.quirks.synced_round.may_join_after_loss).
            self.rebalancing_since = self._silenced_at
        if self._silent_loss is None or self._silent_loss.done():
            self._silent_loss = asyncio.ensure_future(self._lose_held())
        self.request_rejoin()

    async def _lose_held(self) -> None:
        subscription = self._subscription.subscription
        assignment = subscription.assignment if subscription is not None else None
        if assignment is not None and assignment.tps and not self._lost_since_round:
            await self._lose(set(assignment.tps))

    def membership_in_doubt(self, now: float | None = None) -> bool:
        """Whether this member holding partitions may no longer be in the group: it was
        itself silent for longer than its session (its partitions are being lost), the
        broker ended its membership (its generation was reset) and the partitions are not
        handed to the listener as lost yet, or nothing has confirmed it for longer than its
        session outside a round (its heartbeats go unanswered: the broker has most likely
        expired it, and the next heartbeat tells). Its records are then held, not processed,
        and its tasks write nothing: the partitions may have a new owner already."""
        subscription = self._subscription.subscription
        if subscription is None or subscription.assignment is None:
            return False
        if not subscription.assignment.tps:
            return False
        now = time.monotonic() if now is None else now
        if self._silent_loss is not None and not self._silent_loss.done():
            return True
        if self._silence is not None and self._silence.silent(now):
            return True  # resumed just now: the watch has not had its turn yet
        if self.generation == OffsetCommitRequest.DEFAULT_GENERATION_ID:
            return True
        if self.confirmed_at is None or self._awaiting_round:
            return False
        return now - self.confirmed_at > self._session_timeout_ms / 1000

    def _cooperative(self) -> bool:
        return any(getattr(a, "cooperative", False) for a in self._assignors)

    #: The member id this static member had when the broker last said it knew it no more.
    _lost_member_id: str | None = None
    #: Set once another member is found holding this member's instance id.
    _fenced_by: str | None = None

    def reset_generation(self) -> None:
        if self._group_instance_id is not None and self.member_id:
            self._lost_member_id = self.member_id
        super().reset_generation()

    async def _check_not_replaced(self) -> None:
        """Raise :class:`FencedMemberError` when another member holds this static member's
        instance id (KIP-345: the broker gave the newcomer its place).

        aiokafka's heartbeats and commits carry no instance id, so the broker answers such a
        zombie UNKNOWN_MEMBER_ID rather than FENCED_INSTANCE_ID, as it answers a member whose
        session expired; and aiokafka rejoins with an empty member id, which would take the
        place back from the newcomer, and so on in turn. So before a static member that lost
        its member id rejoins, the group's description (DescribeGroups v4 names each
        member's instance id) tells the two cases apart."""
        if self._fenced_by is not None:
            raise fenced_member_error(self.group_id, self._group_instance_id)
        lost, self._lost_member_id = self._lost_member_id, None
        if lost is None:
            return
        try:
            described = await describe_group(self._client, self.group_id)
        except Exception as exc:
            log.warning("group %s: could not check who holds %s (%s); rejoining",
                        self.group_id, self._group_instance_id, exc)
            return
        holder = next((m.member_id for m in described.members
                       if m.group_instance_id == self._group_instance_id), None)
        # The holder may be this member itself, under the member id it rejoined with after
        # the loss (a first JoinGroup with the lost id was refused, the next one joined).
        if holder is not None and holder not in (lost, self.member_id):
            self._fenced_by = holder
            log.error("group %s: member %s now holds instance %s (this member was %s)",
                      self.group_id, holder, self._group_instance_id, lost)
            raise fenced_member_error(self.group_id, self._group_instance_id)

    def _push_error_to_user(self, exc: Exception) -> Any:
        """Errors reach the consumer's caller from here; a broker's fencing of this static
        member (KIP-345) says so in words rather than as aiokafka's "unexpected error"."""
        if fenced(exc) and not isinstance(exc, FencedMemberError):
            log.error("group %s: the broker fenced this member (%s)", self.group_id, exc)
            exc = fenced_member_error(self.group_id, self._group_instance_id)
        return super()._push_error_to_user(exc)

    async def _on_join_prepare(self, previous_assignment: Any) -> None:
        self._check_silence()
        if self._silent_loss is not None:
            await self._silent_loss
        if (self._cooperative() and self.generation == OffsetCommitRequest.DEFAULT_GENERATION_ID
                and previous_assignment is not None and previous_assignment.tps
                and not self._lost_since_round):
            await self._lose(set(previous_assignment.tps))
        await self._check_not_replaced()
        self.rebalancing = True
        self.rebalancing_since = self.round_started = time.monotonic()
        if not self._cooperative():
            await super()._on_join_prepare(previous_assignment)
            return
        # Keep the assignment, positions and fetching; only forget the leader's view.
        self._group_subscription = None
        # Relay's listener may give tasks up before the subscription is built (learners
        # that take them over in this round: streams.group.promotion_asks).
        before_join = getattr(self._subscription.listener, "before_join", None)
        prepared_at = time.monotonic()
        if before_join is not None:
            try:
                await before_join()
            except Exception:
                log.exception("before_join failed; joining with what the member runs")
        self._log_slow_join(prepared_at)

    def _log_slow_join(self, prepared_at: float) -> None:
        """Every member's delay holds the whole group's round: say where a long one went."""
        now = time.monotonic()
        heard, self._rejoin_heard_at = self._rejoin_heard_at, None
        if heard is not None and now - heard >= SLOW_JOIN_S:
            log.info("group %s: joins %.2fs after it heard of the round (%.2fs before its "
                     "listener's preparation, %.2fs in it)", self.group_id, now - heard,
                     prepared_at - heard, now - prepared_at)

    async def _lose(self, partitions: set[TopicPartition]) -> None:
        """The broker ended this member's membership (its session expired while it was
        stopped or stalled; its generation was reset) while it still held partitions: they
        may have a new owner already, so they are lost, not revoked (KIP-429's
        ``onPartitionsLost``). The listener stops their tasks before the member rejoins and
        commits nothing: a member that went on processing them would write outputs and
        changelog records older than the new owner's after them (a window's last count
        going back)."""
        listener = self._subscription.listener
        if listener is None:
            return
        log.warning("group %s: this member's membership ended; its %d partitions are lost",
                    self.group_id, len(partitions))
        self._lost_since_round = True
        lost = getattr(listener, "on_partitions_lost", None) or listener.on_partitions_revoked
        await self._call(lost, partitions, "on_partitions_lost")

    async def _on_join_complete(
        self, generation: int, member_id: str, protocol: str, member_assignment_bytes: bytes
    ) -> None:
        # A member stopped past its session while it waited for this round's answers loses
        # its partitions before it takes the round's assignment up: nothing it held is
        # committed or kept.
        self._check_silence()
        if self._silent_loss is not None:
            await self._silent_loss
        # Ended during the round: by the broker (the generation reset), or by this member's
        # own silence, which a JoinGroup answer read as it resumed sets a generation over.
        silenced_in_round = (self._silenced_at is not None and self.round_started is not None
                             and self._silenced_at >= self.round_started)
        if self.generation == OffsetCommitRequest.DEFAULT_GENERATION_ID or silenced_in_round:
            await self._drop_stale_assignment()
            return
        lost, self._lost_since_round = self._lost_since_round, False
        # Joined again: a member id lost before is no longer this member's to check.
        self._lost_member_id = None
        self.rebalancing = False
        self.rebalancing_since = None
        if not self._cooperative():
            await super()._on_join_complete(
                generation, member_id, protocol, member_assignment_bytes
            )
            return
        assignor = self._lookup_assignor(protocol)
        assert assignor, f"invalid assignment protocol: {protocol}"
        assignment = ConsumerProtocol.ASSIGNMENT.decode(member_assignment_bytes)
        new_partitions = set(assignment.partitions())

        previous = self._subscription.subscription
        old_assignment = previous.assignment if previous is not None and not lost else None
        old_partitions: set[TopicPartition] = (
            set(old_assignment.tps) if old_assignment is not None else set()
        )
        kept_positions: dict[TopicPartition, int] = {}
        if old_assignment is not None:
            for tp in old_partitions & new_partitions:
                state = old_assignment.state_value(tp)
                if state.has_valid_position:
                    kept_positions[tp] = state.position
        revoked = old_partitions - new_partitions
        listener = self._subscription.listener

        # Give the assignor the assignment before any callback, as the eager path does.
        assignor.on_assignment(assignment)
        if revoked and listener is not None:
            log.info("revoking only what moved: %s", sorted(revoked))
            await self._call(listener.on_partitions_revoked, revoked, "on_partitions_revoked")

        self._subscription.assign_from_subscribed(new_partitions)
        subscription = self._subscription.subscription
        for tp, position in kept_positions.items():
            subscription.assignment.state_value(tp).seek(position)

        await self._stop_commit_offsets_refresh_task()
        self.start_commit_offsets_refresh_task(subscription.assignment)
        log.info("kept %d partitions, gained %d, revoked %d",
                 len(kept_positions), len(new_partitions - old_partitions), len(revoked))
        if listener is not None:
            await self._call(listener.on_partitions_assigned, new_partitions,
                             "on_partitions_assigned")

    async def _drop_stale_assignment(self) -> None:
        """The membership ended while this member waited for its round's answers (it was
        stopped past its session, or the broker said it no longer knew it): the answer that
        came is the round's of before, whose partitions have most likely gone to others
        since. Taking it up would run tasks beside their new owners (seen after a 25-s
        SIGSTOP on Tansu: a frozen leader's SyncGroup answer, read as it resumed, started
        three tasks another member ran; and a JoinGroup answer read as it resumed led to a
        SyncGroup whose answer started four). It holds nothing, and rejoins."""
        log.warning("group %s: this member's membership ended while it waited for its "
                    "round's answer: that answer's assignment is out of date and is not "
                    "taken up; rejoining", self.group_id)
        previous = self._subscription.subscription
        held = previous.assignment if previous is not None else None
        if held is not None and held.tps and not self._lost_since_round:
            await self._lose(set(held.tps))  # ended by the broker, not by a silence
        self.rebalancing = False
        self.rebalancing_since = None
        self._silenced_at = None
        self.generation = OffsetCommitRequest.DEFAULT_GENERATION_ID
        self._subscription.assign_from_subscribed(set())
        self.request_rejoin()

    async def _call(self, callback: Any, partitions: set[TopicPartition], name: str) -> None:
        """Run a listener callback. A failure is not swallowed: the member rejoins, so that
        the group plans again (Relay's own listener reports failures to its thread, which
        retries or fails loudly; this is the net for any other listener)."""
        try:
            result = callback(partitions)
            if asyncio.iscoroutine(result):
                await result
        except Exception:
            log.exception("rebalance listener failed in %s; rejoining", name)
            self.request_rejoin()


def _confirms(request: Any, response: Any) -> bool:
    """A heartbeat or SyncGroup the broker answered as a member's: without error, or (a
    heartbeat) REBALANCE_IN_PROGRESS, which asks a member to rejoin."""
    return (isinstance(request, HeartbeatRequest | SyncGroupRequest)
            and response.error_code in (0, REBALANCE_IN_PROGRESS))


def install() -> None:
    """Make aiokafka's consumer build :class:`CooperativeGroupCoordinator` (idempotent)."""
    register_errors()
    if consumer_module.GroupCoordinator is not CooperativeGroupCoordinator:
        consumer_module.GroupCoordinator = CooperativeGroupCoordinator  # type: ignore[misc]
