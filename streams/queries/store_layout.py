"""Where each store's keys live: the task a key is processed in, computed from plain data.

A key lives in one task: the partition the runtime's producer (aiokafka's default murmur2
partitioner) sends it to, hashed from the key as the store's sub-topology reads it from its
source topic. Members publish their stores' layouts in their status records, so that a router
without the app's code can find a key's owner.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka.partitioner import DefaultPartitioner

from statestore.serdes import Serde, serde_from_name
from streams.dsl.processors import CustomProcessorNode, WindowAggregateNode, walk_nodes
from streams.dsl.sessions import SessionAggregateNode
from streams.dsl.sliding import SlidingAggregateNode
from streams.dsl.topology import SubTopology

#: The runtime's producers pick partitions with aiokafka's default partitioner.
_PARTITIONER = DefaultPartitioner()

class StoreKeyError(ValueError):
    """A key the store's serdes cannot encode (or a windowed store's key that is not
    ``(key, window_start)``)."""


@dataclass(frozen=True)
class StoreLayout:
    """Where a store's keys live: its sub-topology, its partition count, and the serde its
    keys were hashed with (the key serde of the source topic the store is fed from)."""

    store: str
    sub_topology: int
    partitions: int
    key_serde: Serde
    #: A windowed aggregate's store, keyed ``(key, window_start)``: partitioned by ``key``.
    windowed: bool = False
    #: A ``process()`` step's own store, which its code may key otherwise than its records:
    #: a key is still looked for in the task its record key would go to.
    processor: bool = False
    #: A session aggregate's store, keyed ``(key, end, start)``: partitioned by ``key``.
    sessions: bool = False

    def store_key(self, key: Any) -> Any:
        """The key as the store holds it (a windowed or session store's key becomes a
        tuple)."""
        if self.sessions:
            if not isinstance(key, list | tuple) or len(key) != 3 or not all(
                    isinstance(k, int) and not isinstance(k, bool) for k in key[1:]):
                raise StoreKeyError(f"store {self.store} holds sessions: its keys are "
                                    f"(key, session_end_ms, session_start_ms), not {key!r}")
            return (key[0], key[1], key[2])
        if not self.windowed:
            return key
        if not isinstance(key, list | tuple) or len(key) != 2 or not isinstance(key[1], int):
            raise StoreKeyError(f"store {self.store} is windowed: its keys are "
                                f"(key, window_start_ms), not {key!r}")
        return (key[0], key[1])

    def partition_of(self, key: Any, record_key_given: bool = False) -> int:
        """The partition the key is processed in, as the runtime's partitioner picks it
        (``record_key_given``: ``key`` is the record key of a windowed or session store's
        entries, not one of its entries' keys)."""
        record_key = (self.store_key(key)[0] if (self.windowed or self.sessions)
                      and not record_key_given else key)
        if record_key is None:
            raise StoreKeyError(f"store {self.store} holds no entry without a key")
        try:
            raw = self.key_serde.dumps(record_key)
        except Exception as exc:
            raise StoreKeyError(f"store {self.store}: cannot encode key {record_key!r} with "
                                f"its source's key serde: {exc}") from None
        partitions = list(range(self.partitions))
        return int(_PARTITIONER(raw, partitions, partitions))

    def task_of(self, key: Any, record_key_given: bool = False) -> str:
        return f"{self.sub_topology}_{self.partition_of(key, record_key_given)}"

    def to_status(self) -> dict[str, Any]:
        """As published on the status topic, for routers without the app's code: the serde
        by name, or None when its name does not rebuild it (a serde of the app's own)."""
        name = getattr(self.key_serde, "name", None)
        try:
            rebuilt = None if name is None else serde_from_name(str(name))
        except ValueError:
            rebuilt = None
        return {"sub_topology": self.sub_topology, "partitions": self.partitions,
                "key_serde": name if type(rebuilt) is type(self.key_serde) else None,
                "windowed": self.windowed, "processor": self.processor,
                "sessions": self.sessions}

    @classmethod
    def from_status(cls, store: str, value: Any) -> StoreLayout:
        """The layout a member published; ValueError when it cannot be used."""
        if not isinstance(value, dict):
            raise ValueError(f"store {store}: layout is not a map")
        serde = value.get("key_serde")
        if not isinstance(serde, str):
            raise ValueError(f"store {store}: its keys use a serde of the app's own, which "
                             f"only the app's workers can rebuild; query a worker")
        sub, partitions = value.get("sub_topology"), value.get("partitions")
        if not isinstance(sub, int) or not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"store {store}: layout {value!r} is malformed")
        return cls(store, sub, partitions, serde_from_name(serde), bool(value.get("windowed")),
                   bool(value.get("processor")), bool(value.get("sessions")))


def store_layouts(subs: Iterable[SubTopology]) -> dict[str, StoreLayout]:
    """Every store of the app's sub-topologies (their partition counts already resolved)."""
    layouts: dict[str, StoreLayout] = {}
    for sub in subs:
        for store in sorted(sub.stores):
            for topic in sorted(sub.sources):
                source = sub.sources[topic]
                nodes = [n for n in walk_nodes([source]) if store in n.store_names()]
                if nodes:
                    # Sliding windows are stored as tumbling and hopping ones are.
                    windowed = any(isinstance(n, WindowAggregateNode | SlidingAggregateNode)
                                   for n in nodes)
                    processor = all(isinstance(n, CustomProcessorNode) for n in nodes)
                    sessions = any(isinstance(n, SessionAggregateNode) for n in nodes)
                    layouts[store] = StoreLayout(store, sub.id, sub.partitions,
                                                 source.key_serde, windowed, processor,
                                                 sessions)
                    break
            else:  # a store no source reaches (a processor's own): the first source's key
                first = sub.sources[sorted(sub.sources)[0]]
                layouts[store] = StoreLayout(store, sub.id, sub.partitions, first.key_serde,
                                             processor=True)
    return layouts
