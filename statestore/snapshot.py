"""Store snapshots: a task's store state as one sorted SST file plus a JSON manifest, and the
bootstrap that loads one into a store instead of replaying its whole changelog.

A snapshot lives in ``<root>/<app>/<store>/<task>/`` (``manifest.json`` and ``data.sst``). The
manifest names what it belongs to (app, store, task, changelog partition), the changelog offset
the state covers (the next offset to replay), its record count and the SST's sha256; a
snapshot that does not match the store opening it, or whose file does not match its checksum,
is refused with a warning and the store restores from the changelog as if there were none.

Two kinds of snapshot:

* ``changelog``: built from the changelog itself. Loading it sets the store's position to the
  snapshot's offset, so only the changelog's tail is replayed. It carries the reserved input
  position key, so the task resumes its input where the state says.
* ``dataframe``: built from other data (history in Parquet, say). The changelog knows nothing
  of that state, so the bootstrap also writes it there, between a start and an end marker
  (a reserved key), and checkpoints after the end marker: a later restore from the changelog
  yields the same state. A bootstrap interrupted while seeding finds its start marker and
  seeds again; a changelog holding anything else is never seeded over.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from statestore.bulk_send import BoundedSender
from statestore.checkpoint import Checkpoint
from statestore.errors import StateStoreError

if TYPE_CHECKING:
    from statestore.store import KeyValueStore

log = logging.getLogger(__name__)
T = TypeVar("T")

MANIFEST_FILE = "manifest.json"
SST_FILE = "data.sst"
MANIFEST_VERSION = 1
SOURCES = ("changelog", "dataframe")
#: Reserved key (outside every key encoding, like the input position) of the seeding markers
#: a dataframe snapshot's bootstrap writes to the changelog around the snapshot's records.
SEED_MARKER_KEY = b"\xff\xffrelay.snapshot-seed"
BROKER_TIMEOUT_S = 60.0


class SnapshotError(StateStoreError):
    """A snapshot is corrupt, or belongs to another app, store, task or partition."""


@dataclass(frozen=True)
class SnapshotManifest:
    app: str
    store: str
    task: str
    partition: int
    changelog: str
    #: The next changelog offset the state reflects; 0 for a dataframe snapshot (its records
    #: get their changelog offsets when a bootstrap seeds them).
    offset: int
    #: Entries in the SST file (reserved keys included); 0 means there is no file.
    records: int
    sha256: str | None
    source: str
    key_serde: str = "ordered"
    value_serde: str = "msgpack"
    created_ms: int = 0
    version: int = MANIFEST_VERSION

    @property
    def sst_file(self) -> str | None:
        return SST_FILE if self.records else None


def snapshot_directory(root: Path, app: str, store: str, task: str) -> Path:
    return Path(root) / app / store / task


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(directory: Path, manifest: SnapshotManifest) -> Path:
    """Write ``manifest.json`` atomically (a reader never sees half a manifest)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MANIFEST_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(manifest), indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def read_manifest(directory: Path) -> SnapshotManifest | None:
    """The manifest in ``directory``; None when there is none, SnapshotError when unreadable."""
    path = Path(directory) / MANIFEST_FILE
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
        known = {f.name for f in fields(SnapshotManifest)}
        manifest = SnapshotManifest(**{k: v for k, v in raw.items() if k in known})
        for name, kind in (("partition", int), ("offset", int), ("records", int)):
            if not isinstance(getattr(manifest, name), kind) or getattr(manifest, name) < 0:
                raise ValueError(f"{name} must be an integer >= 0")
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise SnapshotError(f"corrupt snapshot manifest {path}: {exc}") from exc
    if manifest.version != MANIFEST_VERSION:
        raise SnapshotError(f"snapshot manifest {path} has unknown version {manifest.version}")
    if manifest.source not in SOURCES:
        raise SnapshotError(f"snapshot manifest {path} has unknown source {manifest.source!r}")
    return manifest


def verify_snapshot(
    directory: Path, *, app: str, store: str, task: str, partition: int, changelog: str
) -> SnapshotManifest | None:
    """The snapshot in ``directory`` checked against the store that wants it and its own
    checksum; None when there is no snapshot, :class:`SnapshotError` when it does not fit."""
    manifest = read_manifest(directory)
    if manifest is None:
        return None
    expected = {"app": app, "store": store, "task": task, "partition": partition,
                "changelog": changelog}
    wrong = {k: getattr(manifest, k) for k, v in expected.items() if getattr(manifest, k) != v}
    if wrong:
        found = ", ".join(f"{k}={v!r} (expected {expected[k]!r})" for k, v in wrong.items())
        raise SnapshotError(f"snapshot {directory} is for another store: {found}")
    if manifest.records:
        sst = Path(directory) / SST_FILE
        if not sst.is_file():
            raise SnapshotError(f"snapshot {directory} has no {SST_FILE}")
        actual = file_sha256(sst)
        if actual != manifest.sha256:
            raise SnapshotError(
                f"snapshot {directory}: {SST_FILE} has sha256 {actual[:16]}…, the manifest "
                f"says {str(manifest.sha256)[:16]}… (corrupt or replaced file)"
            )
    return manifest


@dataclass(frozen=True)
class SnapshotSettings:
    """Where an app's snapshots are, and the broker a dataframe snapshot is seeded into."""

    root: Path
    bootstrap_servers: str | None = None

    def for_store(self, app: str, task: str, store: str) -> SnapshotRef:
        return SnapshotRef(snapshot_directory(self.root, app, store, task), app, task,
                           self.bootstrap_servers)


@dataclass(frozen=True)
class SnapshotRef:
    """The snapshot one store may bootstrap from."""

    directory: Path
    app: str
    task: str
    bootstrap_servers: str | None = None


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


def plan_bootstrap(
    store: KeyValueStore, ref: SnapshotRef, checkpoint: Checkpoint | None
) -> BootstrapPlan | None:
    """Decide, before the store opens RocksDB, whether it bootstraps from its snapshot.

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
            if checkpoint is not None and checkpoint.offset >= manifest.offset:
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
        if checkpoint is not None:
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
    """Ingest the snapshot into the (empty, open) store, seed the changelog if planned, and
    checkpoint. A failure leaves no checkpoint, so the next open starts over."""
    started = time.perf_counter()
    if plan.manifest.records:
        store.ingest_sst(plan.directory / SST_FILE, plan.position)
    else:
        store.position = plan.position
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
    """Run ``coroutine`` on its own loop in a helper thread: stores open synchronously, often
    from inside a running event loop. The caller blocks until it is done (once per store)."""
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


def seed_marker(manifest: SnapshotManifest, phase: str) -> bytes:
    """The value of the seeding marker record: which snapshot, and ``start`` or ``end``."""
    return msgpack.packb({"sha256": manifest.sha256, "records": manifest.records,
                          "phase": phase})


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
        # The input position is a reserved key, which raw_items() leaves out. (Imported here:
        # statestore.store imports this module.)
        from statestore.store import INPUT_POSITION_KEY

        position = store.read_input_position()
        if position:
            await producer.send_and_wait(topic, key=INPUT_POSITION_KEY,
                                         value=msgpack.packb(position), partition=partition)
        metadata = await producer.send_and_wait(
            topic, key=SEED_MARKER_KEY, value=seed_marker(manifest, "end"), partition=partition)
        return int(metadata.offset) + 1
    finally:
        await producer.stop()
