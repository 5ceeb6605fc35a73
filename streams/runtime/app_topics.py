"""The topics an app runs on, made ready before any thread joins its group: the declared
topics made, the sources checked and the sub-topologies sized by them, the internal topics
(repartition topics, changelogs, the dead-letter, status and control topics, and the
exactly-once positions topic where the broker's quirks need one) made with the right
partition counts, and a word for an output topic nobody will make as it should be."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient

from statestore.store import changelog_topic_name
from statestore.topics import (
    COMPACTED,
    REPARTITION,
    TopicSpec,
    ensure_topics,
    existing_partition_counts,
)
from streams.config import AppConfig
from streams.dsl.topology import SubTopology, Topology, TopologyError
from streams.group.control import control_topic_name
from streams.group.status_topic import status_topic_name
from streams.quirks.task_positions import TaskPositions, positions_topic_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedTopics:
    """The sized sub-topologies, and where exactly-once tasks record their input positions
    (None when the broker needs no positions topic)."""

    subs: list[SubTopology]
    task_positions: TaskPositions | None


async def prepare_topics(topology: Topology, config: AppConfig, admin: AIOKafkaAdminClient,
                         records_positions: bool) -> PreparedTopics:
    """Check source topics, size the sub-topologies, create the internal topics.
    ``records_positions``: exactly-once on a broker whose quirks need the positions topic."""
    subs = topology.sub_topologies()
    if not subs:
        raise TopologyError("the app declares no streams or tables: nothing to run")
    app = config.application_id
    external = {t for s in subs for t in s.sources if t not in topology.repartition_topics}
    await ensure_topics(admin, [TopicSpec(t, n) for t, n in
                                topology.topics_to_create().items()])
    counts = await existing_partition_counts(admin, external)
    repartition = topology.assign_partitions(subs, counts, config.default_partitions)
    specs = [TopicSpec(topic, n, REPARTITION) for topic, n in sorted(repartition.items())]
    for sub in subs:
        for store in sub.stores:
            specs.append(TopicSpec(changelog_topic_name(app, store), sub.partitions, COMPACTED))
    specs.append(TopicSpec(config.dead_letters, 1))
    specs.append(TopicSpec(status_topic_name(app), 1, COMPACTED))
    specs.append(TopicSpec(control_topic_name(app), 1, COMPACTED))
    if records_positions:
        tasks = sum(sub.partitions for sub in subs)
        specs.append(TopicSpec(positions_topic_name(app), tasks, COMPACTED))
    # An existing topic with another partition count is refused here, as a changelog is.
    await ensure_topics(admin, specs)
    await warn_of_missing_sinks(topology, admin, subs)
    positions = (TaskPositions.of(app, [t for sub in subs for t in sub.task_ids()])
                 if records_positions else None)
    return PreparedTopics(subs, positions)


async def warn_of_missing_sinks(topology: Topology, admin: AIOKafkaAdminClient,
                                subs: list[SubTopology]) -> None:
    """An output topic that neither exists nor is declared with a partition count is made by
    the broker at the first write, with its default count (one, usually), if it makes topics
    at all: said once at start, rather than found out downstream."""
    declared = topology.topics_to_create()
    sinks = {t for sub in subs for t in sub.sink_topics
             if t not in topology.repartition_topics and t not in declared}
    if not sinks:
        return
    try:
        existing = set(await admin.list_topics())
    except Exception as exc:  # a warning's worth of checking; the run goes on
        log.debug("could not list topics to check the output topics: %s", exc)
        return
    for topic in sorted(sinks - existing):
        log.info("output topic %s does not exist and is not declared with a partition "
                 "count: the broker makes it at the first write with its default count "
                 "(one partition, usually), or refuses the writes; declare it with "
                 "app.topic(%r, partitions=N) to have the app make it", topic, topic)
