"""Purging repartition topics after commits: when a purge is due, which partitions it
deletes up to which offset, what a failure does, and which threads purge at all."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

import pytest
from aiokafka.structs import TopicPartition

from streams.app import App
from streams.dsl.topology import SubTopology
from streams.quirks.hooks import RoundHooks, hooks_for
from streams.quirks.switch import BrokerQuirks, Quirk
from streams.runtime.factory import ThreadClients, build_stream_thread
from streams.runtime.repartition_purge import (
    RepartitionPurger,
    purge_due,
    records_to_delete,
    repartition_inputs,
)
from streams.runtime.task import StreamTask
from tests.unit.streams.fakes import (
    FakeChangelogReader,
    FakeConsumer,
    FakeControl,
    FakeProducer,
    config,
    counting_subs,
)

SOURCE = "in"


def two_stage_subs(partitions: int = 4) -> list[SubTopology]:
    """A stateless stage, then a count behind a repartition topic."""
    app = App("unit", bootstrap_servers="127.0.0.1:1")
    app.stream(SOURCE).select_key(lambda k, _v: k).repartition() \
        .group_by_key().count(store="counts").to_stream().to("out")
    subs = app.topology.sub_topologies()
    app.topology.assign_partitions(subs, {SOURCE: partitions}, partitions)
    return subs


def tasks_of(subs: list[SubTopology], partition: int) -> tuple[StreamTask, StreamTask, str]:
    """The first stage's task and the count's task on ``partition``, and the repartition
    topic between them."""
    first, count = sorted(subs, key=lambda s: bool(s.repartition_sources))
    (topic,) = count.repartition_sources
    return (StreamTask(f"{first.id}_{partition}", first, {}),
            StreamTask(f"{count.id}_{partition}", count, {}), topic)


def test_a_purge_is_due_once_the_interval_passed_and_no_request_is_under_way() -> None:
    assert not purge_due(now_ms=29_999, last_ms=0, interval_ms=30_000, in_flight=False)
    assert purge_due(now_ms=30_000, last_ms=0, interval_ms=30_000, in_flight=False)
    assert not purge_due(now_ms=90_000, last_ms=0, interval_ms=30_000, in_flight=True)
    # 0: after every commit.
    assert purge_due(now_ms=5, last_ms=5, interval_ms=0, in_flight=False)


def test_records_go_below_the_committed_offset_of_the_partitions_asked_for_only() -> None:
    r0, r1, r2, r3 = (TopicPartition("app-rep", p) for p in range(4))
    committed = {r0: 40, r1: 7, r2: 0, TopicPartition(SOURCE, 0): 99,
                 TopicPartition("app-rep", 9): 500}
    # r3 has no committed offset; r2 committed nothing; r1 was deleted up to 7 already.
    assert records_to_delete(committed, [r0, r1, r2, r3], purged={r1: 7, r0: 12}) == {r0: 40}
    assert records_to_delete(committed, [r0, r1], purged={}) == {r0: 40, r1: 7}
    # Never below what was deleted already (another member purged further).
    assert records_to_delete({r0: 40}, [r0], purged={r0: 50}) == {}


def test_only_the_tasks_reading_a_repartition_topic_have_partitions_to_purge() -> None:
    first, count, topic = tasks_of(two_stage_subs(), 2)
    assert repartition_inputs([first]) == []
    assert repartition_inputs([first, count]) == [TopicPartition(topic, 2)]


class FakeDeleter:
    """Answers DeleteRecords as a broker does, or with what a test sets."""

    def __init__(self) -> None:
        self.requests: list[dict[TopicPartition, int]] = []
        self.answers: dict[TopicPartition, int | Exception] = {}
        self.raises: Exception | None = None
        self.hold: asyncio.Event | None = None
        self.closed = False

    async def delete_before(self, offsets: Mapping[TopicPartition, int],
                            ) -> dict[TopicPartition, int | Exception]:
        self.requests.append(dict(offsets))
        if self.hold is not None:
            await self.hold.wait()
        if self.raises is not None:
            raise self.raises
        return {tp: self.answers.get(tp, offset) for tp, offset in offsets.items()}

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def settled(purger: RepartitionPurger) -> None:
    while purger.in_flight:
        await asyncio.sleep(0)


async def test_a_purge_after_a_commit_deletes_what_the_running_tasks_committed() -> None:
    first, count, topic = tasks_of(two_stage_subs(), 1)
    rep = TopicPartition(topic, 1)
    deleter, clock = FakeDeleter(), Clock()
    purger = RepartitionPurger(deleter, 30_000, "t", clock)
    committed = {rep: 120, TopicPartition(SOURCE, 1): 300}

    purger.after_commit([first, count], committed)  # the interval has not passed yet
    clock.now += 30
    purger.after_commit([first, count], committed)
    await settled(purger)
    assert deleter.requests == [{rep: 120}]
    assert purger.purged == {rep: 120}

    # Nothing new committed: nothing asked, however long after.
    clock.now += 60
    purger.after_commit([first, count], committed)
    await settled(purger)
    assert len(deleter.requests) == 1
    # A task that is no longer running here is not purged by this thread.
    clock.now += 60
    purger.after_commit([first], {rep: 200})
    await settled(purger)
    assert len(deleter.requests) == 1


async def test_one_request_at_a_time_and_the_interval_counts_from_the_last_purge() -> None:
    _first, count, topic = tasks_of(two_stage_subs(), 0)
    rep = TopicPartition(topic, 0)
    deleter, clock = FakeDeleter(), Clock()
    deleter.hold = asyncio.Event()
    purger = RepartitionPurger(deleter, 0, "t", clock)
    purger.after_commit([count], {rep: 10})
    await asyncio.sleep(0)
    purger.after_commit([count], {rep: 20})  # the first is still unanswered
    assert deleter.requests == [{rep: 10}]
    deleter.hold.set()
    await settled(purger)
    purger.after_commit([count], {rep: 20})
    await settled(purger)
    assert deleter.requests == [{rep: 10}, {rep: 20}]


async def test_a_failed_deletion_is_a_warning_and_asked_again_at_the_next_purge(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _first, count, topic = tasks_of(two_stage_subs(), 3)
    rep = TopicPartition(topic, 3)
    deleter, clock = FakeDeleter(), Clock()
    purger = RepartitionPurger(deleter, 1_000, "thread-0", clock)
    deleter.raises = ConnectionError("connection closed")
    clock.now += 2
    with caplog.at_level(logging.WARNING):
        purger.after_commit([count], {rep: 50})
        await settled(purger)
    assert "deleting committed records of repartition topics failed" in caplog.text
    assert purger.purged == {} and purger.failures == 1

    deleter.raises = None
    deleter.answers = {rep: RuntimeError("OFFSET_OUT_OF_RANGE")}
    clock.now += 2
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        purger.after_commit([count], {rep: 50})
        await settled(purger)
    assert f"{topic}[3] (RuntimeError: OFFSET_OUT_OF_RANGE)" in caplog.text
    assert purger.purged == {}

    deleter.answers = {}
    clock.now += 2
    purger.after_commit([count], {rep: 50})
    await settled(purger)
    assert purger.purged == {rep: 50}
    assert deleter.requests == [{rep: 50}] * 3


async def test_closing_cancels_a_request_under_way() -> None:
    _first, count, topic = tasks_of(two_stage_subs(), 0)
    deleter = FakeDeleter()
    deleter.hold = asyncio.Event()
    purger = RepartitionPurger(deleter, 0, "t", Clock())
    purger.after_commit([count], {TopicPartition(topic, 0): 5})
    await asyncio.sleep(0)
    assert purger.in_flight
    await purger.close()
    assert not purger.in_flight and purger.purged == {}
    assert deleter.closed


def thread_with(tmp_path: Path, subs: list[SubTopology], hooks: RoundHooks,
                **settings: object) -> object:
    producer = FakeProducer()
    clients = ThreadClients(FakeConsumer(), producer, FakeChangelogReader(),
                            FakeChangelogReader(), data_producer=producer,
                            record_deleter=FakeDeleter())
    thread = build_stream_thread(config(tmp_path, **settings), 0, subs, clients=clients,
                                 instance_id="unit-instance", control=FakeControl(),
                                 hooks=hooks)
    return thread.committer.purger


def test_a_thread_purges_where_the_topology_repartitions_and_the_broker_deletes(
    tmp_path: Path,
) -> None:
    purger = thread_with(tmp_path, two_stage_subs(), RoundHooks(),
                         repartition_purge_interval_ms=500)
    assert isinstance(purger, RepartitionPurger)
    assert purger.interval_ms == 500
    assert thread_with(tmp_path, counting_subs(), RoundHooks()) is None
    no_delete = hooks_for(BrokerQuirks(frozenset({Quirk.NO_DELETE_RECORDS})))
    assert thread_with(tmp_path, two_stage_subs(), no_delete) is None
    # Exactly-once commits purge as well.
    assert isinstance(thread_with(tmp_path, two_stage_subs(), RoundHooks(),
                                  processing_guarantee="exactly_once"), RepartitionPurger)
