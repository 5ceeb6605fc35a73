"""``relay reset APP``: make an app process its input again from the start, as Kafka Streams'
application reset tool does.

With every instance of the app stopped, a reset:

- deletes the consumer group, and with it the committed offsets: the app then reads every
  source topic from its earliest offset, as it does with nothing committed;
- deletes the app's internal topics, its repartition topics and its stores' changelogs (and
  the exactly-once positions topic where the broker needed one), which the next run creates
  again empty;
- with ``--state-dir``, deletes the app's local state there. A state directory left alone is
  harmless: its stores reflect changelogs longer than the new ones, and the next run
  discards them and restores from the (empty) changelogs.

Which topics are internal is read from the topology the app publishes on its control topic
at each start, not guessed from names: another app whose id starts with this one's keeps its
topics. Sources, sinks, the status and control topics are kept.

:func:`plan_reset` is the pure decision; :func:`reset` carries it out.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.admin import DeleteGroupsRequest

from streams.dsl.describe import TopologyDescription
from streams.group.control import control_topic_name
from streams.group.member_id import instance_of, static_id_of
from streams.group.predecessors import MemberFiles
from streams.group.topology_record import TOPOLOGY_KEY, decode_topology_record
from streams.kafka.membership import describe_group
from streams.kafka.topic_reader import read_to_end
from streams.quirks.detect import broker_quirks
from streams.quirks.switch import Quirk
from streams.quirks.task_positions import positions_topic_name

#: DeleteGroups' answers: the group had no offsets to delete, or it still has members.
GROUP_ID_NOT_FOUND = 69
NON_EMPTY_GROUP = 68


class ResetRefused(Exception):
    """The reset cannot be done as asked; nothing was changed."""


@dataclass(frozen=True)
class ResetPlan:
    """What a reset of ``app`` deletes."""

    app: str
    #: Internal topics that exist, to delete.
    topics: tuple[str, ...]
    #: Source topics, read again from their earliest offsets once the group is deleted.
    sources: tuple[str, ...]
    #: ``<state_dir>/<app>`` directories that exist, to delete.
    state_dirs: tuple[Path, ...]

    def lines(self) -> list[str]:
        return [
            f"consumer group {self.app}: deleted, so that every source is read again from "
            f"its earliest offset ({', '.join(self.sources) or 'no sources'})",
            *(f"topic {t}: deleted (internal)" for t in self.topics),
            *(f"state {d}: deleted" for d in self.state_dirs),
        ]


def internal_topics(app: str, description: TopologyDescription) -> set[str]:
    """The topics the app made for itself, as its published topology names them."""
    return {*description.repartition_topics, *description.changelog_topics,
            positions_topic_name(app)}


def plan_reset(app: str, description: TopologyDescription, existing: Iterable[str],
               state_dirs: Iterable[Path]) -> ResetPlan:
    existing = set(existing)
    internal = internal_topics(app, description)
    sources = sorted(set(description.source_topics) - internal)
    return ResetPlan(app, tuple(sorted(internal & existing)), tuple(sources),
                     tuple(Path(d) / app for d in state_dirs if (Path(d) / app).exists()))


def refuse_live(app: str, live_members: Iterable[str],
                state_dir_holders: dict[Path, str | None]) -> None:
    """Raises :class:`ResetRefused` while any instance of ``app`` runs: a reset under a live
    app would be undone by its next commit, and its stores would keep what it deleted."""
    members = sorted(live_members)
    if members:
        raise ResetRefused(
            f"{app} is running ({', '.join(members)} published their status lately): stop "
            f"every instance first")
    for directory, holder in state_dir_holders.items():
        if holder is not None:
            raise ResetRefused(f"{holder} runs {app} from state directory {directory}: "
                               f"stop it first")


async def published_topology(bootstrap: str, app: str) -> TopologyDescription:
    """The topology the app published last on its control topic."""
    topic = control_topic_name(app)
    records = await read_to_end(bootstrap, topic) or []
    found = [r for r in records if r.key == TOPOLOGY_KEY and r.value is not None]
    if not found:
        raise ResetRefused(
            f"{app} published no topology on {topic} (it never ran, or ran with a Relay "
            f"older than its topology records): its internal topics are not known for sure")
    try:
        return decode_topology_record(found[-1].value).description
    except ValueError as exc:
        raise ResetRefused(f"the topology {app} published cannot be read: {exc}") from None


def members_left(app: str, members: Iterable[Any]) -> ResetRefused:
    """The refusal for a group the broker still counts ``members`` in."""
    instances = sorted({instance_of(static_id_of(m.member_id) or m.member_id)
                        for m in members})
    return ResetRefused(
        f"the broker still counts members in group {app} ({', '.join(instances)}): static "
        f"members stay until their session expires after a stop; wait for it, or remove "
        f"them with `relay remove-members {app} {' '.join(instances) or 'INSTANCE...'}`")


async def refuse_members_left(bootstrap: str, app: str) -> None:
    """What deleting the group would meet, without deleting it (a dry run)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        members = (await describe_group(client, app)).members
    finally:
        await client.close()
    if members:
        raise members_left(app, members)


async def delete_group(bootstrap: str, app: str) -> None:
    """Delete the consumer group ``app`` (its committed offsets with it)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        coordinator = await client.coordinator_lookup(0, app)
        response = await client.send(coordinator, DeleteGroupsRequest([app]))
        [(_group, code)] = response.results
        members = (await describe_group(client, app)).members if code == NON_EMPTY_GROUP \
            else []
    finally:
        await client.close()
    if code == NON_EMPTY_GROUP:
        raise members_left(app, members)
    if code not in (0, GROUP_ID_NOT_FOUND):
        raise ResetRefused(f"the broker refused to delete group {app} (error code {code})")


async def reset(bootstrap: str, app: str, live_members: Iterable[str],
                state_dirs: Iterable[Path], dry_run: bool) -> ResetPlan:
    """Check, plan and (unless ``dry_run``) carry out the reset of ``app``."""
    state_dirs = list(state_dirs)
    refuse_live(app, live_members,
                {d: MemberFiles.live_holder(d, app) for d in state_dirs})
    description = await published_topology(bootstrap, app)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        plan = plan_reset(app, description, await admin.list_topics(), state_dirs)
        if dry_run:
            if Quirk.GROUP_DELETED_WITH_MEMBERS not in await broker_quirks(
                    "auto", None, bootstrap, embedded=False):
                await refuse_members_left(bootstrap, app)
            return plan
        # The group first: a group that still has members stops the reset with nothing
        # deleted.
        await delete_group(bootstrap, app)
        if plan.topics:
            await admin.delete_topics(list(plan.topics))
    finally:
        await admin.close()
    for directory in plan.state_dirs:
        shutil.rmtree(directory)
    return plan


def plan_json(plan: ResetPlan, dry_run: bool) -> dict[str, Any]:
    return {"app": plan.app, "dry_run": dry_run, "deleted_topics": list(plan.topics),
            "sources": list(plan.sources), "deleted_state": [str(d) for d in plan.state_dirs]}
