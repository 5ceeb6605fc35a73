"""Exactly-once processing with fake clients (no broker): a new active fences its previous
owner before its state is read; a task's outputs, changelog records and input offsets commit
in one transaction, after which (and only after which) its store applies its write buffer;
a fenced transaction discards the buffer and the task reopens from its committed state."""

from __future__ import annotations

import contextlib
from pathlib import Path

import msgpack
import pytest
from aiokafka.structs import TopicPartition

from statestore.checkpoint import read_checkpoint
from statestore.store import INPUT_POSITION_KEY
from streams.config import AppConfig, ConfigError
from streams.runtime.transactions import TransactionalCollector, TransactionalCommitter
from tests.unit.streams.fakes import SINK, SOURCE, Rig, TransactionLog, assign, record, rig

CHANGELOG = "unit-counts-changelog"
TP0 = TopicPartition(SOURCE, 0)


@contextlib.asynccontextmanager
async def eos_rig(tmp_path: Path, **settings: object):
    r = rig(tmp_path, processing_guarantee="exactly_once", **settings)
    try:
        yield r
    finally:
        r.thread.task_manager.close_all()
        await r.thread.collector.close()


def log_of(r: Rig) -> TransactionLog:
    assert r.transactions is not None
    return r.transactions


async def process(r: Rig, *records: object) -> None:
    await r.thread.process({TP0: list(records)})
    await r.thread.collector.ship(r.thread.registry.active.values())


def test_the_guarantee_is_a_setting_at_least_once_by_default() -> None:
    assert AppConfig("app").processing_guarantee == "at_least_once"
    assert AppConfig("app", processing_guarantee="exactly_once").exactly_once
    with pytest.raises(ConfigError, match="processing_guarantee must be"):
        AppConfig("app", processing_guarantee="exactly-once")
    assert AppConfig.from_env({"RELAY_PROCESSING_GUARANTEE": "exactly_once"},
                              application_id="a").exactly_once


async def test_the_exactly_once_thread_commits_through_transactions(tmp_path: Path) -> None:
    async with eos_rig(tmp_path) as r:
        assert isinstance(r.thread.collector, TransactionalCollector)
        assert isinstance(r.thread.committer, TransactionalCommitter)


async def test_a_new_active_fences_its_previous_owner_before_its_state_is_restored(
    tmp_path: Path,
) -> None:
    events: list[str] = []
    async with eos_rig(tmp_path, events=events) as r:
        await assign(r, ("0_0", "0_1"))
        order = [e for e in events if e.startswith(("init", "restore"))]
        # The two tasks are restored together; each is fenced before its changelog is read.
        assert sorted(order) == ["init unit-0_0", "init unit-0_1", "restore counts/0",
                                 "restore counts/1"]
        assert order.index("init unit-0_0") < order.index("restore counts/0")
        assert order.index("init unit-0_1") < order.index("restore counts/1")


async def test_outputs_changelog_and_offsets_commit_together_then_the_store_applies_them(
    tmp_path: Path,
) -> None:
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        await assign(r, ("0_0",))
        store = r.thread.tasks["0_0"].stores["counts"]
        await process(r, record(0, 0, "a"), record(0, 1, "b"), record(0, 2, "a"))
        # Read your writes: the open transaction's counts are seen by the task...
        assert store.get("a") == 2 and store.uncommitted > 0
        # ...and by no one else: nothing is committed, the checkpoint has not moved.
        assert log.records == [] and log.offsets == {}
        assert read_checkpoint(store.directory, CHANGELOG, 0) is None
        await r.thread.committer.commit()
        assert [msgpack.unpackb(o.value) for o in log.to(SINK)] == [1, 1, 2]
        changelog = log.to(CHANGELOG)
        assert changelog[-1].key == INPUT_POSITION_KEY  # the input position goes with it
        assert msgpack.unpackb(changelog[-1].value) == {f"{SOURCE}:0": 3, "stream-time": 1000}
        assert log.offsets == {(SOURCE, 0): 3}
        assert r.consumer.commits == []  # offsets go in the transaction, not the group commit
        assert store.uncommitted == 0 and store.get("a") == 2
        checkpoint = read_checkpoint(store.directory, CHANGELOG, 0)
        assert checkpoint is not None and checkpoint.offset == len(changelog)


async def test_a_fenced_transaction_discards_its_writes_and_the_task_reopens_from_its_committed_state(  # noqa: E501
    tmp_path: Path,
) -> None:
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        await assign(r, ("0_0",))
        await process(r, record(0, 0, "a"))
        await r.thread.committer.commit()
        committed_records = list(log.records)
        await process(r, record(0, 1, "a"), record(0, 2, "b"))
        assert r.thread.tasks["0_0"].stores["counts"].get("a") == 2
        # Another owner of 0_0 starts: this member is now a zombie for it.
        log.producer("unit-0_0").init_transactions()
        # The zombie's producer refuses its next records; processing goes on until commit.
        await process(r, record(0, 3, "c"))
        await r.thread.committer.commit()
        assert r.thread.committer.failures == 1
        assert log.records == committed_records and log.offsets == {(SOURCE, 0): 1}
        assert "0_0" not in r.thread.tasks and r.consumer.rejoins >= 1
        # Handed back, the task resumes from the committed state on disk: its store has
        # the committed count only, and the input resumes after the committed record.
        r.consumer.seeks.clear()
        await assign(r, ("0_0",))
        store = r.thread.tasks["0_0"].stores["counts"]
        assert store.has_checkpoint  # no full restore: the checkpoint vouches for the disk
        assert store.get("a") == 1 and store.get("b") is None
        assert r.consumer.seeks[TP0] == 1
        await process(r, record(0, 1, "a"), record(0, 2, "b"))
        await r.thread.committer.commit()
        assert [msgpack.unpackb(o.value) for o in log.to(SINK)] == [1, 2, 1]


async def test_an_aborted_transaction_leaves_the_database_at_the_last_commit(
    tmp_path: Path,
) -> None:
    async with eos_rig(tmp_path) as r:
        await assign(r, ("0_0",))
        task = r.thread.tasks["0_0"]
        store = task.stores["counts"]
        await process(r, record(0, 0, "a"))
        await r.thread.committer.commit()
        await process(r, record(0, 1, "a"))
        producers = r.thread.collector.producers  # type: ignore[union-attr]
        await producers.drop("0_0")  # aborts the open transaction
        assert log_of(r).aborted == 1
        store.abort()
        assert store.get("a") == 1 and store.uncommitted == 0
        assert task.restored_input_position() == {TP0: 1}


class _QueueFullOnce:
    """A transactional producer whose queue is full once, after ``room`` records."""

    def __init__(self, inner: object, room: int) -> None:
        self.inner, self.room, self.full_once = inner, room, True

    def produce(self, *args: object, **kwargs: object) -> None:
        if self.full_once and len(self.inner.pending) >= self.room:  # type: ignore[attr-defined]
            self.full_once = False
            raise BufferError("queue full")
        self.inner.produce(*args, **kwargs)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


async def test_records_handed_to_a_full_queue_wait_for_room_and_keep_their_order() -> None:
    from streams.runtime.transactions import TaskTransaction
    from tests.unit.streams.fakes import FakeTransactionalProducer

    log = TransactionLog()
    inner = FakeTransactionalProducer("app-0_0", log)
    inner.init_transactions()
    records = [(f"k{i}".encode(), f"{i}".encode()) for i in range(5)]

    class Output:
        def __init__(self, key: bytes, value: bytes) -> None:
            self.topic, self.key, self.value, self.timestamp_ms = "out", key, value, 0

    outputs = [Output(k, v) for k, v in records]
    transaction = TaskTransaction("0_0", _QueueFullOnce(inner, room=2))
    handed = transaction.hand(outputs, 0)
    assert handed == 2 and transaction.open
    while handed < len(outputs):
        handed = transaction.hand(outputs, handed)
    inner.commit_transaction()
    assert [(c.key, c.value) for c in log.records] == records
    assert transaction.produced == 5 and not transaction.errors
