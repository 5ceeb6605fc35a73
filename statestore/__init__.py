"""Relay state stores: RocksDB key-value and window stores backed by Kafka changelog topics.

A record's state goes task -> store (RocksDB) -> changelog topic; restoration and standby or
learner copies read the changelog back into a store and report how far behind they are.
"""

from statestore.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from statestore.errors import (
    ChangelogDecodeError,
    StateStoreError,
    StoreCorruptError,
    StoreIOError,
    StoreLockedError,
    StoreReadError,
    StoreWriteError,
    TopicMismatchError,
)
from statestore.serdes import (
    BytesSerde,
    JsonSerde,
    MsgPackSerde,
    OrderedKeySerde,
    Serde,
    StrSerde,
    serde_from_name,
)
from statestore.store import KeyValueStore, StoreSpec

__all__ = [
    "BytesSerde",
    "ChangelogDecodeError",
    "Checkpoint",
    "JsonSerde",
    "KeyValueStore",
    "MsgPackSerde",
    "OrderedKeySerde",
    "Serde",
    "StateStoreError",
    "StoreCorruptError",
    "StoreIOError",
    "StoreLockedError",
    "StoreReadError",
    "StoreSpec",
    "StoreWriteError",
    "StrSerde",
    "TopicMismatchError",
    "read_checkpoint",
    "serde_from_name",
    "write_checkpoint",
]
