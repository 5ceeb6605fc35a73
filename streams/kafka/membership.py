"""Group membership requests aiokafka 0.14 lacks: LeaveGroup v3 (KIP-345, remove static
members by ``(member_id, group_instance_id)``) and DescribeGroups v0 (aiokafka's v3 response
decoding is broken, and v0 has what Relay needs: member ids and client ids).

Static members never send LeaveGroup on close, so a leaving instance and
``relay remove-members`` use :func:`leave_group` explicitly. Some brokers ignore a removal by
instance id alone, so callers look the member id up first (:func:`describe_group`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import for_code
from aiokafka.protocol.admin import DescribeGroupsRequest_v0
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String

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


class DescribeGroupsV0(Request[DescribeGroupsRequest_v0]):
    API_KEY = 15

    def __init__(self, groups: list[str]) -> None:
        self._groups = groups

    def build(
        self, request_struct_class: type[DescribeGroupsRequest_v0]
    ) -> DescribeGroupsRequest_v0:
        return request_struct_class(self._groups)


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    client_id: str
    client_host: str


@dataclass(frozen=True)
class GroupDescription:
    group: str
    state: str
    protocol: str
    members: tuple[GroupMember, ...]


class MembershipError(RuntimeError):
    pass


async def _coordinator(client: AIOKafkaClient, group: str) -> int:
    return await client.coordinator_lookup(0, group)


async def describe_group(client: AIOKafkaClient, group: str) -> GroupDescription:
    node = await _coordinator(client, group)
    response = await client.send(node, DescribeGroupsV0([group]))
    for error_code, name, state, _ptype, protocol, members in response.groups:
        if error_code:
            raise MembershipError(f"describing group {name}: {for_code(error_code).__name__}")
        return GroupDescription(
            name, state, protocol,
            tuple(GroupMember(m[0], m[1], m[2]) for m in members),
        )
    raise MembershipError(f"the broker did not describe group {group}")


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
