"""Cooperative rebalancing over aiokafka's eager group client.

aiokafka 0.14 speaks only the eager protocol: at every rebalance it revokes every partition,
stops fetching, and forgets every position. :class:`CooperativeGroupCoordinator` changes
that for consumers whose assignor opts in (``cooperative = True``):

- at join-prepare it revokes nothing, so fetching and processing go on while the group
  rebalances (a listener's ``before_join`` may give tasks up there, before the subscription
  is built); a member whose membership the broker ended (its generation reset) instead
  loses every partition it held, through the listener's ``on_partitions_lost``, and its
  fetched records are held meanwhile (:meth:`CooperativeGroupCoordinator.membership_in_doubt`);
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
from typing import Any

import aiokafka.consumer.consumer as consumer_module
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.coordinator.protocol import ConsumerProtocol
from aiokafka.protocol.commit import OffsetCommitRequest, OffsetFetchRequest
from aiokafka.structs import TopicPartition

from streams.kafka.membership import (
    FencedMemberError,
    describe_group,
    fenced,
    fenced_member_error,
    register_errors,
)
from streams.kafka.offset_fetch import raise_group_error

log = logging.getLogger(__name__)


class CooperativeGroupCoordinator(GroupCoordinator):
    #: True from join-prepare to join-complete: the group is rebalancing.
    rebalancing = False
    #: When (monotonic seconds) the member entered the current round.
    rebalancing_since: float | None = None
    #: When (monotonic seconds) the member entered its latest round; kept after it ends, so
    #: that the round's duration can be measured once its assignment is applied.
    round_started: float | None = None

    #: When (monotonic seconds) the broker last confirmed this member: a heartbeat answered
    #: without error, or a round completed (None: not yet).
    confirmed_at: float | None = None

    async def _do_heartbeat(self) -> bool:
        ok = bool(await super()._do_heartbeat())
        if ok:
            self.confirmed_at = time.monotonic()
        return ok

    def membership_in_doubt(self, now: float | None = None) -> bool:
        """Whether this member holding partitions may no longer be in the group: the broker
        ended its membership (its generation was reset) and the partitions are not handed
        to the listener as lost yet, or nothing has confirmed it for longer than its session
        timeout (the process was stopped: the broker has most likely expired it, and the
        next heartbeat tells). Its records are then held, not processed: the partitions may
        have a new owner already."""
        subscription = self._subscription.subscription
        if subscription is None or subscription.assignment is None:
            return False
        if not subscription.assignment.tps:
            return False
        if self.generation == OffsetCommitRequest.DEFAULT_GENERATION_ID:
            return True
        if self.confirmed_at is None:
            return False
        now = time.monotonic() if now is None else now
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
        if holder is not None and holder != lost:
            self._fenced_by = holder
            log.error("group %s: member %s now holds instance %s (this member was %s)",
                      self.group_id, holder, self._group_instance_id, lost)
            raise fenced_member_error(self.group_id, self._group_instance_id)

    async def _send_req(self, request: Any) -> Any:
        response = await super()._send_req(request)
        if isinstance(request, OffsetFetchRequest):
            # aiokafka reads only per-partition errors: a group-level one would read as "no
            # committed offset" (see streams.kafka.offset_fetch).
            raise_group_error(response, self.coordinator_dead)
        return response

    def _push_error_to_user(self, exc: Exception) -> Any:
        """Errors reach the consumer's caller from here; a broker's fencing of this static
        member (KIP-345) says so in words rather than as aiokafka's "unexpected error"."""
        if fenced(exc) and not isinstance(exc, FencedMemberError):
            log.error("group %s: the broker fenced this member (%s)", self.group_id, exc)
            exc = fenced_member_error(self.group_id, self._group_instance_id)
        return super()._push_error_to_user(exc)

    async def _on_join_prepare(self, previous_assignment: Any) -> None:
        if (self._cooperative() and self.generation == OffsetCommitRequest.DEFAULT_GENERATION_ID
                and previous_assignment is not None and previous_assignment.tps):
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
        if before_join is not None:
            try:
                await before_join()
            except Exception:
                log.exception("before_join failed; joining with what the member runs")

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
        lost = getattr(listener, "on_partitions_lost", None) or listener.on_partitions_revoked
        await self._call(lost, partitions, "on_partitions_lost")

    async def _on_join_complete(
        self, generation: int, member_id: str, protocol: str, member_assignment_bytes: bytes
    ) -> None:
        self.rebalancing = False
        self.rebalancing_since = None
        self.confirmed_at = time.monotonic()
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
        old_assignment = previous.assignment if previous is not None else None
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


def install() -> None:
    """Make aiokafka's consumer build :class:`CooperativeGroupCoordinator` (idempotent)."""
    register_errors()
    if consumer_module.GroupCoordinator is not CooperativeGroupCoordinator:
        consumer_module.GroupCoordinator = CooperativeGroupCoordinator  # type: ignore[misc]
