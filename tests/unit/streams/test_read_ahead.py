"""A restoring task's input read ahead: fetched from its committed offsets while its state is
restored, held back from the thread, handed out the moment the task starts. A task taken over
from a standby restores in a moment and then waited a fetch or more (0.2 to 0.7 s in the static
soaks) for its first records."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import TopicPartition

from streams.kafka.driver import STARTING_BATCH, STARTING_WINDOW_S, GroupConsumer
from streams.runtime.task import StreamTask
from tests.unit.streams.fakes import SOURCE, assign, rig

from .test_stream_thread import closing


class _Record:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class _SelectiveConsumer:
    """aiokafka's getmany as the driver uses it: records of the partitions asked for (all when
    none are), or a wait until more are fetched."""

    def __init__(self, buffered: dict[TopicPartition, list[Any]]) -> None:
        self.buffered = buffered
        self.asked: list[tuple[TopicPartition, ...]] = []
        self.sought: dict[TopicPartition, int] = {}
        self.fetched = asyncio.Event()

    def assignment(self) -> set[TopicPartition]:
        return set(self.buffered)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.sought[tp] = offset

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int,
                      max_records: int) -> dict[TopicPartition, list[Any]]:
        self.asked.append(partitions)
        while True:
            out = {tp: records for tp, records in self.buffered.items()
                   if records and (not partitions or tp in partitions)}
            if out:
                for tp in out:
                    self.buffered[tp] = []
                return out
            self.fetched.clear()
            await self.fetched.wait()


async def test_held_partitions_are_fetched_but_not_handed_out_until_released() -> None:
    running, restoring = TopicPartition("t", 0), TopicPartition("t", 1)
    fake = _SelectiveConsumer({running: [1, 2], restoring: [7, 8]})
    consumer = GroupConsumer(fake)  # type: ignore[arg-type]
    consumer.hold(restoring)
    assert await consumer.getmany(timeout_ms=100, max_records=10) == {running: [1, 2]}
    assert fake.asked == [(running,)]
    # Waiting for the running partitions' next fetch, the thread is woken by the release.
    waiting = asyncio.ensure_future(consumer.getmany(timeout_ms=60_000, max_records=10))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiting.done()
    consumer.release(restoring)
    assert await asyncio.wait_for(waiting, 5) == {}
    assert await consumer.getmany(timeout_ms=100, max_records=10) == {restoring: [7, 8]}
    assert fake.asked[-1] == ()  # nothing held: every partition


async def test_records_of_a_partition_held_while_the_call_waited_go_back() -> None:
    # The thread waits in getmany when a restoring task's committed offsets arrive and its
    # input starts being read ahead: what that call then returns of it must not reach the
    # thread (its task is not running: the records were dropped, never counted).
    running, restoring = TopicPartition("t", 0), TopicPartition("t", 1)
    fake = _SelectiveConsumer({running: [], restoring: []})
    consumer = GroupConsumer(fake)  # type: ignore[arg-type]
    waiting = asyncio.ensure_future(consumer.getmany(timeout_ms=60_000, max_records=10))
    await asyncio.sleep(0)
    consumer.hold(restoring)
    fake.buffered[running] = [_Record(3)]
    fake.buffered[restoring] = [_Record(20), _Record(21)]
    fake.fetched.set()
    assert list(await asyncio.wait_for(waiting, 5)) == [running]
    assert fake.sought == {restoring: 20}


async def test_a_restoring_task_reads_its_input_ahead_and_starts_without_a_second_seek(
    tmp_path: Path,
) -> None:
    r = rig(tmp_path)
    tp = TopicPartition(SOURCE, 0)
    r.consumer.committed_offsets[tp] = 5
    seeks: list[tuple[TopicPartition, int]] = []
    seek = r.consumer.seek

    def counting_seek(partition: TopicPartition, offset: int) -> None:
        seeks.append((partition, offset))
        seek(partition, offset)

    r.consumer.seek = counting_seek  # type: ignore[method-assign]
    async with closing(r):
        await assign(r, ("0_0",), restore=False)
        for _ in range(3):  # the committed offsets' answer
            await asyncio.sleep(0)
        # Fetched from where it will start, not handed out, while its state is restored.
        assert r.consumer.held == {tp} and tp not in r.consumer.paused
        assert seeks == [(tp, 5)]
        await asyncio.wait_for(r.thread.state_updater.restore_pending(), 5)
        assert r.thread.tasks["0_0"].processed == {tp: 5}
        # A seek to the same offset would have dropped the records read ahead.
        assert seeks == [(tp, 5)]
        assert not r.consumer.held and tp not in r.consumer.paused


async def test_a_task_revoked_while_read_ahead_leaves_nothing_held(tmp_path: Path) -> None:
    r = rig(tmp_path)
    tp = TopicPartition(SOURCE, 0)
    r.consumer.committed_offsets[tp] = 5
    async with closing(r):
        await assign(r, ("0_0",), restore=False)
        for _ in range(3):
            await asyncio.sleep(0)
        assert r.consumer.held == {tp}
        await assign(r, (), restore=False)
        assert not r.consumer.held


async def test_a_later_start_than_the_committed_offset_seeks_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The restored state may reflect input past the committed offset (its owner died after
    # writing its changelog, before committing): the records read ahead from the committed
    # offset would be processed twice, so the task seeks past them.
    r = rig(tmp_path)
    tp = TopicPartition(SOURCE, 0)
    r.consumer.committed_offsets[tp] = 5
    monkeypatch.setattr(StreamTask, "restored_input_position", lambda self: {tp: 9})
    async with closing(r):
        await assign(r, ("0_0",), restore=False)
        for _ in range(3):
            await asyncio.sleep(0)
        assert r.consumer.seeks[tp] == 5 and r.consumer.held == {tp}
        await asyncio.wait_for(r.thread.state_updater.restore_pending(), 5)
        assert r.consumer.seeks[tp] == 9
        assert r.thread.tasks["0_0"].processed == {tp: 9}
        assert not r.consumer.held


class _BatchingConsumer:
    """aiokafka's getmany with ``max_records``: one partition's buffered records, at most
    that many."""

    def __init__(self, records: list[int]) -> None:
        self.records = records

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("t", 0)}

    def resume(self, *tps: TopicPartition) -> None:
        pass

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int,
                      max_records: int) -> dict[TopicPartition, list[int]]:
        taken, self.records = self.records[:max_records], self.records[max_records:]
        return {TopicPartition("t", 0): taken}


async def test_while_a_task_starts_the_thread_takes_small_batches() -> None:
    # A full batch of a heavy app took 0.25 s to process: a task started meanwhile waited
    # behind it for its first records, and behind one more per task moved with it.
    now = [0.0]
    consumer = GroupConsumer(_BatchingConsumer(list(range(10_000))),  # type: ignore[arg-type]
                             clock=lambda: now[0])
    moved = TopicPartition("t", 1)

    async def batch() -> int:
        return sum(len(r) for r in (await consumer.getmany(timeout_ms=0,
                                                           max_records=2000)).values())

    assert await batch() == 2000
    consumer.hold(moved)  # its input read ahead while it restores
    assert await batch() == STARTING_BATCH
    consumer.release(moved)
    consumer.resume(moved)
    assert await batch() == STARTING_BATCH
    now[0] += STARTING_WINDOW_S
    assert await batch() == 2000
