"""A partition several producers append to, read at its end as a repartition topic is: the
group consumer hands out every offset, none skipped. Tansu can answer a fetch with a later
batch while an earlier one is not yet readable; the ``skipped-batches`` quirk fetches such a
gap again (a task that took the later batch counted the earlier one never: a count under)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streams.kafka.driver import GroupConsumer
from streams.quirks.detect import broker_quirks
from streams.quirks.hooks import hooks_for
from tests.broker.streams.harness import create_topics

WRITERS = 4
READ_FOR_S = 12.0


async def write_batches(bootstrap: str, topic: str, writer: int, stop: asyncio.Event) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=2, acks="all")
    await producer.start()
    written = 0
    try:
        while not stop.is_set():
            sent = [await producer.send(topic, f"{writer}-{written + n}".encode(), partition=0)
                    for n in range(4)]
            await asyncio.gather(*sent)
            written += 4
    finally:
        await producer.stop()
    return written


@pytest.mark.tansu
async def test_a_partition_appended_by_several_producers_is_read_without_a_gap(
        bootstrap: str, unique: Callable[[str], str]) -> None:
    topic = unique("appended")
    await create_topics(bootstrap, {topic: 1})
    hooks = hooks_for(await broker_quirks("auto", None, bootstrap, embedded=False))
    raw = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                           fetch_max_wait_ms=100)
    consumer = GroupConsumer(raw, refetch_skipped=hooks.refetch_skipped)
    tp = TopicPartition(topic, 0)
    stop = asyncio.Event()
    writers = [asyncio.create_task(write_batches(bootstrap, topic, n, stop))
               for n in range(WRITERS)]
    await raw.start()
    gaps: list[tuple[int, int]] = []
    expected = 0
    try:
        raw.assign([tp])
        await raw.seek_to_beginning(tp)
        started = time.monotonic()
        while time.monotonic() - started < READ_FOR_S:
            for record in (await consumer.getmany(200, 1_000)).get(tp, []):
                if record.offset != expected:
                    gaps.append((expected, record.offset))
                expected = record.offset + 1
    finally:
        stop.set()
        written = sum(await asyncio.gather(*writers))
        await raw.stop()
    assert expected > 1_000 and written >= expected
    assert gaps == [], f"offsets skipped (expected, got): {gaps}"
