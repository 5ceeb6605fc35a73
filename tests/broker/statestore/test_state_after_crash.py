"""A store is never ahead of its changelog: a counting app killed during its backlog, or
stopped at a bad record, and restarted on the same state directory counts every record
exactly once. Real broker; the killed app runs as a worker process of its own."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from streams.runtime.thread import FatalThreadError
from tests.broker.streams.harness import (
    Traffic,
    counting_topics,
    create_topics,
    end_worker,
    exact_counts,
    make_app,
    produce,
    running,
    spawn_worker,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


@contextlib.asynccontextmanager
async def sink_counter(bootstrap: str, sink: str) -> AsyncIterator[Callable[[], int]]:
    """How many records the (one-partition) sink holds, counted by a tailing consumer."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    tp = TopicPartition(sink, 0)
    consumer.assign([tp])
    seen = 0

    async def tail() -> None:
        nonlocal seen
        while True:
            batch = await consumer.getmany(tp, timeout_ms=200)
            seen += len(batch.get(tp, []))

    tailing = asyncio.create_task(tail())
    try:
        yield lambda: seen
    finally:
        tailing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tailing
        await consumer.stop()


async def test_a_counting_app_killed_during_its_backlog_counts_each_record_once(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    app_id = unique("sigkill")
    source, sink, _ = await counting_topics(bootstrap, app_id)
    traffic = Traffic(bootstrap, source, keys=5000)
    await traffic.produce(20_000)
    state_dir = tmp_path / "state"
    worker = spawn_worker(app_id, bootstrap, state_dir, source, sink)
    try:
        async with sink_counter(bootstrap, sink) as outputs:
            for _ in range(3):
                # Killed while it works through a backlog: some batches processed and not
                # committed, some changelog records sent and not acknowledged.
                before = outputs()
                await wait_until(lambda before=before: outputs() >= before + 4000,
                                 timeout_s=120, message="the worker to process a backlog")
                worker.send_signal(signal.SIGKILL)
                worker.wait()
                await traffic.produce(8_000)
                worker = spawn_worker(app_id, bootstrap, state_dir, source, sink)
        await exact_counts(bootstrap, sink, traffic.produced)
    finally:
        end_worker(worker)


def _fail_on_bad(value: object) -> object:
    if value == "bad":
        raise ValueError("a bad record")
    return value


async def committed_offset(bootstrap: str, group: str, tp: TopicPartition) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        return await consumer.committed(tp)
    finally:
        await consumer.stop()


async def test_an_app_stopped_at_a_bad_record_and_restarted_counts_each_record_once(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    app_id = unique("stopcount")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 1, sink: 1})
    committed_part = [(f"k{i % 100}", i) for i in range(3000)]
    before_bad = [(f"k{i % 100}", i) for i in range(3000, 4000)]
    after_bad = [(f"k{i % 100}", i) for i in range(4000, 5000)]
    expected: dict[str, int] = {}
    for key, _ in committed_part + before_bad + after_bad:
        expected[key] = expected.get(key, 0) + 1

    stopping = make_app(app_id, bootstrap, tmp_path, on_error="stop")
    (stopping.stream(source).map_values(_fail_on_bad).group_by_key()
     .count(store="counts").to_stream().to(sink))
    await produce(bootstrap, source, committed_part)
    run = asyncio.create_task(stopping.run_async())
    try:
        # A commit first (offsets and the store's checkpoint), then a batch that holds good
        # records and, after them, the bad one.
        await wait_until(
            lambda: committed_offset(bootstrap, app_id, TopicPartition(source, 0)),
            timeout_s=90, message="the first commit",
        )
        await produce(bootstrap, source, [*before_bad, ("k7", "bad"), *after_bad])
        with pytest.raises(FatalThreadError, match="a bad record"):
            await asyncio.wait_for(run, 120)
    finally:
        stopping.stop()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(run, 60)

    # The fixed app restarts on the same state directory and resumes at the bad record.
    fixed = make_app(app_id, bootstrap, tmp_path)
    (fixed.stream(source).filter(lambda _key, value: value != "bad").group_by_key()
     .count(store="counts").to_stream().to(sink))
    async with running(fixed):
        await exact_counts(bootstrap, sink, expected)
