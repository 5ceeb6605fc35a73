"""Store snapshots: a task's store state as one sorted SST file plus a JSON manifest.

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
  yields the same state.

This module holds the format; deciding whether a store bootstraps from a snapshot, loading
and seeding it is the recovery layer's (:mod:`statestore.recovery`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import msgpack

from statestore.errors import StateStoreError

log = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
SST_FILE = "data.sst"
MANIFEST_VERSION = 1
SOURCES = ("changelog", "dataframe")
#: Reserved key (outside every key encoding, like the input position) of the seeding markers
#: a dataframe snapshot's bootstrap writes to the changelog around the snapshot's records.
SEED_MARKER_KEY = b"\xff\xffrelay.snapshot-seed"


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


def seed_marker(manifest: SnapshotManifest, phase: str) -> bytes:
    """The value of the seeding marker record: which snapshot, and ``start`` or ``end``."""
    return msgpack.packb({"sha256": manifest.sha256, "records": manifest.records,
                          "phase": phase})
