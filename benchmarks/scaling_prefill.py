"""The scaling benchmark's starting state: each task's changelog written directly, in the
format of the framework that will restore it, so every strategy starts from the same state by
restoring it the same way (its own full restore), instead of first processing a backlog.

Processing a backlog of gigabytes measures how fast a framework processes, which is not this
benchmark's question, and a slow one never reaches the changes under test (faust-streaming
did not get through 1.6 GB of input within ten minutes here). Restoring the same bytes is
what a moved task does anyway, so the start costs each strategy what a move costs it.

Each task ``0_p`` gets ``records_per_task`` versions of the keys that the input's partitioner
sends to partition ``p`` (the broker keeps every version: it does not compact), each carrying a
payload of ``value_bytes``: the per-key state the app itself writes (a count and the last
payload). The input topic starts empty; its steady traffic uses the same keys.

Relay's changelogs also get what the app writes at each commit: an input-position record
after every :data:`POSITION_EVERY` records (the input topic's offset 0: the state reflects no
input yet). A reader applies a task store's changes only once such a record covers them, so
a changelog without any would be held whole in memory until the first one the running app
writes, and a copy handed to the active restore before then would be read again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import msgpack
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from statestore.bulk_send import BoundedSender
from statestore.store import INPUT_POSITION_KEY, StoreSpec, changelog_topic_name

#: The app's store (Relay, Kafka Streams) and table (faust) are all called ``state``.
STORE = "state"
#: Changelog records between two input-position records of Relay's prefill (about what a
#: task writes between two commits under this benchmark's load).
POSITION_EVERY = 1_000

Encoder = Callable[[str, dict[str, object]], tuple[bytes, bytes]]
#: A task's input-position record, by partition (None: the framework writes none).
PositionRecord = Callable[[int], tuple[bytes, bytes]]


def input_key(index: int) -> bytes:
    """The input record key of key number ``index`` (the steady traffic's keys)."""
    return msgpack.packb(f"k{index}")


def keys_by_partition(keys: int, partitions: int) -> list[list[int]]:
    """Key numbers per input partition, as the producer's default partitioner places them."""
    partitioner = DefaultPartitioner()
    all_partitions = list(range(partitions))
    placed: list[list[int]] = [[] for _ in all_partitions]
    for index in range(keys):
        placed[partitioner(input_key(index), all_partitions, all_partitions)].append(index)
    return placed


def relay_encoder() -> Encoder:
    """Relay's store encoding: the ordered key serde and msgpack values (the store defaults)."""
    spec = StoreSpec(STORE)

    def encode(key: str, value: dict[str, object]) -> tuple[bytes, bytes]:
        return spec.key_serde.dumps(key), spec.value_serde.dumps(value)

    return encode


def relay_position(input_topic: str) -> PositionRecord:
    """Relay's input-position record for a task whose input partition is at offset 0."""
    def record(partition: int) -> tuple[bytes, bytes]:
        return INPUT_POSITION_KEY, msgpack.packb({f"{input_topic}:{partition}": 0})

    return record


def faust_encoder() -> Encoder:
    """faust's table encoding for ``key_type=str`` with the app's default serializers (JSON
    keys and values), which its recovery writes to RocksDB as they are."""

    def encode(key: str, value: dict[str, object]) -> tuple[bytes, bytes]:
        return (json.dumps(key).encode(),
                json.dumps(value, separators=(",", ":")).encode())

    return encode


def kafka_streams_encoder() -> Encoder:
    """The Kafka Streams app's store encoding (``relay.peers.ScalingApp``): the key is the
    input record's key as it is (``Serdes.Bytes``), the value the msgpack map the app
    writes."""

    def encode(key: str, value: dict[str, object]) -> tuple[bytes, bytes]:
        return msgpack.packb(key), msgpack.packb(value)

    return encode


def changelog_topic(app_id: str) -> str:
    """Every framework names the store's changelog ``<app id>-state-changelog`` (Kafka
    Streams: ``<application.id>-<store>-changelog``)."""
    return changelog_topic_name(app_id, STORE)


async def prefill_changelog(bootstrap: str, topic: str, partitions: int, keys: int,
                            records_per_task: int, value_bytes: int,
                            encode: Encoder, position: PositionRecord | None = None) -> float:
    """Write every task's changelog (with ``position`` records every
    :data:`POSITION_EVERY` records and at the end); returns records/s written."""
    placed = keys_by_partition(keys, partitions)
    empty = [p for p, found in enumerate(placed) if not found]
    if empty:
        raise ValueError(f"{keys} keys leave partitions {empty} without keys: use more keys")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20,
                                max_batch_size=512 * 1024, max_request_size=8 * 1024 * 1024)
    await producer.start()
    blob = "x" * value_bytes
    started = time.perf_counter()
    try:
        sender = BoundedSender(producer)
        for partition, indexes in enumerate(placed):
            for n in range(records_per_task):
                index = indexes[n % len(indexes)]
                key, value = encode(f"k{index}", {"n": n // len(indexes) + 1, "blob": blob})
                await sender.send(topic, key=key, value=value, partition=partition)
                if position is not None and (
                        (n + 1) % POSITION_EVERY == 0 or n + 1 == records_per_task):
                    mark, offsets = position(partition)
                    await sender.send(topic, key=mark, value=offsets, partition=partition)
        await sender.flush()
    finally:
        await producer.stop()
    return records_per_task * partitions / max(1e-9, time.perf_counter() - started)
