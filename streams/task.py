"""A stream task: one partition of one sub-topology, with its stores.

A record goes: source topic -> :meth:`StreamTask.process` (deserialize with the source's
serdes) -> processor nodes -> stores (changelog records queued) and outputs (sink records
queued). The stream thread ships what was queued and commits; the task remembers the next
offset of each input partition it processed, which is what gets committed and where a kept
partition resumes after a rebalance.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from aiokafka.structs import ConsumerRecord, TopicPartition

from statestore.recovery import open_task_store
from statestore.snapshot import SnapshotSettings
from statestore.store import KeyValueStore, StoreSpec, changelog_topic_name, store_directory
from streams.processors import Node, ProcessorContext, SourceNode, WindowAggregateNode
from streams.topology import SubTopology

log = logging.getLogger(__name__)


class RecordError(Exception):
    """A record could not be deserialized or processed; carries where it came from."""

    def __init__(self, stage: str, record: ConsumerRecord, cause: BaseException) -> None:
        super().__init__(
            f"{stage} failed for {record.topic}[{record.partition}]@{record.offset}: "
            f"{type(cause).__name__}: {cause}"
        )
        self.stage = stage
        self.record = record
        self.cause = cause


@dataclass(frozen=True)
class TaskId:
    subtopology: int
    partition: int

    @classmethod
    def parse(cls, text: str) -> TaskId:
        try:
            sub, part = text.split("_")
            return cls(int(sub), int(part))
        except ValueError:
            raise ValueError(
                f"not a task id: {text!r} (expected '<sub-topology>_<partition>')"
            ) from None

    def __str__(self) -> str:
        return f"{self.subtopology}_{self.partition}"


def open_task_stores(
    sub: SubTopology, task_id: str, application_id: str, state_dir: Path,
    snapshots: SnapshotSettings | None = None, *, bulk_load: bool = False,
) -> dict[str, KeyValueStore]:
    """Open (lock, check checkpoints, bootstrap from snapshots) every store of a task; not
    restored yet. ``bulk_load``: opened for restoration (see ``KeyValueStore.open``)."""
    partition = TaskId.parse(task_id).partition
    stores: dict[str, KeyValueStore] = {}
    try:
        for name, decl in sorted(sub.stores.items()):
            spec = StoreSpec(name, value_serde=decl.value_serde)
            stores[name] = open_task_store(
                spec,
                store_directory(state_dir, application_id, task_id, name),
                changelog_topic_name(application_id, name),
                partition,
                snapshot=snapshots.for_store(application_id, task_id, name) if snapshots else None,
                bulk_load=bulk_load,
            )
    except BaseException:
        for store in stores.values():
            store.close()
        raise
    return stores


class StreamTask:
    """Processes the records of one partition of one sub-topology."""

    def __init__(self, task_id: str, sub: SubTopology, stores: dict[str, KeyValueStore]) -> None:
        self.task_id = task_id
        self.sub = sub
        self.partition = TaskId.parse(task_id).partition
        self.stores = stores
        self.context = ProcessorContext(task_id, stores)
        self.sources: dict[str, SourceNode] = dict(sub.sources)
        self.partitions = [TopicPartition(t, self.partition) for t in sorted(sub.sources)]
        # Next offset to process per input partition; what is committed.
        self.processed: dict[TopicPartition, int] = {}
        self.records_processed = 0
        self._recorded: dict[TopicPartition, int] = {}
        self._window_nodes = [n for n in _walk(sub.sources.values()) if isinstance(
            n, WindowAggregateNode)]

    def process(self, record: ConsumerRecord) -> None:
        """Run one record through the topology. Raises :class:`RecordError` on bad input;
        the record then counts as processed (it goes to the dead-letter topic instead)."""
        tp = TopicPartition(record.topic, record.partition)
        source = self.sources[record.topic]
        self.processed[tp] = record.offset + 1
        try:
            key = None if record.key is None else source.key_serde.loads(record.key)
            value = None if record.value is None else source.value_serde.loads(record.value)
        except Exception as exc:
            raise RecordError("deserialize", record, exc) from exc
        ctx = self.context
        ctx.topic, ctx.partition, ctx.offset = record.topic, record.partition, record.offset
        ctx.timestamp_ms = record.timestamp
        try:
            source.process(ctx, key, value)
        except Exception as exc:
            raise RecordError("process", record, exc) from exc
        finally:
            ctx.stream_time_ms = max(ctx.stream_time_ms, record.timestamp)
        self.records_processed += 1

    def record_input_position(self) -> None:
        """Write the input offsets processed so far into every store, with the data."""
        if not self.stores or self.processed == self._recorded:
            return
        position = {f"{tp.topic}:{tp.partition}": offset for tp, offset in self.processed.items()}
        for store in self.stores.values():
            store.write_input_position(position)
        self._recorded = dict(self.processed)

    def restored_input_position(self) -> dict[TopicPartition, int]:
        """The input offsets every store's restored state reflects (the smallest per input)."""
        merged: dict[TopicPartition, int] = {}
        for i, store in enumerate(self.stores.values()):
            positions = {}
            for name, offset in store.read_input_position().items():
                topic, _, partition = name.rpartition(":")
                positions[TopicPartition(topic, int(partition))] = offset
            if i == 0:
                merged = positions
            else:
                merged = {tp: min(o, positions[tp]) for tp, o in merged.items() if tp in positions}
        self._recorded = dict(merged)
        return merged

    def purge_expired_windows(self) -> int:
        return sum(node.purge(self.context) for node in self._window_nodes)

    def take_outputs(self) -> list:
        outputs, self.context.outputs = self.context.outputs, []
        return outputs

    def close(self) -> None:
        for store in self.stores.values():
            store.close()


def _walk(roots: object) -> list[Node]:
    seen: dict[int, Node] = {}
    stack = list(roots)  # type: ignore[call-overload]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen[id(node)] = node
            stack.extend(node.children)
    return list(seen.values())
