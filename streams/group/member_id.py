"""The member id of a stream thread, built and parsed here only.

Each thread of an instance is the group member ``<instance id>-thread-<n>`` (seed 001): its
``group.instance.id`` when the instance is static, and the key of its status record either
way. The broker's own member id for a static member is that id followed by ``-<uuid>``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SEPARATOR = "-thread-"
#: A static member's id on the broker: ``<instance>-thread-<n>-<uuid>``.
_BROKER_MEMBER_ID = re.compile(r"^(.+-thread-\d+)-[0-9a-fA-F-]{36}$")


def thread_member_id(instance_id: str, index: int) -> str:
    """The member id of thread ``index`` of instance ``instance_id``."""
    return f"{instance_id}{SEPARATOR}{index}"


def instance_member_ids(instance_id: str, num_threads: int) -> set[str]:
    """The member ids of every thread of an instance."""
    return {thread_member_id(instance_id, n) for n in range(num_threads)}


def parse_member_id(member_id: str) -> tuple[str, int] | None:
    """``(instance id, thread index)`` of a thread's member id; None for any other text."""
    instance, separator, index = member_id.rpartition(SEPARATOR)
    if not separator or not instance or not index.isdigit():
        return None
    return instance, int(index)


def instance_of(member_id: str) -> str:
    """The instance a thread's member id belongs to (the text itself when it is none)."""
    parsed = parse_member_id(member_id)
    return parsed[0] if parsed is not None else member_id


def static_id_of(broker_member_id: str) -> str | None:
    """The thread's member id within the broker's id of a static member, if it is one."""
    match = _BROKER_MEMBER_ID.match(broker_member_id)
    return match.group(1) if match else None


def thread_id_in(text: str, application_id: str = "") -> str | None:
    """The thread's member id a member's other names start with, if any: its group instance id
    (the id itself), its id on the broker (``<id>-<uuid>``) or its client id
    (``<application id>-<id>``)."""
    if application_id and text.startswith(f"{application_id}-"):
        text = text[len(application_id) + 1:]
    if parse_member_id(text) is not None:
        return text
    return static_id_of(text)


def of_instances(instance_ids: Iterable[str], num_threads: int) -> set[str]:
    """The member ids of every thread of several instances."""
    return {m for i in instance_ids for m in instance_member_ids(i, num_threads)}
