"""``streams.read_committed``: the public reader of a topic's committed records skips aborted
transactions on the embedded broker, which does not list them to its readers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgpack
import pytest
from confluent_kafka import Producer

from streams import read_committed
from tests.broker.streams.harness import create_topics

pytestmark = pytest.mark.broker


def producer(bootstrap: str, tid: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                     "partitioner": "murmur2_random", "enable.idempotence": True})


@pytest.mark.asyncio
async def test_committed_records_only_in_partition_order(
        bootstrap: str, unique: Callable[[str], str]) -> None:
    topic = unique("committed")
    await create_topics(bootstrap, {topic: 2})
    upstream = producer(bootstrap, f"{topic}-tx")
    await asyncio.to_thread(upstream.init_transactions, 10)
    for values, commit in (([1, 2, 3], True), ([-1, -2], False), ([4, 5], True)):
        upstream.begin_transaction()
        for v in values:
            upstream.produce(topic, key=msgpack.packb(f"k{v % 3}"), value=msgpack.packb(v))
        if commit:
            await asyncio.to_thread(upstream.commit_transaction, 10)
        else:
            assert await asyncio.to_thread(upstream.flush, 10) == 0
            await asyncio.to_thread(upstream.abort_transaction, 10)
    records = await read_committed(bootstrap, topic)
    assert sorted(v for _, v in records) == [1, 2, 3, 4, 5]
    by_partition = [v for _, v in await read_committed(bootstrap, topic, partitions=[1])] + [
        v for _, v in await read_committed(bootstrap, topic, partitions=[0])]
    assert sorted(by_partition) == [1, 2, 3, 4, 5]
    raw = await read_committed(bootstrap, topic, key_serde="bytes", value_serde="bytes")
    assert sorted(msgpack.unpackb(v) for _, v in raw) == [1, 2, 3, 4, 5]


@pytest.mark.asyncio
async def test_an_empty_topic_reads_as_nothing(
        bootstrap: str, unique: Callable[[str], str]) -> None:
    topic = unique("empty")
    await create_topics(bootstrap, {topic: 3})
    assert await read_committed(bootstrap, topic, timeout_s=20) == []
