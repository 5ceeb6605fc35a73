"""A group as its broker describes it: each member's subscription and last assignment, decoded
from the member metadata DescribeGroups carries (Relay's own user data inside the consumer
protocol's envelope).

Apache Kafka keeps both for every member of a classic group. Some brokers (Tansu) answer
with empty metadata; then there is nothing to decode, and the members' status records (see
:mod:`streams.group.status_topic`) are all a tool has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from assignor.protocol import ProtocolError, decode_assignment, decode_subscription
from streams.kafka.membership import GroupMember


@dataclass(frozen=True)
class DescribedMember:
    """One member as the broker holds it."""

    member_id: str
    #: Its static id as the broker knows it, else as its subscription says.
    static_id: str | None
    instance_id: str | None
    thread: int | None
    #: What its subscription says it ran when it joined the last round.
    owned: tuple[str, ...]
    leaving: bool
    #: What the leader assigned it in the last round (None: the broker has no assignment).
    active: tuple[str, ...] | None
    learners: tuple[str, ...]
    standbys: tuple[str, ...]
    #: Why part of it could not be decoded (None: all of it was).
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"member_id": self.member_id, "static_id": self.static_id,
                "instance_id": self.instance_id, "thread": self.thread,
                "owned": list(self.owned), "leaving": self.leaving,
                "active": None if self.active is None else list(self.active),
                "learners": list(self.learners), "standbys": list(self.standbys),
                "problem": self.problem}


def described_members(members: tuple[GroupMember, ...]) -> list[DescribedMember] | None:
    """The members with their decoded metadata, or None when the broker gave none for any
    member (it keeps none); an empty list for a group without members. A member whose
    metadata is not Relay's, or is corrupt, is listed with what could be read and the
    problem."""
    if not members:
        return []
    if not any(m.metadata or m.assignment for m in members):
        return None
    return [_described(m) for m in members]


def _described(member: GroupMember) -> DescribedMember:
    problems: list[str] = []
    instance = thread = None
    owned: tuple[str, ...] = ()
    leaving = static = False
    # The envelope's decoder raises whatever a short or foreign blob makes it raise.
    try:
        subscription = decode_subscription(
            ConsumerProtocolMemberMetadata.decode(member.metadata).user_data)
        instance, thread = subscription.instance_id, subscription.thread
        owned, leaving = tuple(subscription.active), subscription.leaving
        static = subscription.static
    except Exception as exc:
        problems.append(f"subscription: {_reason(exc)}")
    active: tuple[str, ...] | None = None
    learners: tuple[str, ...] = ()
    standbys: tuple[str, ...] = ()
    if member.assignment:
        try:
            assigned = decode_assignment(
                ConsumerProtocolMemberAssignment.decode(member.assignment).user_data)
            active, learners, standbys = assigned.active, assigned.learners, assigned.standbys
        except Exception as exc:
            problems.append(f"assignment: {_reason(exc)}")
    static_id = member.group_instance_id or (
        f"{instance}-thread-{thread}" if static and thread is not None else None)
    return DescribedMember(member.member_id, static_id, instance, thread, owned, leaving,
                           active, learners, standbys, "; ".join(problems) or None)


def _reason(error: Exception) -> str:
    return str(error) if isinstance(error, ProtocolError) else f"{type(error).__name__}: {error}"
