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
