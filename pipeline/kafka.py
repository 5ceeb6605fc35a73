"""Blocking helpers over aiokafka for the pipeline's Spark code: topic shape, partition ends,
reading an offset range, producing records, and the runtime's key partitioner.

Spark calls data sources synchronously, on the driver and inside Python workers, so each helper
runs its own event loop. A partition's end is the fetch high watermark, never ListOffsets
(some brokers answer ListOffsets(latest) with the last batch's base offset + 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import ConsumerRecord, TopicPartition

from pipeline.errors import BrokerUnreachableError, OffsetRangeError, UnknownTopicError
from statestore.bulk_send import BoundedSender
from statestore.topics import existing_partition_counts

T = TypeVar("T")
CONNECT_TIMEOUT_S = 15.0
#: How long a read may see no progress towards its end offset before it gives up.
STALL_TIMEOUT_S = 60.0

_partitioner = DefaultPartitioner()


def partition_for(key: bytes, partitions: int) -> int:
    """The partition a keyed record goes to: the producer's default partitioner, which the
    runtime uses for every sink and repartition topic (murmur2 of the serialized key)."""
    return _partitioner(key, list(range(partitions)), list(range(partitions)))


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to completion on a fresh event loop; in a helper thread when this
    thread already runs a loop (a notebook, an async caller)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1, thread_name_prefix="relay-pipeline") as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _unreachable(bootstrap: str, exc: BaseException) -> BrokerUnreachableError:
    return BrokerUnreachableError(f"cannot reach the broker at {bootstrap}: {exc or type(exc)}")


async def _start(client: Any, bootstrap: str) -> None:
    """Start an aiokafka client; a broker that does not answer is BrokerUnreachableError."""
    try:
        await asyncio.wait_for(client.start(), CONNECT_TIMEOUT_S)
    except (TimeoutError, KafkaError, OSError) as exc:
        # Release what the half-started client holds before reporting.
        with contextlib.suppress(Exception):
            await (client.close() if isinstance(client, AIOKafkaAdminClient) else client.stop())
        if isinstance(exc, TimeoutError | KafkaConnectionError | OSError) or (
                "Unable to bootstrap" in str(exc)):
            raise _unreachable(bootstrap, exc) from exc
        raise


async def partition_count(bootstrap: str, topic: str) -> int:
    """How many partitions ``topic`` has; :class:`UnknownTopicError` if it does not exist."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await _start(admin, bootstrap)
    try:
        counts = await existing_partition_counts(admin, [topic])
    finally:
        await admin.close()
    if topic not in counts:
        raise UnknownTopicError(f"topic {topic!r} does not exist on {bootstrap}")
    return counts[topic]


def _consumer(bootstrap: str, **settings: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
        auto_offset_reset="none", check_crcs=False, **settings,
    )


async def offset_bounds(
    bootstrap: str, topic: str, partitions: Iterable[int]
) -> dict[int, tuple[int, int]]:
    """``{partition: (log start, end)}``, the end being the fetch high watermark."""
    tps = [TopicPartition(topic, p) for p in partitions]
    consumer = _consumer(bootstrap, fetch_max_wait_ms=50, max_partition_fetch_bytes=1024)
    await _start(consumer, bootstrap)
    try:
        consumer.assign(tps)
        starts = await consumer.beginning_offsets(tps)
        # Fetching at the (possibly early) ListOffsets end is cheap and brings the high watermark.
        await consumer.seek_to_end(*tps)
        deadline = time.monotonic() + STALL_TIMEOUT_S
        while any(consumer.highwater(tp) is None for tp in tps):
            if time.monotonic() > deadline:
                raise OffsetRangeError(f"no high watermark for {topic} within {STALL_TIMEOUT_S}s")
            await consumer.getmany(timeout_ms=200, max_records=1)
        return {tp.partition: (starts[tp], consumer.highwater(tp) or 0) for tp in tps}
    finally:
        await consumer.stop()


def read_range(
    bootstrap: str, topic: str, partition: int, start: int, end: int, batch_records: int
) -> Iterator[list[ConsumerRecord]]:
    """Batches of the records of ``topic[partition]`` with ``start <= offset < end``."""
    loop = asyncio.new_event_loop()
    batches = _read_range(bootstrap, topic, partition, start, end, batch_records)
    try:
        while True:
            try:
                yield loop.run_until_complete(batches.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(batches.aclose())
        loop.close()


async def _read_range(
    bootstrap: str, topic: str, partition: int, start: int, end: int, batch_records: int
) -> AsyncIterator[list[ConsumerRecord]]:
    tp = TopicPartition(topic, partition)
    consumer = _consumer(
        bootstrap, fetch_max_bytes=64 * 2**20, max_partition_fetch_bytes=16 * 2**20,
        fetch_max_wait_ms=100,
    )
    await _start(consumer, bootstrap)
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        position = start
        last_progress = time.monotonic()
        while position < end:
            fetched = await consumer.getmany(tp, timeout_ms=200, max_records=batch_records)
            records = [r for r in fetched.get(tp, []) if r.offset < end]
            if records:
                position = records[-1].offset + 1
                last_progress = time.monotonic()
                yield records
                continue
            # Offsets may have gaps (compaction, transaction markers): trust the position.
            position = max(position, await consumer.position(tp))
            if time.monotonic() - last_progress > STALL_TIMEOUT_S:
                raise OffsetRangeError(
                    f"{topic}[{partition}]: no records past offset {position} within "
                    f"{STALL_TIMEOUT_S}s although the range ends at {end}"
                )
    except KafkaError as exc:
        raise OffsetRangeError(f"{topic}[{partition}] {start}..{end}: {exc}") from exc
    finally:
        await consumer.stop()


async def produce(
    bootstrap: str, topic: str,
    records: Iterable[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]] | None]],
) -> dict[int, int]:
    """Send ``(partition, key, value, headers)`` records and wait for every acknowledgement.
    Returns the number of records per partition."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=1024 * 1024,
        max_request_size=8 * 1024 * 1024,
    )
    await _start(producer, bootstrap)
    counts: dict[int, int] = {}
    try:
        sender = BoundedSender(producer)
        for partition, key, value, headers in records:
            await sender.send(
                topic, key=key, value=value, partition=partition, headers=headers or None)
            counts[partition] = counts.get(partition, 0) + 1
        await sender.flush()
    finally:
        await producer.stop()
    return counts
