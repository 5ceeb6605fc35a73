"""Errors raised by the state store layer, each naming what a person needs to act on."""

from __future__ import annotations


class StateStoreError(RuntimeError):
    """Base class of state store errors."""


class StoreLockedError(StateStoreError):
    """Another live process holds the store's directory."""


class TopicMismatchError(StateStoreError):
    """An existing topic does not have the partition count the application needs."""


class ChangelogDecodeError(StateStoreError):
    """A changelog record could not be decoded; names its topic, partition and offset."""

    def __init__(self, topic: str, partition: int, offset: int, reason: str) -> None:
        super().__init__(
            f"undecodable changelog record at {topic}[{partition}]@{offset}: {reason}"
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset


class StoreIOError(StateStoreError):
    """The machine failed a store (disk full, I/O error, unreadable database): not the fault
    of the record being processed. The runtime stops without committing past it."""


class StoreWriteError(StoreIOError):
    """A store could not be written (RocksDB refused a write or a flush, or the checkpoint
    could not be written); names the store and its directory."""


class StoreReadError(StoreIOError):
    """A store could not be read (RocksDB failed a lookup or a scan)."""


class StoreCorruptError(StateStoreError):
    """A store's database cannot be opened as it is on disk (corrupt or incomplete files);
    the recovery layer wipes it and restores it from its changelog."""
