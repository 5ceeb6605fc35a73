"""Topic administration: create the topics an application needs with the right partition count
and configuration, and refuse to run against an existing topic of the wrong shape.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from statestore.errors import TopicMismatchError

log = logging.getLogger(__name__)

TOPIC_ALREADY_EXISTS = 36
COMPACTED = {"cleanup.policy": "compact"}
#: A repartition topic keeps its records until the tasks reading it are past them, however
#: old their timestamps: they carry their source records' timestamps, which a broker's time
#: retention (7 days by default on Apache Kafka) would otherwise delete, unread, when an app
#: processes older data. Kafka Streams creates its repartition topics the same way.
REPARTITION = {"cleanup.policy": "delete", "retention.ms": "-1"}
#: Kafka's usual replication; a smaller cluster gets one replica per broker.
MAX_REPLICATION = 3
#: How long a created topic may take to reach the metadata of the broker that answers.
METADATA_PROPAGATION_S = 30.0


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"topic {self.name}: partitions must be >= 1, not {self.partitions}")


async def existing_partition_counts(
    admin: AIOKafkaAdminClient, names: Iterable[str], with_leaders: bool = False
) -> dict[str, int]:
    """Partition counts of those of ``names`` that exist.

    Some brokers create a topic when it is described, so existence is checked with a topic
    listing first and only existing topics are described. A topic described with an error
    counts as not there yet; ``with_leaders``, so does one with a partition whose leader the
    answering broker does not know yet.
    """
    wanted = set(names)
    present = sorted(wanted & set(await admin.list_topics()))
    if not present:
        return {}
    described = await admin.describe_topics(present)
    return {entry["topic"]: len(entry["partitions"]) for entry in described
            if entry.get("error_code", 0) == 0 and entry["partitions"]
            and not (with_leaders and not _led(entry["partitions"]))}


def _led(partitions: list[dict[str, object]]) -> bool:
    return all(p.get("error_code", 0) == 0 and int(p.get("leader", -1)) >= 0  # type: ignore[call-overload]
               for p in partitions)


async def replication_factor(admin: AIOKafkaAdminClient) -> int:
    """The replication of new topics: three replicas, or one per broker on a smaller cluster.

    The broker's own default (replication factor -1) needs CreateTopics v4, which the
    client does not speak."""
    brokers = (await admin.describe_cluster()).get("brokers") or []
    return max(1, min(MAX_REPLICATION, len(brokers)))


async def _created(admin: AIOKafkaAdminClient, names: list[str],
                   timeout_s: float) -> dict[str, int]:
    """The partition counts of just-created topics, once the answering broker's metadata
    has them all, or what it has after ``timeout_s``. Apache Kafka answers CreateTopics
    when its controller has the topics; each broker learns of them a moment later."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts = await existing_partition_counts(admin, names, with_leaders=True)
        # This answer, not another request: on a cluster the next may go to a broker whose
        # metadata has not caught up yet.
        if len(counts) == len(names):
            return counts
        if time.monotonic() > deadline:
            return await existing_partition_counts(admin, names)
        await asyncio.sleep(0.05)


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
                f"{expected} (as declared with app.topic(..., partitions={expected}), or, for "
                f"an internal topic, as its sub-topology's source topics have): declare the "
                f"count the topic has, or delete the topic"
            )
    missing = [spec for name, spec in sorted(by_name.items()) if name not in counts]
    if not missing:
        return
    replicas = await replication_factor(admin)
    response = await admin.create_topics(
        [NewTopic(s.name, s.partitions, replicas, topic_configs=dict(s.config))
         for s in missing]
    )
    for topic, code, message in response.topic_errors:
        if code not in (0, TOPIC_ALREADY_EXISTS):
            raise TopicMismatchError(f"could not create topic {topic}: error {code} {message}")
        log.info("created topic %s", topic)
    # Another member may have created one of them in the meantime: check the shape again.
    racing = [s.name for s in missing]
    counts = await _created(admin, racing, METADATA_PROPAGATION_S)
    for name in racing:
        if counts.get(name) != by_name[name].partitions:
            raise TopicMismatchError(
                f"topic {name} has {counts.get(name)} partitions, expected "
                f"{by_name[name].partitions}"
            )


async def partition_count(bootstrap: str, topic: str) -> int | None:
    """How many partitions ``topic`` has (None: it does not exist). A consumer's own metadata
    knows only the topics it asked about, which on Apache Kafka (unlike Tansu, which answers
    with every topic) excludes one it has never fetched."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return (await existing_partition_counts(admin, [topic])).get(topic)
    finally:
        await admin.close()
