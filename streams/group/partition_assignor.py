"""The rebalance layer between aiokafka's group protocol and Relay's assignor.

subscription (what this member runs and holds, in user_data) -> the leader's
:func:`assignor.assign` -> assignment (partitions of the active tasks, plus Relay's assignment
in user_data) -> the member's task transitions (:mod:`streams.runtime.transitions`).

aiokafka calls ``metadata`` when the member joins, ``assign`` on the leader, and
``on_assignment`` on every member once the group synced.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from assignor import (
    AssignorConfig,
    LeaderMemory,
    Member,
    MemberAssignment,
    Task,
    assign,
    memory_from_notes,
    parse_task_id,
)
from assignor.protocol import (
    Subscription,
    decode_assignment,
    decode_subscription_or_none,
    encode_assignment,
    encode_subscription,
    member_from_subscription,
)
from streams.dsl.topology import SubTopology
from streams.group.member_id import thread_member_id
from streams.metrics import Metrics

log = logging.getLogger(__name__)

PROTOCOL_NAME = "relay-learner"

MemberKey = tuple[str, int]


def moves_by_cause(
    previous_owners: Mapping[str, MemberKey],
    members: Iterable[Member],
    assignments: Mapping[str, MemberAssignment],
    acceptable_lag: int,
    moving_before: Mapping[str, MemberKey] | None = None,
    moving_now: Mapping[str, MemberKey] | None = None,
    stateless: Collection[str] = frozenset(),
) -> dict[str, int]:
    """How many tasks a round moved to another member, by cause.

    A task revoked this round for another member (``moving_now``, the leader's new memory) is
    counted now, when its cause is known: its owner may be gone by the next round (a leaving
    instance is told to shut down in the round that revokes its last tasks; a crash takes any
    owner away). A task the last round
    revoked for the member that now runs it (``moving_before``) was counted then. Any other
    task is counted when it runs elsewhere: its new active compared with its previous owner
    (instance and thread, so a static member that restarts and gets its tasks back has moved
    nothing). A leaving owner's ``stateless`` task needs no copy: it moves as the owner
    leaves, never for its deadline."""
    by_id = {m.member_id: m for m in members}
    present = {m.key: m for m in by_id.values()}
    moving_before = moving_before or {}
    counts: dict[str, int] = {}

    def count(owner: Member | None, receiver: Member | None, task_id: str) -> None:
        lag = receiver.learners.get(task_id, acceptable_lag + 1) if receiver else None
        ready = lag is not None and lag <= acceptable_lag
        if owner is None:
            cause = "lost"
        elif owner.leaving:
            cause = "leaving" if ready or task_id in stateless else "scale_down_timeout"
        elif ready:
            cause = "learner_ready"
        else:
            cause = "balance"
        counts[cause] = counts.get(cause, 0) + 1

    runs = {t: m for m in by_id.values() for t in m.active}
    for task_id, key in (moving_now or {}).items():
        if moving_before.get(task_id) != key and task_id in runs:
            count(runs[task_id], present.get(key), task_id)
    for member_id, assignment in assignments.items():
        member = by_id.get(member_id)
        if member is None:
            continue
        for task_id in assignment.active:
            before = previous_owners.get(task_id)
            if before is None or before == member.key or moving_before.get(
                    task_id) == member.key:
                continue
            count(present.get(before), member, task_id)
    return counts


def hold_deadlines(memory: LeaderMemory | None, lost_task_delay_ms: int) -> dict[str, int]:
    """Per lost task the leader holds for its owner's return: when it is placed elsewhere."""
    if memory is None:
        return {}
    return {task: since + lost_task_delay_ms for task, (_key, since) in memory.lost.items()}


@dataclass(frozen=True)
class TaskLayout:
    """Which tasks exist and which input partitions each one reads."""

    subs: tuple[SubTopology, ...]

    def tasks(self) -> list[Task]:
        return [
            Task(task_id, sub.stateful) for sub in self.subs for task_id in sub.task_ids()
        ]

    def task_ids(self) -> list[str]:
        return [task_id for sub in self.subs for task_id in sub.task_ids()]

    def sub_of(self, task_id: str) -> SubTopology:
        return self.subs[parse_task_id(task_id)[0]]

    def partitions_of(self, task_id: str) -> list[tuple[str, int]]:
        sub_id, partition = parse_task_id(task_id)
        return [(topic, partition) for topic in sorted(self.subs[sub_id].sources)]


class AssignorMember(Protocol):
    """The member an assignor serves (:class:`streams.group.member.GroupMember`)."""

    def subscription(self) -> Subscription: ...

    def assignment_received(self, assignment: MemberAssignment) -> None: ...

    def unsynced(self, previous_round: list[str]) -> set[str]: ...


class RelayAssignor(AbstractPartitionAssignor):
    """One per stream thread: builds its subscription and, on the leader, runs the assignor.

    ``subscription`` is called at every join so that it reports the current tasks and lags;
    ``on_assigned`` receives this member's decoded assignment. ``fresh_subscription`` gives
    the latest subscription a static member published on the control topic, if any (see
    :mod:`streams.quirks.static_followers`).
    """

    def __init__(
        self,
        layout: TaskLayout,
        config: AssignorConfig,
        subscription: Callable[[], Subscription] | None = None,
        on_assigned: Callable[[MemberAssignment], None] | None = None,
        *,
        cooperative: bool = True,
        fresh_subscription: Callable[[str], bytes | None] = lambda static_id: None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        metrics: Metrics | None = None,
        metrics_label: str = "",
        unsynced: Callable[[list[str]], set[str]] = lambda previous_round: set(),
    ) -> None:
        self._layout = layout
        self._config = config
        self._subscription = subscription
        self._on_assigned = on_assigned
        self._fresh_subscription = fresh_subscription
        self._clock_ms = clock_ms
        #: Which members of the previous round (given their ids) have not reported having
        #: their assignment of it (see :func:`streams.quirks.synced_round.unsynced_members`).
        self._unsynced = unsynced
        #: The member ids of the last round this member assigned as leader (empty when
        #: another member led it).
        self._last_round: list[str] = []
        self.memory: LeaderMemory | None = None
        self._metrics = metrics
        self._label = metrics_label
        #: task -> the member (instance, thread) this leader last placed it on: the previous
        #: owner of a task whose owner vanished without leaving a note.
        self._placed: dict[str, MemberKey] = {}
        #: Read by :class:`streams.kafka.cooperative.CooperativeGroupCoordinator`.
        self.cooperative = cooperative
        #: Whether this member computed the last assignment (was the group's leader).
        self.is_leader = False
        self._assigned_this_round = False
        #: The members, assignments and memory of the round this leader assigned, until it
        #: receives its own assignment of it.
        self._staged: tuple[list[Member], dict[str, MemberAssignment], LeaderMemory] | None = (
            None)
        #: Per static member of the last round this leader assigned, the digest of the
        #: assignment it computed for it. Some brokers let a static follower skip the rejoin
        #: (and keep the generation), so the leader tells them what they should hold, and a
        #: follower holding something else fetches its assignment.
        self.static_digests: dict[str, str] = {}
        #: The digest of the last assignment this member received.
        self.received_digest: str | None = None
        #: The rejoin token of the last subscription sent in a JoinGroup: a rejoin asked for
        #: after it (a higher token) is not part of the round under way.
        self.sent_rejoin_token = 0

    def serve(self, member: AssignorMember) -> None:
        """Build the subscriptions of ``member``, hand it its assignments, and ask it which
        members of the last round are still without theirs."""
        self._subscription = member.subscription
        self._on_assigned = member.assignment_received
        self._unsynced = member.unsynced

    @property
    def name(self) -> str:  # type: ignore[override]
        return PROTOCOL_NAME

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:  # type: ignore[override]
        assert self._subscription is not None, "the assignor serves no member"
        subscription = self._subscription()
        self.sent_rejoin_token = subscription.rejoin_token
        # A new join: a round this member assigned without receiving its own assignment of
        # it never took effect.
        self._assigned_this_round = False
        self._staged = None
        return ConsumerProtocolMemberMetadata(0, sorted(topics),
                                              encode_subscription(subscription))

    def assign(  # type: ignore[override]
        self,
        cluster: ClusterMetadata,
        members: Mapping[str, ConsumerProtocolMemberMetadata],
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        decoded: list[Member] = []
        static_ids: dict[str, str] = {}
        for member_id in sorted(members):
            subscription = decode_subscription_or_none(member_id, members[member_id].user_data)
            if subscription is not None and subscription.static:
                static_id = thread_member_id(subscription.instance_id, subscription.thread)
                static_ids[member_id] = static_id
                subscription = self._freshest(static_id, subscription)
            if subscription is None:
                # Undecodable metadata: the member counts as new, with no state.
                decoded.append(Member(member_id, member_id, 0, frozenset(), {}, {}))
            else:
                decoded.append(member_from_subscription(member_id, subscription))
        waiting = self._unsynced(self._last_round) & set(members)
        if waiting:
            log.info("leader: %d member(s) of the last round have not reported their "
                     "assignment; tasks arriving on their instances go to other threads: %s",
                     len(waiting), ", ".join(sorted(waiting)))
            decoded = [replace(m, unsynced=True) if m.member_id in waiting else m
                       for m in decoded]
        self._last_round = sorted(members)
        log.debug("leader sees %s", [
            (m.member_id[:24], sorted(m.active), m.leaving, dict(m.learners)) for m in decoded])
        assignments, memory = assign(
            self._layout.tasks(), decoded, self._config, self._clock_ms(), self.memory,
            use_learners=self.cooperative,
        )
        self._assigned_this_round = True
        # Kept only once the round synced (on_assignment): a round whose SyncGroup the
        # broker answers with a rebalance (a member joined meanwhile) placed nothing, and
        # its plan would pass for the tasks' previous owners in the round that follows.
        self._staged = (decoded, assignments, memory)
        result: dict[str, ConsumerProtocolMemberAssignment] = {}
        self.static_digests = {}
        learning = sum(len(a.learners) for a in assignments.values())
        for member_id, member_assignment in assignments.items():
            by_topic: dict[str, list[int]] = {}
            for task_id in member_assignment.active:
                for topic, partition in self._layout.partitions_of(task_id):
                    by_topic.setdefault(topic, []).append(partition)
            # Each member learns the round's size: one asking for the next round waits until
            # that many have their assignment (see streams.quirks.synced_round); and how many
            # learners the group holds (see streams.group.learner_readiness).
            user_data = encode_assignment(replace(
                member_assignment, group_size=len(members), group_learners=learning))
            result[member_id] = ConsumerProtocolMemberAssignment(
                0, sorted((t, sorted(ps)) for t, ps in by_topic.items()), user_data
            )
            if member_id in static_ids:
                self.static_digests[static_ids[member_id]] = assignment_digest(user_data)
        log.info("leader assigned %d tasks to %d members", len(self._layout.tasks()), len(result))
        return result

    def _record_round(self, members: list[Member], assignments: Mapping[str, MemberAssignment],
                      previous_memory: LeaderMemory | None) -> None:
        """The leader's figures: tasks moved by cause, and the hold timers of lost tasks."""
        previous: dict[str, MemberKey] = dict(self._placed)
        if previous_memory is not None:
            previous.update(previous_memory.owners)
        for member in members:
            for task_id in member.active:
                previous[task_id] = member.key
        keys = {m.member_id: m.key for m in members}
        moves: list[str] = []
        for member_id, assignment in assignments.items():
            for task_id in assignment.active:
                if member_id in keys:
                    self._placed[task_id] = keys[member_id]
                    was = previous.get(task_id)
                    if was is not None and was != keys[member_id]:
                        moves.append(f"{task_id} {_member_name(was)} -> "
                                     f"{_member_name(keys[member_id])}")
        if moves:
            # Said once per round, for a post-mortem of why work moved; a new leader knows
            # the previous owners only from the notes the members echo.
            log.info("leader%s moves %s", "" if previous_memory is not None
                     else " (new: memory from the members' notes)", ", ".join(sorted(moves)))
        if self._metrics is None:
            return
        # A new leader knows the moves under way from the notes the members echo.
        before = previous_memory if previous_memory is not None else memory_from_notes(members)
        moved = moves_by_cause(previous, members, assignments, self._config.acceptable_lag,
                               before.moving,
                               self.memory.moving if self.memory is not None else None,
                               stateless={t.task_id for t in self._layout.tasks()
                                          if not t.stateful})
        for cause, n in sorted(moved.items()):
            self._metrics.record_moved(self._label, cause, n)
        self._metrics.set_hold_deadlines(
            self._label, hold_deadlines(self.memory, self._config.lost_task_delay_ms))

    def _freshest(self, static_id: str, broker_copy: Subscription) -> Subscription:
        """The broker's copy of a static member's subscription, or the one it published
        later (same process, same or higher token: it publishes after every change)."""
        published = self._fresh_subscription(static_id)
        if published is None:
            return broker_copy
        fresh = decode_subscription_or_none(static_id, published)
        if (fresh is not None and fresh.pid == broker_copy.pid
                and fresh.rejoin_token >= broker_copy.rejoin_token):
            return fresh
        return broker_copy

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:  # type: ignore[override]
        self.is_leader, self._assigned_this_round = self._assigned_this_round, False
        staged, self._staged = self._staged, None
        if self.is_leader and staged is not None:
            members, assignments, memory = staged
            previous_memory, self.memory = self.memory, memory
            self._record_round(members, assignments, previous_memory)
        if not self.is_leader:
            # Another member leads now: should this one lead again later, it rebuilds the
            # memory from the notes members echo, not from what it knew rounds ago.
            self.memory = None
            self._last_round = []
        self.received_digest = assignment_digest(assignment.user_data or b"")
        if self._on_assigned is not None:
            self._on_assigned(decode_assignment(assignment.user_data))


def _member_name(key: MemberKey) -> str:
    return thread_member_id(*key)


def assignment_digest(user_data: bytes) -> str:
    """A short fingerprint of an encoded assignment (leader and member hash the same bytes)."""
    return hashlib.blake2b(user_data, digest_size=8).hexdigest()
