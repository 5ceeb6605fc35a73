"""Checkpoint files: the changelog offset a store's on-disk state reflects, written atomically.

The offset is the next changelog offset to apply, so restoration resumes exactly there. A
missing or unreadable checkpoint means the store cannot be trusted and is restored in full.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CHECKPOINT_FILE = ".checkpoint"
CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    changelog: str
    partition: int
    offset: int
    version: int = CHECKPOINT_VERSION


def checkpoint_path(store_dir: Path) -> Path:
    return store_dir.parent / f"{store_dir.name}{CHECKPOINT_FILE}"


def write_checkpoint(store_dir: Path, checkpoint: Checkpoint) -> None:
    """Write through a temporary file, fsync it, and rename it over the old checkpoint."""
    path = checkpoint_path(store_dir)
    tmp = path.with_suffix(path.suffix + ".tmp")
    payload = json.dumps(asdict(checkpoint)).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_checkpoint(store_dir: Path, changelog: str, partition: int) -> Checkpoint | None:
    """The store's checkpoint, or None (with a warning naming the file) when it is missing,
    corrupt, or belongs to another changelog partition."""
    path = checkpoint_path(store_dir)
    if not path.exists():
        if store_dir.exists() and any(store_dir.glob("*.sst")):
            log.warning("no checkpoint file %s: restoring the store in full", path)
        elif store_dir.exists():
            # Opened but never committed to (its task had no record): nothing was lost.
            log.info("no checkpoint file %s, and no data beside it: restoring the store from "
                     "its changelog's start", path)
        return None
    try:
        raw = json.loads(path.read_bytes())
        checkpoint = Checkpoint(
            changelog=str(raw["changelog"]),
            partition=int(raw["partition"]),
            offset=int(raw["offset"]),
            version=int(raw["version"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("corrupt checkpoint file %s (%s): restoring the store in full", path, exc)
        return None
    if checkpoint.version != CHECKPOINT_VERSION:
        log.warning("checkpoint %s has unknown version %s: full restore", path, checkpoint.version)
        return None
    if (checkpoint.changelog, checkpoint.partition) != (changelog, partition):
        log.warning(
            "checkpoint %s is for %s[%d], not %s[%d]: restoring the store in full",
            path, checkpoint.changelog, checkpoint.partition, changelog, partition,
        )
        return None
    if checkpoint.offset < 0:
        log.warning("checkpoint %s has a negative offset: restoring the store in full", path)
        return None
    return checkpoint


def remove_checkpoint(store_dir: Path) -> None:
    checkpoint_path(store_dir).unlink(missing_ok=True)
