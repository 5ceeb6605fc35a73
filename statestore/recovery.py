"""Recovery: what state a task's store starts from, decided before anything reads it.

A store (:mod:`statestore.store`) only opens, reads, writes, commits and closes. This layer
opens a task's store and decides what to load into it:

* a store whose database RocksDB cannot open (a truncated SST file, garbage in ``CURRENT``) is
  wiped, with a warning naming it, and restored from its changelog in full; a checkpoint
  without its database means a full restore too (the store's ``open`` sees to that);
* a store without checkpoint (or, for a changelog snapshot, with one behind it) bootstraps from
  its snapshot, when the app has a snapshot directory (:mod:`statestore.snapshot` holds the
  format): it loads the SST file, and a dataframe snapshot is also seeded into the empty
  changelog, between a start and an end marker, so that a later restore from the changelog
  yields the same state. A bootstrap interrupted while seeding finds its start marker and
  seeds again; a changelog holding anything else is never seeded over.

Restoration then replays the changelog from the store's position (:mod:`statestore.restore`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from statestore.bulk_send import BoundedSender
from statestore.errors import StoreCorruptError
from statestore.snapshot import (
    SEED_MARKER_KEY,
    SST_FILE,
    SnapshotError,
    SnapshotManifest,
    SnapshotRef,
    seed_marker,
    verify_snapshot,
)
from statestore.store import INPUT_POSITION_KEY, KeyValueStore, StoreSpec

log = logging.getLogger(__name__)
T = TypeVar("T")

BROKER_TIMEOUT_S = 60.0


def open_task_store(
    spec: StoreSpec,
    directory: Path,
    changelog_topic: str | None,
    partition: int,
    *,
    snapshot: SnapshotRef | None = None,
    bulk_load: bool = False,
) -> KeyValueStore:
    """Open a task's store at the state restoration must start from; not restored yet.

    ``bulk_load``: opened for restoration (see ``KeyValueStore.open``).
    """
    store = KeyValueStore(spec, directory, changelog_topic, partition, tracks_input=True)
    open_verified(store, bulk_load=bulk_load)
    if snapshot is not None:
        try:
            bootstrap_from_snapshot(store, snapshot)
        except BaseException:
            store.close()
            raise
    return store


def open_verified(store: KeyValueStore, *, bulk_load: bool = False) -> KeyValueStore:
    """Open the store; one whose database cannot be opened as it is on disk is wiped, with a
    warning naming it, and opened empty: restoration then replays its whole changelog."""
    try:
        return store.open(bulk_load=bulk_load)
    except StoreCorruptError as exc:
        log.warning("%s; wiping it and restoring it from its changelog %s[%d] in full",
                    exc, store.changelog_topic, store.partition)
        store.wipe()
        return store.open(bulk_load=bulk_load)


def bootstrap_from_snapshot(store: KeyValueStore, snapshot: SnapshotRef) -> bool:
    """Load the (open) store from its snapshot if it has no state the snapshot should not
    replace; returns whether it did. Anything wrong with the snapshot is logged and the store
    restores from its changelog instead."""
    plan = plan_bootstrap(store, snapshot)
    if plan is None:
        return False
    bulk_load = store.bulk_loading
    # The snapshot replaces whatever older state is on disk.
    store.close()
    store.wipe()
    store.open(bulk_load=bulk_load)
    load_snapshot(store, plan)
    return True


@dataclass(frozen=True)
class BootstrapPlan:
    """What opening the store will do with the snapshot: load it, then maybe seed it."""

    manifest: SnapshotManifest
    directory: Path
    #: The store's position once the snapshot is loaded (seeding moves it further).
    position: int
    #: Seed the changelog with the snapshot's records after loading it.
    seed: bool
    bootstrap_servers: str | None


def plan_bootstrap(store: KeyValueStore, ref: SnapshotRef) -> BootstrapPlan | None:
    """Decide whether the (open) store bootstraps from its snapshot.

    Only a store without checkpoint (or, for a changelog snapshot, with one behind the
    snapshot) does. Anything wrong with the snapshot is logged and the answer is None: the
    store then restores from its changelog as usual.
    """
    if store.changelog_topic is None:
        return None
    try:
        manifest = verify_snapshot(
            ref.directory, app=ref.app, store=store.name, task=ref.task,
            partition=store.partition, changelog=store.changelog_topic,
        )
        if manifest is None:
            return None
        if manifest.source == "changelog":
            if store.has_checkpoint and store.position >= manifest.offset:
                return None
            if ref.bootstrap_servers is not None:
                _, end = _run_blocking(_bounds(ref.bootstrap_servers, store))
                if end < manifest.offset:
                    raise SnapshotError(
                        f"snapshot {ref.directory} covers {store.changelog_topic}"
                        f"[{store.partition}] up to offset {manifest.offset} but the changelog "
                        f"ends at {end}: it was built from another copy of the topic"
                    )
            return BootstrapPlan(manifest, ref.directory, manifest.offset, False, None)
        if store.has_checkpoint:
            return None
        if ref.bootstrap_servers is None:
            raise SnapshotError(
                f"snapshot {ref.directory} was built from a dataframe: seeding it into the "
                f"changelog needs the broker's address"
            )
        position, seed = _run_blocking(_seeding_state(ref.bootstrap_servers, store, manifest))
        return BootstrapPlan(manifest, ref.directory, position, seed, ref.bootstrap_servers)
    except SnapshotError as exc:
        log.warning("%s; store %s restores from its changelog instead", exc, store.name)
        return None


def load_snapshot(store: KeyValueStore, plan: BootstrapPlan) -> None:
    """Ingest the snapshot into the (wiped, open) store, seed the changelog if planned, and
    checkpoint. A failure leaves no checkpoint, so the next open starts over."""
    started = time.perf_counter()
    if plan.manifest.records:
        store.ingest_sst(plan.directory / SST_FILE, plan.position)
    else:
        store.set_position(plan.position)
    if plan.seed:
        assert plan.bootstrap_servers is not None
        # No overall deadline: a large snapshot takes a while to write (the producer's own
        # timeouts still apply to each request).
        end = _run_blocking(_seed(plan.bootstrap_servers, store, plan.manifest), None)
        store.apply_restore_batch([(SEED_MARKER_KEY, seed_marker(plan.manifest, "end"))], end)
    store.commit()
    log.info(
        "store %s[%d] bootstrapped from snapshot %s (%s, %d records) in %.2fs; replaying the "
        "changelog from offset %d", store.name, store.partition, plan.directory,
        plan.manifest.source, plan.manifest.records, time.perf_counter() - started,
        store.position,
    )


# -- the broker side: changelog bounds and seeding ------------------------------------------


def _run_blocking(
    coroutine: Coroutine[Any, Any, T], timeout_s: float | None = BROKER_TIMEOUT_S
) -> T:
    """Run ``coroutine`` on its own loop in a helper thread: a task's stores are opened
    synchronously, and the caller may be inside a running event loop. The caller blocks until
    it is done (once per store, and only for a store with a snapshot to bootstrap from): a
    stream thread therefore opens such stores in a worker thread, off its event loop
    (``TaskManager.open_ahead``)."""
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(asyncio.wait_for(coroutine, timeout_s)))
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=target, name="relay-snapshot", daemon=True)
    worker.start()
    worker.join()
    if failure:
        exc = failure[0]
        if isinstance(exc, SnapshotError):
            raise exc
        raise SnapshotError(f"snapshot bootstrap could not use the broker: {exc!r}") from exc
    return result[0]


def _is_marker(record: Any, manifest: SnapshotManifest, phase: str) -> bool:
    return (record is not None and record.key == SEED_MARKER_KEY
            and record.value == seed_marker(manifest, phase))


async def _consumer(bootstrap: str) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, auto_offset_reset="none",
                                fetch_max_wait_ms=50)
    await consumer.start()
    return consumer


async def _bounds(bootstrap: str, store: KeyValueStore) -> tuple[int, int]:
    """(log start, end) of the store's changelog partition; the end is the high watermark."""
    tp = TopicPartition(str(store.changelog_topic), store.partition)
    consumer = await _consumer(bootstrap)
    try:
        consumer.assign([tp])
        start = (await consumer.beginning_offsets([tp]))[tp]
        await consumer.seek_to_end(tp)
        while consumer.highwater(tp) is None:
            await consumer.getmany(tp, timeout_ms=100, max_records=1)
        return start, int(consumer.highwater(tp) or 0)
    finally:
        await consumer.stop()


async def _record_at(bootstrap: str, store: KeyValueStore, offset: int) -> Any:
    tp = TopicPartition(str(store.changelog_topic), store.partition)
    consumer = await _consumer(bootstrap)
    try:
        consumer.assign([tp])
        consumer.seek(tp, offset)
        while True:
            records = (await consumer.getmany(tp, timeout_ms=200, max_records=1)).get(tp)
            if records:
                return records[0] if records[0].offset == offset else None
    finally:
        await consumer.stop()


async def _seeding_state(
    bootstrap: str, store: KeyValueStore, manifest: SnapshotManifest
) -> tuple[int, bool]:
    """(position after loading, whether to seed) for a dataframe snapshot, from what the
    changelog holds: nothing (seed it), this snapshot's complete seeding (load it and replay
    what came after), an interrupted seeding (seed again) or anything else (refuse)."""
    start, end = await _bounds(bootstrap, store)
    if end == start:
        return end, True
    first = await _record_at(bootstrap, store, start)
    if not _is_marker(first, manifest, "start"):
        raise SnapshotError(
            f"snapshot {manifest.app}/{manifest.store}/{manifest.task} was built from a "
            f"dataframe, but changelog {store.changelog_topic}[{store.partition}] already holds "
            f"{end - start} records of other state; rebuild the snapshot from the changelog"
        )
    end_marker_offset = start + manifest.records + 1
    if end <= end_marker_offset:
        log.warning("store %s: an earlier seeding of its snapshot was interrupted; seeding "
                    "again", store.name)
        return end, True
    if _is_marker(await _record_at(bootstrap, store, end_marker_offset), manifest, "end"):
        return end_marker_offset + 1, False
    raise SnapshotError(
        f"changelog {store.changelog_topic}[{store.partition}] holds an unfinished seeding of "
        f"this snapshot followed by other records"
    )


async def _seed(bootstrap: str, store: KeyValueStore, manifest: SnapshotManifest) -> int:
    """Write the start marker (on an empty changelog), the store's entries and the end marker;
    returns the changelog offset after the end marker."""
    topic, partition = str(store.changelog_topic), store.partition
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                                max_batch_size=1024 * 1024, max_request_size=8 * 1024 * 1024)
    await producer.start()
    try:
        start, end = await _bounds(bootstrap, store)
        if end == start:
            await producer.send_and_wait(topic, key=SEED_MARKER_KEY,
                                         value=seed_marker(manifest, "start"), partition=partition)
        sender = BoundedSender(producer)
        for key, value in store.raw_items():
            await sender.send(topic, key=key, value=value, partition=partition)
        await sender.flush()
        # The input position is a reserved key, which raw_items() leaves out.
        position = store.read_input_position()
        if position:
            await producer.send_and_wait(topic, key=INPUT_POSITION_KEY,
                                         value=msgpack.packb(position), partition=partition)
        metadata = await producer.send_and_wait(
            topic, key=SEED_MARKER_KEY, value=seed_marker(manifest, "end"), partition=partition)
        return int(metadata.offset) + 1
    finally:
        await producer.stop()
