"""Purging repartition topics on a real broker: a group_by then count app deletes what it
committed on its repartition topic (its log start offset moves on, never past the committed
offsets, with the group at least once and with its transactions exactly once) and counts
exactly, through a restart from the purged topic. On Tansu, which closes
the connection on DeleteRecords (quirk ``no-delete-records``), nothing purges and nothing
breaks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from streams.app import App
from streams.runtime.repartition_purge import RepartitionPurger
from tests.broker.streams.harness import counting_topics, exact_counts, make_app, running
from tests.conftest import on_tansu, wait_until

pytestmark = pytest.mark.broker

PARTITIONS = 4


def group_by_count(app_id: str, bootstrap: str, state_dir: Path, source: str, sink: str,
                   guarantee: str) -> App:
    app = make_app(app_id, bootstrap, state_dir, repartition_purge_interval_ms=100,
                   processing_guarantee=guarantee)
    app.stream(source).group_by(lambda key, _value: key) \
        .count(store="counts").to_stream().to(sink)
    return app


async def log_starts(bootstrap: str, topic: str) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        return await consumer.beginning_offsets(
            [TopicPartition(topic, p) for p in range(PARTITIONS)])
    finally:
        await consumer.stop()


async def starts_past(bootstrap: str, topic: str, before: dict[TopicPartition, int]) -> bool:
    """Whether every partition's log start is past ``before`` (0 where it has none)."""
    starts = await log_starts(bootstrap, topic)
    return all(offset > before.get(tp, 0) for tp, offset in starts.items())


async def committed(bootstrap: str, group: str, topic: str) -> dict[TopicPartition, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(
            group, partitions=[TopicPartition(topic, p) for p in range(PARTITIONS)])
    finally:
        await admin.close()
    return {tp: meta.offset for tp, meta in offsets.items()}


def purgers(app: App) -> list[RepartitionPurger | None]:
    return [thread.committer.purger for thread in app.threads]


@pytest.mark.tansu
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_committed_repartition_records_are_deleted_and_the_counts_stay_exact(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], guarantee: str,
) -> None:
    if guarantee == "exactly_once" and on_tansu(bootstrap):
        pytest.skip("nothing purges on Tansu: its smoke run is the at-least-once one")
    app_id = unique("purge")
    source, sink, traffic = await counting_topics(bootstrap, app_id, records=2_000,
                                                  partitions=PARTITIONS)
    app = group_by_count(app_id, bootstrap, tmp_path / "a", source, sink, guarantee)
    (repartition,) = app.topology.repartition_topics
    deletes = not on_tansu(bootstrap)

    async with running(app):
        await wait_until(lambda: bool(app.threads) and all(t.tasks for t in app.threads),
                         timeout_s=120, message="the app running its tasks")
        if not deletes:
            assert purgers(app) == [None]
        traffic.start()
        if deletes:
            # Every partition's log start moves on, and on again while records flow: each
            # commit interval's purge deletes what the last commits covered.
            await wait_until(lambda: starts_past(bootstrap, repartition, {}),
                             timeout_s=60, message="records deleted on every partition")
            first = await log_starts(bootstrap, repartition)
            await wait_until(lambda: starts_past(bootstrap, repartition, first),
                             timeout_s=60, message="a later purge")
        else:
            await traffic.produce(2_000)
        await traffic.stop()
        await exact_counts(bootstrap, sink, traffic.produced)

    starts = await log_starts(bootstrap, repartition)
    if deletes:
        offsets = await committed(bootstrap, app_id, repartition)
        # Never past what the group committed: nothing unread was deleted.
        assert all(0 < starts[tp] <= offsets[tp] for tp in starts), (starts, offsets)
        (purger,) = purgers(app)
        assert purger is not None and purger.requests > 0
    else:
        assert set(starts.values()) == {0}

    # A new instance (state restored from the changelog) resumes from the committed
    # offsets, above the deleted records, and counts on exactly.
    again = group_by_count(app_id, bootstrap, tmp_path / "b", source, sink, guarantee)
    async with running(again):
        await traffic.produce(1_000)
        await exact_counts(bootstrap, sink, traffic.produced)
