"""Pipeline fixtures: topics on the session broker, and helpers that write a store's history
through the real changelog path (the Spark session, ``spark``, is tests/broker/conftest.py's)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from statestore.changelog import ChangelogWriter
from statestore.recovery import bootstrap_from_snapshot
from statestore.restore import ChangelogReader
from statestore.snapshot import SnapshotRef
from statestore.store import KeyValueStore, StoreSpec, changelog_topic_name, store_directory
from statestore.topics import COMPACTED, TopicSpec, ensure_topics


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict | None = None) -> None:
    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await ensure_topics(admin, [TopicSpec(topic, partitions, config or {})])
        finally:
            await admin.close()

    asyncio.run(create())


def open_store(state_dir: Path, app: str, partition: int, store: str = "counts",
               snapshot: SnapshotRef | None = None,
               value_serde: str = "msgpack") -> KeyValueStore:
    """``value_serde``: "timestamped" for the store of a DSL aggregation (a count keeps each
    value's timestamp), the default for a store the test writes itself."""
    opened = KeyValueStore(
        StoreSpec(store, value_serde=value_serde),
        store_directory(state_dir, app, f"0_{partition}", store),
        changelog_topic_name(app, store), partition,
    ).open()
    if snapshot is not None:
        bootstrap_from_snapshot(opened, snapshot)
    return opened


def create_changelog(bootstrap: str, app: str, partitions: int, store: str = "counts") -> str:
    topic = changelog_topic_name(app, store)
    create_topic(bootstrap, topic, partitions, COMPACTED)
    return topic


def write_history(bootstrap: str, store: KeyValueStore, ops: int, seed: int,
                  first_input_offset: int = 0) -> None:
    """Random puts, overwrites and deletes through the changelog, with input positions
    recorded along the way like a task does at each commit."""
    rng = random.Random(seed)

    async def write() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        await producer.start()
        try:
            writer = ChangelogWriter(producer)
            for i in range(ops):
                key = f"k{rng.randrange(60)}"
                if rng.random() < 0.2:
                    store.delete(key)
                else:
                    store.put(key, {"n": i, "seed": seed})
                if i % 50 == 49:
                    store.write_input_position({"in:0": first_input_offset + i + 1})
                    await writer.flush([store])
            await writer.flush([store])
        finally:
            await producer.stop()
        store.commit()

    asyncio.run(write())


def restore(bootstrap: str, store: KeyValueStore) -> int:
    """Replay the store's changelog from its position; returns the records replayed."""

    async def run() -> int:
        async with ChangelogReader(bootstrap) as reader:
            return (await reader.restore([store], show_progress=False, timeout_s=60)).records

    return asyncio.run(run())


def state(store: KeyValueStore) -> tuple[dict[bytes, bytes], dict[str, int]]:
    """Everything a restored store holds: its entries and its input position."""
    return dict(store.raw_items()), store.read_input_position()
