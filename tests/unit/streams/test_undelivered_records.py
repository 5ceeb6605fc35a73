"""At-least-once records that were not delivered (librdkafka's ``message.timeout.ms`` ran out:
a broker failover longer than it, or a zombie's queue expired after a long stop), with fake
clients: the data producer's timeout comes from the session, such a record is not fatal, and
its task is revived in place from its last commit, its input processed again (duplicates
allowed, nothing lost), while a refused record stays fatal."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
from aiokafka.structs import TopicPartition
from confluent_kafka import KafkaError

from streams.runtime.delivery import (
    DeliveryError,
    flush_timeout_s,
    message_timeout_ms,
)
from streams.runtime.delivery_errors import (
    DeliveryVerdict,
    described,
    judge,
    not_delivered,
    producer_lost,
)
from tests.unit.streams.fakes import (
    SINK,
    SOURCE,
    Committed,
    FakeProducer,
    Rig,
    assign,
    record,
    rig,
)

CHANGELOG = "unit-counts-changelog"
TP0 = TopicPartition(SOURCE, 0)


def timed_out() -> KafkaError:
    return KafkaError(KafkaError._MSG_TIMED_OUT)


def test_the_timeout_is_the_session_less_a_heartbeat_with_a_floor() -> None:
    # The broker expires a stopped member no sooner than session - heartbeat after the stop.
    assert message_timeout_ms(10_000, 1_000) == 9_000
    assert message_timeout_ms(45_000, 3_000) == 42_000
    assert message_timeout_ms(1_200, 1_000) == 1_000
    # A commit waits for every report: past the records' own timeout.
    assert flush_timeout_s(42_000) > 42
    assert flush_timeout_s(9_000) >= 9


def test_a_timed_out_or_purged_record_is_not_delivered_and_a_refusal_is_not() -> None:
    for code in (KafkaError._MSG_TIMED_OUT, KafkaError._PURGE_QUEUE,
                 KafkaError._PURGE_INFLIGHT, KafkaError.REQUEST_TIMED_OUT):
        assert not_delivered(KafkaError(code))
    for code in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.TOPIC_AUTHORIZATION_FAILED,
                 KafkaError._FATAL):
        assert not not_delivered(KafkaError(code))
    assert not not_delivered(RuntimeError("not a Kafka error"))


def test_the_verdict_revives_running_tasks_and_stops_at_a_refusal() -> None:
    assert judge([], ["0_0"]) == DeliveryVerdict(frozenset())
    # A task no longer run (lost: a zombie's queue that expired) needs no revival.
    assert judge([("0_0", timed_out()), ("0_1", timed_out()), ("0_0", timed_out())],
                 ["0_0", "0_2"]) == DeliveryVerdict(frozenset({"0_0"}))
    refused = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    verdict = judge([("0_0", timed_out()), ("0_1", refused)], ["0_0", "0_1"])
    assert verdict.refusal is refused


@dataclass
class _Delivered:
    """What the changelog holds for a restoration to read: the records the fake producer
    delivered, at their offsets (the fake restorer's view of a committed log)."""

    records: list[Committed]


def delivered_changelog(r: Rig) -> _Delivered:
    return _Delivered([Committed(s.topic, s.partition, s.key, s.value, offset)
                       for offset, s in enumerate(r.producer.to(CHANGELOG))])


def counts_out(r: Rig) -> list[tuple[str, int]]:
    return [(msgpack.unpackb(s.key), msgpack.unpackb(s.value)) for s in r.producer.to(SINK)]


async def process(r: Rig, *records: Any) -> None:
    await r.thread.process({TP0: list(records)})
    await r.thread.collector.ship_outputs(r.thread.registry.active.values())


def last_counts(r: Rig) -> dict[str, int]:
    last: dict[str, int] = {}
    for key, count in counts_out(r):
        last[key] = count
    return last


async def test_a_task_whose_outputs_timed_out_runs_again_from_its_last_commit_in_place(
    tmp_path: Path,
) -> None:
    records = [record(0, i, k) for i, k in enumerate("abab")]
    r = rig(tmp_path)
    try:
        await assign(r, ("0_0",))
        await process(r, records[0])
        await r.thread.committer.commit()
        assert r.consumer.committed_offsets == {TP0: 1}
        # A broker failover longer than the records' timeout: the outputs of the next two
        # records expire; their changelog records get through.
        r.producer.refusing[SINK] = timed_out()
        await process(r, *records[1:3])
        rejoins, requests = r.consumer.rejoins, list(r.control.rebalance_requests)
        r.consumer.seeks.clear()
        await r.thread.committer.commit()
        r.producer.refusing.clear()
        # Not fatal, not committed, not the group's business: rolled back in place, its
        # input sought back to its last commit, its store at that commit.
        assert r.consumer.committed_offsets == {TP0: 1}
        assert r.consumer.rejoins == rejoins and r.control.rebalance_requests == requests
        task = r.thread.tasks["0_0"]
        assert r.consumer.seeks[TP0] == 1 and task.processed[TP0] == 1
        store = task.stores["counts"]
        assert store.get("a") == 1 and store.get("b") is None
        await process(r, *records[1:])
        await r.thread.committer.commit()
        assert r.consumer.committed_offsets == {TP0: 4}
        # The lost outputs come again, and the state counted each record once.
        assert last_counts(r) == {"a": 2, "b": 2}
        assert store.get("a") == 2 and store.get("b") == 2
    finally:
        r.thread.task_manager.close_all()


async def test_a_task_with_no_commit_yet_is_revived_and_reads_its_input_again(
    tmp_path: Path,
) -> None:
    records = [record(0, i, k) for i, k in enumerate("ab")]
    r = rig(tmp_path)
    try:
        await assign(r, ("0_0",))
        r.producer.refusing[SINK] = timed_out()
        await process(r, *records)
        await r.thread.committer.commit()
        r.producer.refusing.clear()
        # Nothing tells where its last commit left it in place: revived, it restores.
        assert r.consumer.committed_offsets == {}
        assert "0_0" in r.thread.registry.restoring and TP0 in r.consumer.paused
        # Its changelog holds the records that got through, and the position past them.
        r.restorer.transactions = delivered_changelog(r)  # type: ignore[assignment]
        r.consumer.seeks.clear()
        await r.thread.state_updater.restore_pending()
        task = r.thread.tasks["0_0"]
        # Its input is read again from the start, whatever its restored state says (its
        # outputs were lost): duplicates, not losses.
        assert r.consumer.seeks[TP0] == 0 and TP0 not in task.processed
        await process(r, *records)
        await r.thread.committer.commit()
        assert r.consumer.committed_offsets == {TP0: 2}
        assert last_counts(r)["a"] >= 1 and last_counts(r)["b"] >= 1
    finally:
        r.thread.task_manager.close_all()


async def test_a_task_whose_changelog_timed_out_runs_again_and_the_others_commit(
    tmp_path: Path,
) -> None:
    tp1 = TopicPartition(SOURCE, 1)
    r = rig(tmp_path)
    try:
        await assign(r, ("0_0", "0_1"))
        await r.thread.process({TP0: [record(0, 0, "a")], tp1: [record(1, 0, "b")]})
        await r.thread.committer.commit()
        await r.thread.process({TP0: [record(0, 1, "a")], tp1: [record(1, 1, "b")]})
        # The changelog record of 0_0's store times out; 0_1's gets through.
        produce = r.producer.produce

        def expiring(topic: str, **kwargs: Any) -> None:
            if topic == CHANGELOG and kwargs.get("partition") == 0:
                kwargs["on_delivery"](timed_out(), None)
                return
            produce(topic, **kwargs)
        r.producer.produce = expiring  # type: ignore[method-assign]
        r.consumer.seeks.clear()
        await r.thread.committer.commit()
        r.producer.produce = produce  # type: ignore[method-assign]
        assert r.consumer.committed_offsets == {TP0: 1, tp1: 2}
        assert sorted(r.thread.registry.active) == ["0_0", "0_1"]
        assert r.consumer.seeks == {TP0: 1}
        # The next commit is not failed by the old report, and the count is exact.
        await r.thread.process({TP0: [record(0, 1, "a")]})
        await r.thread.committer.commit()
        assert r.consumer.committed_offsets == {TP0: 2, tp1: 2}
        assert r.thread.tasks["0_0"].stores["counts"].get("a") == 2
    finally:
        r.thread.task_manager.close_all()


@pytest.mark.parametrize(("error", "message"), [
    (KafkaError.MSG_SIZE_TOO_LARGE, "refused"),
    # A fenced producer, with nothing given to replace it.
    (KafkaError.PRODUCER_FENCED, "can send nothing more"),
])
async def test_a_refused_record_or_a_lost_producer_with_nothing_to_replace_it_stays_fatal(
    tmp_path: Path, error: int, message: str,
) -> None:
    r = rig(tmp_path)
    try:
        await assign(r, ("0_0",))
        r.producer.refusing[SINK] = KafkaError(error)
        await process(r, record(0, 0, "a"))
        with pytest.raises(DeliveryError, match=message):
            await r.thread.committer.commit()
        assert r.consumer.committed_offsets == {}
        assert "0_0" in r.thread.registry.active
    finally:
        r.thread.task_manager.close_all()


async def test_records_of_tasks_lost_with_the_membership_are_dropped_from_the_queue(
    tmp_path: Path,
) -> None:
    tp1 = TopicPartition(SOURCE, 1)
    r = rig(tmp_path)
    try:
        await assign(r, ("0_0",))
        r.producer.auto_ack = False
        await process(r, record(0, 0, "a"))
        assert len(r.producer.to(SINK)) == 1  # its output handed, not acknowledged
        # The broker ended the membership: the task stops uncommitted, and what it queued is
        # not sent after its new owner's records.
        await r.thread.listener.on_partitions_lost(r.consumer.assigned)
        assert "0_0" not in r.thread.tasks and r.producer.purged >= 1
        r.producer.auto_ack = True
        # The purge's report revives nothing and fails nothing.
        await assign(r, ("0_1",))
        await r.thread.process({tp1: [record(1, 0, "b")]})
        await r.thread.committer.commit()
        assert r.consumer.committed_offsets == {tp1: 1}
        assert sorted(r.thread.registry.active) == ["0_1"] and not r.thread.registry.restoring
    finally:
        r.thread.task_manager.close_all()


def test_a_fenced_or_fatal_producer_is_lost_not_refused() -> None:
    for code in (KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
                 KafkaError.UNKNOWN_PRODUCER_ID, KafkaError._FATAL):
        assert producer_lost(KafkaError(code))
    assert not producer_lost(timed_out())
    assert not producer_lost(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    fenced = KafkaError(KafkaError.PRODUCER_FENCED)
    assert judge([("0_0", fenced), ("0_1", timed_out())], ["0_0", "0_1"]) == DeliveryVerdict(
        frozenset({"0_0", "0_1"}), producer_lost=True)
    # An at-least-once app uses no transactions: the log says what befell its producer.
    assert described(fenced).startswith("the broker no longer takes this thread's idempotent")
    assert described(timed_out()) == str(timed_out())


async def test_a_task_whose_producer_was_fenced_runs_again_with_a_new_producer(
    tmp_path: Path,
) -> None:
    """A worker resumed from a SIGSTOP past its session on the embedded broker had its
    idempotent data producer fenced (PRODUCER_FENCED) and its thread failed, the process
    exiting. The thread now replaces its producer and runs the task again from its last
    commit."""
    records = [record(0, i, k) for i, k in enumerate("abab")]
    r = rig(tmp_path)
    replacement = FakeProducer()
    deliveries = r.thread.collector.deliveries
    deliveries.new_producer = lambda: replacement
    try:
        await assign(r, ("0_0",))
        await process(r, records[0])
        await r.thread.committer.commit()
        r.producer.refusing[SINK] = KafkaError(KafkaError.PRODUCER_FENCED)
        await process(r, *records[1:3])
        await r.thread.committer.commit()  # not fatal
        assert deliveries.replaced == 1 and r.thread.collector.producer is replacement
        assert r.consumer.committed_offsets == {TP0: 1}
        assert r.thread.tasks["0_0"].processed[TP0] == 1  # rolled back to its last commit
        await process(r, *records[1:])
        await r.thread.committer.commit()
        assert r.consumer.committed_offsets == {TP0: 4}
        assert [msgpack.unpackb(s.value) for s in replacement.to(SINK)] == [1, 2, 2]
    finally:
        r.thread.task_manager.close_all()
