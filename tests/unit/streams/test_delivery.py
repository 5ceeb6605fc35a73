"""The at-least-once data producer's bookkeeping (streams.runtime.delivery through the record
collector), with a fake confluent-kafka producer: changelog positions come from the
acknowledged offsets, a refused record fails every later commit, and changelog records not
handed over when a full queue's wait is cancelled stay queued."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statestore.serdes import TimestampedSerde
from statestore.store import INPUT_POSITION_KEY, KeyValueStore, StoreSpec
from streams.runtime.delivery import DeliveryError
from streams.runtime.record_collector import RecordCollector
from streams.runtime.task import StreamTask
from tests.conftest import wait_until
from tests.unit.streams.fakes import SINK, FakeProducer, counting_subs, record

pytestmark = pytest.mark.asyncio

CHANGELOG = "unit-counts-changelog"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[KeyValueStore]:
    # The count's store, as the topology declares it.
    spec = StoreSpec("counts", value_serde=TimestampedSerde())
    store = KeyValueStore(spec, tmp_path / "counts", CHANGELOG, 2).open()
    yield store
    store.close()


def task_with(store: KeyValueStore) -> StreamTask:
    return StreamTask("0_2", counting_subs()[0], {"counts": store})


async def test_a_store_moves_to_the_offset_after_its_last_acknowledged_record(
    store: KeyValueStore,
) -> None:
    producer = FakeProducer(auto_ack=False)
    collector = RecordCollector(producer, "dead-letters")
    store.put("a", 1)
    store.put("b", 2)
    await collector.ship([task_with(store)])
    assert [(s.topic, s.partition) for s in producer.sent] == [(CHANGELOG, 2)] * 2
    waiting = asyncio.create_task(collector.wait_acknowledged())
    await wait_until(lambda: len(producer) == 2, timeout_s=5, message="two in flight")
    assert not waiting.done() and store.unacknowledged == 2
    producer.ack()
    await asyncio.wait_for(waiting, 5)
    assert store.unacknowledged == 0
    store.commit()
    assert store.position == 2
    # The next acknowledgements count from where the changelog is.
    store.put("a", 3)
    await collector.ship([task_with(store)])
    producer.ack()
    await collector.wait_acknowledged()
    store.commit()
    assert store.position == 3


async def test_a_refused_record_fails_this_commit_and_every_later_one(
    store: KeyValueStore,
) -> None:
    producer = FakeProducer()
    producer.refusing[CHANGELOG] = RuntimeError("the broker refused it")
    collector = RecordCollector(producer, "dead-letters")
    store.put("a", 1)
    await collector.ship([task_with(store)])
    with pytest.raises(DeliveryError, match="refused"):
        await collector.wait_acknowledged()
    producer.refusing.clear()
    with pytest.raises(DeliveryError, match="refused"):
        await collector.wait_acknowledged()
    # Never acknowledged: the store refuses to commit past the changelog.
    assert store.unacknowledged == 1


class _FullProducer(FakeProducer):
    """Takes ``room`` records, then its queue stays full."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def produce(self, topic: str, **kwargs: Any) -> None:
        if len(self.sent) >= self.room:
            raise BufferError("Local: Queue full")
        super().produce(topic, **kwargs)


async def test_changelog_records_not_handed_over_stay_queued_when_shipping_is_cancelled(
    store: KeyValueStore,
) -> None:
    producer = _FullProducer(room=1)
    collector = RecordCollector(producer, "dead-letters")
    store.put("a", 1)
    store.put("b", 2)
    shipping = asyncio.create_task(collector.ship([task_with(store)]))
    await wait_until(lambda: len(producer.sent) == 1, timeout_s=5, message="one handed over")
    shipping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await shipping
    # "a" is in flight, "b" is queued again.
    assert store.unacknowledged == 2
    assert store.drain_changelog() == [(store.spec.key_serde.dumps("b"),
                                        store.spec.value_serde.dumps(2))]
    store.requeue_changelog([(store.spec.key_serde.dumps("b"), store.spec.value_serde.dumps(2))])
    producer.room = 10
    await collector.ship([])
    await collector.send_changelogs([task_with(store)])
    await collector.wait_acknowledged()
    assert store.unacknowledged == 0
    assert len(producer.to(CHANGELOG)) == 2


def counted(store: KeyValueStore, keys: list[str], buffer_bytes: int,
            ) -> tuple[FakeProducer, RecordCollector, StreamTask]:
    """A collector with a changelog buffer of ``buffer_bytes``, and the counting task after
    one input record per key."""
    producer = FakeProducer()
    collector = RecordCollector(producer, "dead-letters", changelog_buffer_bytes=buffer_bytes)
    task = task_with(store)
    task.process_batch([record(2, i, key) for i, key in enumerate(keys)])
    return producer, collector, task


async def test_changelog_records_wait_for_the_commit_and_go_as_one_per_key(
    store: KeyValueStore,
) -> None:
    producer, collector, task = counted(store, ["a", "b"] * 500, buffer_bytes=20_000)
    await collector.ship_outputs([task])
    # Every output goes after its batch; the changelog waits, under the buffer's bound.
    assert len(producer.to(SINK)) == 1_000 and producer.to(CHANGELOG) == []
    await collector.ship([task])  # what the commit does
    await collector.wait_acknowledged()
    keys = [s.key for s in producer.to(CHANGELOG)]
    assert keys == [store.spec.key_serde.dumps("a"), store.spec.key_serde.dumps("b"),
                    INPUT_POSITION_KEY]
    assert store.spec.value_serde.loads(producer.to(CHANGELOG)[0].value) == 500
    assert store.unacknowledged == 0


async def test_changelog_records_go_before_the_commit_once_they_outgrow_the_buffer(
    store: KeyValueStore,
) -> None:
    producer, collector, task = counted(store, [f"k{i}" for i in range(20)], buffer_bytes=100)
    await collector.ship_outputs([task])
    sent = producer.to(CHANGELOG)
    assert len(sent) == 21 and sent[-1].key == INPUT_POSITION_KEY
    assert store.changelog_bytes == 0
