"""Group membership requests aiokafka 0.14 lacks: LeaveGroup v3 (KIP-345, remove static
members by ``(member_id, group_instance_id)``) and DescribeGroups v4 (each member's
``group_instance_id``; aiokafka's v3 response decoding is broken), falling back to v0 on a
broker without v4. Both versions carry each member's subscription metadata and assignment
as the broker holds them; some brokers (Tansu) leave them empty.

Static members never send LeaveGroup on close, so a leaving instance and
``relay remove-members`` use :func:`leave_group` explicitly. Apache Kafka removes a static
member by its instance id alone (KIP-345); some brokers (Tansu) ignore that, so callers there
look the member id up first (:func:`describe_group`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import aiokafka.errors
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import BrokerResponseError, KafkaError, for_code
from aiokafka.protocol.admin import DescribeGroupsRequest_v0
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Bytes, Int16, Int32, Schema, String

log = logging.getLogger(__name__)


class LeaveGroupResponse_v3(Response):
    API_KEY = 13
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("members", Array(
            ("member_id", String("utf-8")),
            ("group_instance_id", String("utf-8")),
            ("error_code", Int16),
        )),
    )


class LeaveGroupRequest_v3(RequestStruct):
    API_KEY = 13
    API_VERSION = 3
    RESPONSE_TYPE = LeaveGroupResponse_v3
    SCHEMA = Schema(
        ("group_id", String("utf-8")),
        ("members", Array(
            ("member_id", String("utf-8")),
            ("group_instance_id", String("utf-8")),
        )),
    )


class LeaveGroupV3(Request[LeaveGroupRequest_v3]):
    API_KEY = 13

    def __init__(self, group: str, members: list[tuple[str, str | None]]) -> None:
        self._group = group
        self._members = members

    def build(self, request_struct_class: type[LeaveGroupRequest_v3]) -> LeaveGroupRequest_v3:
        return request_struct_class(self._group, self._members)


class DescribeGroupsResponse_v4(Response):
    API_KEY = 15
    API_VERSION = 4
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("groups", Array(
            ("error_code", Int16),
            ("group", String("utf-8")),
            ("state", String("utf-8")),
            ("protocol_type", String("utf-8")),
            ("protocol", String("utf-8")),
            ("members", Array(
                ("member_id", String("utf-8")),
                ("group_instance_id", String("utf-8")),
                ("client_id", String("utf-8")),
                ("client_host", String("utf-8")),
                ("member_metadata", Bytes),
                ("member_assignment", Bytes),
            )),
            ("authorized_operations", Int32),
        )),
    )


class DescribeGroupsRequest_v4(RequestStruct):
    API_KEY = 15
    API_VERSION = 4
    RESPONSE_TYPE = DescribeGroupsResponse_v4
    SCHEMA = Schema(
        ("groups", Array(String("utf-8"))), ("include_authorized_operations", Boolean)
    )


class DescribeGroups(Request[DescribeGroupsRequest_v0 | DescribeGroupsRequest_v4]):
    """v4 where the broker has it, else v0."""

    API_KEY = 15

    def __init__(self, groups: list[str]) -> None:
        self._groups = groups

    def build(
        self, request_struct_class: type[DescribeGroupsRequest_v0 | DescribeGroupsRequest_v4]
    ) -> DescribeGroupsRequest_v0 | DescribeGroupsRequest_v4:
        if request_struct_class is DescribeGroupsRequest_v4:
            return DescribeGroupsRequest_v4(self._groups, False)
        return DescribeGroupsRequest_v0(self._groups)


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    client_id: str
    client_host: str
    #: Its ``group.instance.id`` as the broker knows it (None: dynamic, or not told).
    group_instance_id: str | None = None
    #: Its subscription (consumer protocol) as the broker holds it; empty when not kept.
    metadata: bytes = b""
    #: Its assignment (consumer protocol) from the last round; empty when not kept.
    assignment: bytes = b""


@dataclass(frozen=True)
class GroupDescription:
    group: str
    state: str
    protocol: str
    members: tuple[GroupMember, ...]


class MembershipError(RuntimeError):
    pass


class FencedInstanceIdError(BrokerResponseError):
    """KIP-345's answer to a static member whose instance id another member has joined
    with since: aiokafka 0.14 has no class for it, and would call it UnknownError."""

    errno = 82
    message = "FENCED_INSTANCE_ID"
    description = "The broker fenced this member: another member joined with its instance id."


class FencedMemberError(KafkaError):
    """The broker fenced this static member (KIP-345): another process runs its
    ``group.instance.id``. The member cannot go on; the other one keeps its tasks."""


def register_errors() -> None:
    """Teach aiokafka's error table the codes it lacks (idempotent)."""
    aiokafka.errors.kafka_errors.setdefault(FencedInstanceIdError.errno, FencedInstanceIdError)


def fenced(error: BaseException) -> bool:
    """Whether ``error`` is (or aiokafka's wrapping of) a FENCED_INSTANCE_ID answer: aiokafka
    turns unexpected answers to heartbeats and joins into a plain KafkaError naming them."""
    return isinstance(error, FencedInstanceIdError | FencedMemberError) or \
        FencedInstanceIdError.__name__ in str(error)


def fenced_member_error(group: str, static_id: str | None) -> FencedMemberError:
    return FencedMemberError(
        f"the broker fenced static member {static_id} of group {group}: another process "
        f"joined with group.instance.id {static_id} (KIP-345), and runs its tasks now. Give "
        "each instance its own group_instance_id; this thread stops")


async def _coordinator(client: AIOKafkaClient, group: str) -> int:
    return await client.coordinator_lookup(0, group)


async def describe_group(client: AIOKafkaClient, group: str) -> GroupDescription:
    node = await _coordinator(client, group)
    response = await client.send(node, DescribeGroups([group]))
    for error_code, name, state, _ptype, protocol, members, *_ops in response.groups:
        if error_code:
            raise MembershipError(f"describing group {name}: {for_code(error_code).__name__}")
        return GroupDescription(name, state, protocol, tuple(_member(m) for m in members))
    raise MembershipError(f"the broker did not describe group {group}")


def _member(fields: tuple[object, ...]) -> GroupMember:
    if len(fields) == 6:  # v4: the instance id after the member id
        member_id, instance, client_id, host, metadata, assignment = fields
    else:
        member_id, client_id, host, metadata, assignment = fields
        instance = None
    return GroupMember(str(member_id), str(client_id), str(host),
                       str(instance) if instance else None,
                       bytes(metadata or b""), bytes(assignment or b""))


async def leave_group(
    client: AIOKafkaClient, group: str, members: list[tuple[str, str | None]]
) -> dict[str, str | None]:
    """Remove ``(member_id, group_instance_id)`` pairs (the instance id None for a dynamic
    member); returns the error or None of each, keyed by its instance id, or by its member
    id when it has none."""
    node = await _coordinator(client, group)
    response = await client.send(node, LeaveGroupV3(group, members))
    if response.error_code:
        raise MembershipError(
            f"LeaveGroup for {group} failed: {for_code(response.error_code).__name__}"
        )
    return {
        (instance or member): (for_code(code).__name__ if code else None)
        for member, instance, code in response.members
    }


async def leave_as_static_member(
    client: AIOKafkaClient | None, group: str, member_id: str, static_id: str
) -> None:
    """A static member never sends LeaveGroup on close; one that handed everything over
    leaves explicitly, so the group does not wait a session timeout for it. A failure is
    logged: the session timeout then does the same."""
    if not member_id or client is None:
        return
    try:
        errors = await leave_group(client, group, [(member_id, static_id)])
        log.info("%s left the group: %s", static_id, errors)
    except Exception as exc:
        log.warning("%s: LeaveGroup failed (%s); the session timeout will do", static_id, exc)
