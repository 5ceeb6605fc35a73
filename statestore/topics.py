"""Topic administration: create the topics an application needs with the right partition count
and configuration, and refuse to run against an existing topic of the wrong shape.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from statestore.errors import TopicMismatchError

log = logging.getLogger(__name__)

TOPIC_ALREADY_EXISTS = 36
COMPACTED = {"cleanup.policy": "compact"}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"topic {self.name}: partitions must be >= 1, not {self.partitions}")


async def existing_partition_counts(
    admin: AIOKafkaAdminClient, names: Iterable[str]
) -> dict[str, int]:
    """Partition counts of those of ``names`` that exist.

    Some brokers create a topic when it is described, so existence is checked with a topic
    listing first and only existing topics are described.
    """
    wanted = set(names)
    present = sorted(wanted & set(await admin.list_topics()))
    if not present:
        return {}
    described = await admin.describe_topics(present)
    return {entry["topic"]: len(entry["partitions"]) for entry in described}


async def ensure_topics(admin: AIOKafkaAdminClient, specs: Iterable[TopicSpec]) -> None:
    """Create missing topics; raise :class:`TopicMismatchError` for a wrong partition count."""
    by_name = {spec.name: spec for spec in specs}
    if not by_name:
        return
    counts = await existing_partition_counts(admin, by_name)
    for name, count in counts.items():
        expected = by_name[name].partitions
        if count != expected:
            raise TopicMismatchError(
                f"topic {name} exists with {count} partitions but this application needs "
                f"{expected}; delete it, or fix the partition count of its source topics"
            )
    missing = [spec for name, spec in sorted(by_name.items()) if name not in counts]
    if not missing:
        return
    response = await admin.create_topics(
        [NewTopic(s.name, s.partitions, 1, topic_configs=dict(s.config)) for s in missing]
    )
    for topic, code, message in response.topic_errors:
        if code not in (0, TOPIC_ALREADY_EXISTS):
            raise TopicMismatchError(f"could not create topic {topic}: error {code} {message}")
        log.info("created topic %s", topic)
    # Another member may have created one of them in the meantime: check the shape again.
    racing = [s.name for s in missing]
    counts = await existing_partition_counts(admin, racing)
    for name in racing:
        if counts.get(name) != by_name[name].partitions:
            raise TopicMismatchError(
                f"topic {name} has {counts.get(name)} partitions, expected "
                f"{by_name[name].partitions}"
            )
