"""The counting benchmarks' input: a topic prefilled with ``records`` records over ``keys``
keys (record ``i`` has key ``k{i % keys}`` and value ``i``, both msgpack), and the count per
key that input implies, which the benchmarks check their apps' results against."""

from __future__ import annotations

import asyncio

import msgpack
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from statestore.topics import TopicSpec, ensure_topics


def key_name(index: int) -> str:
    return f"k{index}"


def true_counts(records: int, keys: int) -> dict[str, int]:
    """How many records of the filled input carry each key."""
    whole, rest = divmod(records, keys)
    return {key_name(k): whole + (1 if k < rest else 0) for k in range(min(keys, records))}


async def fill(bootstrap: str, topic: str, records: int, keys: int, partitions: int,
               config: dict[str, str] | None = None) -> None:
    """Create ``topic`` (with topic ``config``, if given) and write the input into it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, [TopicSpec(topic, partitions, dict(config or {}))])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20,
                                max_batch_size=256 * 1024)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=msgpack.packb(key_name(i % keys)),
                                       value=msgpack.packb(i)) for i in range(records)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
