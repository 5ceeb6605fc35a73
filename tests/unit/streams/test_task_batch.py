"""A task runs a batch of records as it runs each one: a bad record stops the batch at its
index (counted as processed, dead-lettered by the caller), records at or below the processed
position are dropped, and a machine error leaves its record unprocessed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
from aiokafka.structs import ConsumerRecord, TopicPartition

from statestore.errors import StoreWriteError
from statestore.serdes import TimestampedSerde
from statestore.store import KeyValueStore, StoreSpec
from streams.runtime.task import RecordError, StreamTask
from tests.unit.streams.fakes import SOURCE, counting_subs, record


@pytest.fixture
def task(tmp_path: Path) -> Iterator[StreamTask]:
    spec = StoreSpec("counts", value_serde=TimestampedSerde())  # as the topology declares it
    store = KeyValueStore(spec, tmp_path / "counts", "unit-counts-changelog", 0).open()
    yield StreamTask("0_0", counting_subs()[0], {"counts": store})
    store.close()


def bad_value(offset: int) -> ConsumerRecord:
    key = msgpack.packb("a")
    return ConsumerRecord(SOURCE, 0, offset, 1_000, 0, key, b"\xc1", None, len(key), 1, [])


def test_a_bad_record_stops_the_batch_at_its_index(task: StreamTask) -> None:
    tp = TopicPartition(SOURCE, 0)
    batch = [record(0, 0, "a", timestamp=5), bad_value(1), record(0, 2, "a", timestamp=7)]
    with pytest.raises(RecordError) as bad:
        task.process_batch(batch)
    assert bad.value.index == 1 and bad.value.stage == "deserialize"
    assert task.processed[tp] == 2 and task.records_processed == 1
    assert task.process_batch(batch[bad.value.index + 1:]) == 1
    assert task.processed[tp] == 3 and task.records_processed == 2
    assert task.stream_time_ms == 7
    assert [msgpack.unpackb(o.value) for o in task.take_outputs()] == [1, 2]
    # Fetched again (a partition sought back): all dropped.
    assert task.process_batch(batch) == 0
    assert task.records_skipped == 3 and task.records_processed == 2


def test_a_machine_error_leaves_its_record_unprocessed(task: StreamTask) -> None:
    tp = TopicPartition(SOURCE, 0)
    store = task.stores["counts"]

    def failing_put(key: object, value: object, timestamp: int) -> None:
        raise StoreWriteError("no space left")

    assert task.process_batch([record(0, 0, "a")]) == 1
    store.put_timestamped = failing_put  # type: ignore[method-assign]
    with pytest.raises(StoreWriteError):
        task.process_batch([record(0, 1, "a"), record(0, 2, "a")])
    assert task.processed[tp] == 1 and task.records_processed == 1
