"""Departed members the broker still keeps in the group: found from the status topic and
removed with LeaveGroup, so that a newcomer is never held by a member that is gone.

A static member stops without LeaveGroup, so that a restart within its session timeout gets
its tasks back. Its session then expires, and on Apache Kafka that ends it. Tansu keeps an
expired leader as the leader of the next round: a static member that replaces it (a new
``group_instance_id``) joins round after round as a follower of a member that is gone and
never gets an assignment (seen for minutes, until an operator removed the departed member).

Tansu also keeps a member frozen (a SIGSTOP) just after it joined a round in the rounds
that follow, with its tasks, past its session (17 s after the stop with 10-s sessions); a
frozen leader's follow-up round was never told to the others at all (53 s).

So a member that has been joining for longer than a round, or that sees from the status
records that another has been silent for longer than a session timeout
(:mod:`streams.group.join_watch`), removes, itself, every static
member of the group that has published nothing for a session timeout: its status record
(published every second while it runs) is older than that, or it tombstoned its record (a
clean stop) longer ago than that. By then its session is over on any broker, so removing it
changes nothing on a broker that already expired it. A member with no record at all (not a
Relay member, or one that just started) is left alone.

A leader not before the broker's own look at sessions, though: a member whose last status
record says it led the group is removed only once it has been silent for
:data:`EXPIRY_GRACE_MS` past its session timeout (:func:`removable_after_ms`). Tansu ends the
leadership of a member its own expiry removes, but not of one removed by LeaveGroup while it
leads a round being formed: a leader frozen just after it joined such a round, and removed
70 ms before its session ended, held the others' SyncGroups until it came back, 29 s later
(with 6-s sessions: 24 s to an assignment against 12.6 s when left to the broker). Any other
member goes as its session ends: Tansu may keep a frozen follower past it (2 s and more).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from aiokafka.client import AIOKafkaClient

from streams.group.member_id import static_id_of
from streams.group.status_topic import read_status
from streams.kafka.membership import GroupMember, describe_group, leave_group

log = logging.getLogger(__name__)

#: How long past its session timeout a member must have been silent before it is removed:
#: its last heartbeat may come a status interval (a second) after its last status record, and
#: the broker's own look at sessions a moment after its session ends.
EXPIRY_GRACE_MS = 2_000


def removable_after_ms(session_timeout_ms: int, leader: bool) -> int:
    """How long a static member must have been silent before it is removed (``leader``: its
    last status record says it led the group)."""
    return session_timeout_ms + EXPIRY_GRACE_MS if leader else session_timeout_ms


def departed_static_members(
    members: Iterable[GroupMember], statuses: dict[str, dict[str, Any]],
    departures: dict[str, int], now_ms: int, session_timeout_ms: int, own: str | None,
) -> list[tuple[str, str]]:
    """``(member_id, static_id)`` of the members that have published nothing for longer
    than :func:`removable_after_ms`, ``own`` excepted."""
    gone = []
    for member in members:
        static = static_id_of(member.member_id)
        if static is None or static == own:
            continue
        status = statuses.get(static)
        # A running member's last record, else when it stopped cleanly.
        last = status.get("updated_ms") if status is not None else departures.get(static)
        leader = status is not None and status.get("leader") is True
        if isinstance(last, int) and now_ms - last > removable_after_ms(session_timeout_ms,
                                                                          leader):
            gone.append((member.member_id, static))
    return gone


async def remove_departed_members(
    client: AIOKafkaClient, bootstrap: str, group: str, session_timeout_ms: int,
    own: str | None,
) -> list[str]:
    """Remove the departed static members of ``group``; returns their static ids."""
    departures: dict[str, int] = {}
    statuses = await read_status(bootstrap, group, departures)
    described = await describe_group(client, group)
    gone = departed_static_members(described.members, statuses, departures,
                                   int(time.time() * 1000), session_timeout_ms, own)
    if not gone:
        return []
    answers = await leave_group(client, group, gone)
    log.warning("removed departed members from the group (silent for over %d ms): %s",
                session_timeout_ms,
                ", ".join(f"{s} ({answers.get(s) or 'removed'})" for _m, s in gone))
    return [s for _m, s in gone]
