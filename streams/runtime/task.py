"""A stream task: one partition of one sub-topology, with its stores.

A record goes: source topic -> :meth:`StreamTask.process` (deserialize with the source's
serdes) -> processor nodes -> stores (changelog records queued) and outputs (sink records
queued). The stream thread ships what was queued and commits; the task remembers the next
offset of each input partition it processed, which is what gets committed and where a kept
partition resumes after a rebalance. It drops records below that offset, so a batch fetched
before a rebalance sought its partition back is never processed twice.

A bad record (one that cannot be deserialized, or whose processing raises) is a
:class:`RecordError`, dead-lettered by the caller. An error of the machine (an ``OSError``, a
store that cannot be written, memory) is not: it propagates unchanged and the record does not
count as processed, so the runtime stops without committing past it.

With its input position the task keeps its stream time in its stores' state, so that windows
closed before a restart stay closed after it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.partitioner import murmur2
from aiokafka.structs import ConsumerRecord, TopicPartition

from assignor.model import parse_task_id
from statestore.errors import StateStoreError
from statestore.recovery import open_task_store
from statestore.snapshot import SnapshotSettings
from statestore.store import KeyValueStore, StoreSpec, changelog_topic_name, store_directory
from streams.dsl.processors import (
    CustomProcessorNode,
    MissingKeyError,
    Node,
    ProcessorContext,
    SourceNode,
    UndeclaredStoreError,
    WindowAggregateNode,
    walk_nodes,
)
from streams.dsl.punctuation import POSITION_PREFIX as PUNCTUATION_PREFIX
from streams.dsl.punctuation import Punctuations, PunctuationType
from streams.dsl.topology import SubTopology
from streams.runtime.partition_group import PartitionGroup

log = logging.getLogger(__name__)


class RecordError(Exception):
    """A record could not be deserialized or processed; carries where it came from."""

    def __init__(self, stage: str, record: ConsumerRecord, cause: BaseException,
                 index: int = 0, part: str | None = None) -> None:
        #: The topology step whose code raised, when a step's did.
        self.step = raising_step(cause)
        #: For a record that could not be deserialized: ``"key"`` or ``"value"``.
        self.part = part
        where = f" in step {self.step}" if self.step else ""
        if part is not None:
            raw = record.key if part == "key" else record.value
            where += f" (its {part}, {len(raw or b'')} bytes)"
        super().__init__(
            f"{stage} failed for {record.topic}[{record.partition}]@{record.offset}{where}: "
            f"{type(cause).__name__}: {cause}"
        )
        self.stage = stage
        self.record = record
        self.cause = cause
        #: The record's place in the batch it was processed in.
        self.index = index

    def dead_letter_headers(self) -> list[tuple[str, bytes]]:
        """The headers a dead-lettered record carries: what failed, where it came from."""
        record = self.record
        # An error's text can quote the whole record: keep it a header's size.
        error = f"{type(self.cause).__name__}: {self.cause}"[:MAX_ERROR_CHARS]
        return [
            ("relay.error", error.encode()),
            ("relay.stage", self.stage.encode()),
            ("relay.topic", record.topic.encode()),
            ("relay.partition", str(record.partition).encode()),
            ("relay.offset", str(record.offset).encode()),
            *([("relay.step", self.step.encode())] if self.step else []),
            *([("relay.part", self.part.encode())] if self.part else []),
        ]


def failed_part(record: ConsumerRecord, loads_key: Any) -> str:
    """Which part of a record that could not be deserialized failed: its key is read first,
    so it is the value when the key reads. Asked only once a record failed, so that reading
    one costs nothing more."""
    try:
        if record.key is not None:
            loads_key(record.key)
    except Exception:
        return "key"
    return "value"


def raising_step(error: BaseException) -> str | None:
    """The name of the innermost topology step the error's traceback passes through: the
    step whose function (a user's filter, joiner, aggregator) raised. Read off the traceback
    once an error happened, so that processing a record pays nothing for it."""
    step = None
    frame = error.__traceback__
    while frame is not None:
        owner = frame.tb_frame.f_locals.get("self")
        if isinstance(owner, Node):
            step = owner.name
        frame = frame.tb_next
    return step


#: What the ``relay.error`` header keeps of an error's text.
MAX_ERROR_CHARS = 2_000

#: Errors of the machine, the runtime or the app's code, never of a record: they propagate
#: as they are (every record would meet them).
MACHINE_ERRORS = (OSError, MemoryError, StateStoreError, UndeclaredStoreError)

#: One input record in this many is checked against its partition at a stateful task.
MISROUTE_SAMPLE = 128


def partition_of(key: bytes, partitions: int) -> int:
    """The partition Kafka's Java clients (and Relay's producers) put ``key`` in."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def drop_reason(error: RecordError) -> str:
    """Why a dead-lettered record was dropped: it could not be read, it had no key where
    one is needed, or processing it raised."""
    if error.stage == "deserialize":
        return "deserialize"
    if isinstance(error.cause, MissingKeyError):
        return "no_key"
    return "error"


#: The entry of a store's input position that holds the task's stream time (topic entries
#: are ``"topic:partition"``, and a topic name cannot hold ``:``).
STREAM_TIME_ENTRY = "stream-time"
#: The prefix of the entries holding each windowed aggregation's own stream time,
#: ``"stream-time@<node name>"``.
NODE_STREAM_TIME_PREFIX = f"{STREAM_TIME_ENTRY}@"


@dataclass(frozen=True)
class TaskCounts:
    """What one task counted since the metrics last took its counts."""

    task: str
    dropped: dict[str, int]  # reason -> records
    misrouted: int
    #: Records fetched again that the task had processed already (a seek back after a
    #: rollback or a rebalance), passed over so that none counts twice.
    skipped: int


def task_counts(tasks: Iterable[StreamTask]) -> list[TaskCounts]:
    """What each task dropped (by reason), saw misrouted and skipped as already processed
    since the last call, for the metrics."""
    return [task.take_counts() for task in tasks]


def status_figures(tasks: Iterable[StreamTask]) -> dict[str, dict[str, Any]]:
    """What a member publishes of its tasks' drops for the web view: ``dropped`` (task ->
    reason -> records since the task opened here) and ``misrouted`` (task -> records)."""
    tasks = list(tasks)
    return {
        "dropped": {t.task_id: dict(t.context.dropped) for t in tasks if t.context.dropped},
        "misrouted": {t.task_id: t.misrouted for t in tasks if t.misrouted},
    }


def open_task_stores(
    sub: SubTopology, task_id: str, application_id: str, state_dir: Path,
    snapshots: SnapshotSettings | None = None, *, bulk_load: bool = False,
) -> dict[str, KeyValueStore]:
    """Open (lock, check checkpoints, bootstrap from snapshots) every store of a task; not
    restored yet. ``bulk_load``: opened for restoration (see ``KeyValueStore.open``)."""
    partition = parse_task_id(task_id)[1]
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
        self.partition = parse_task_id(task_id)[1]
        self.stores = stores
        self.context = ProcessorContext(task_id, stores)
        self.sources: dict[str, SourceNode] = dict(sub.sources)
        self.partitions = [TopicPartition(t, self.partition) for t in sorted(sub.sources)]
        #: Fetched records waiting for their turn across the task's partitions.
        self.inputs = PartitionGroup(self.partitions)
        # Next offset to process per input partition; what is committed.
        self.processed: dict[TopicPartition, int] = {}
        self.records_processed = 0
        #: When the task started running here (monotonic seconds): its first records say
        #: how long it took from then to processing.
        self.started_at = time.monotonic()
        #: Records dropped because they were at or below the processed position.
        self.records_skipped = 0
        self._recorded: dict[TopicPartition, int] = {}
        self._recorded_stream_time = -1
        #: The key of each input partition in ``processed``, made once.
        self._partition_keys: dict[tuple[str, int], TopicPartition] = {}
        # Every node whose store holds windows to drop past retention.
        nodes = walk_nodes(sub.sources.values())
        self._window_nodes = [n for n in nodes
                              if isinstance(n, WindowAggregateNode) or hasattr(n, "purge")]
        self._custom_nodes = [n for n in nodes if isinstance(n, CustomProcessorNode)]
        #: Sampled input records whose key hashes to another partition than they came from.
        self.misrouted = 0
        #: Stateful tasks check keys against partitions (a wrong partitioner upstream);
        #: hashing costs more than processing, so one record in MISROUTE_SAMPLE is checked.
        self._misroute_partitions = sub.partitions if sub.stateful and sub.partitions > 1 else 0
        self._until_misroute_check = 0
        self._reported: dict[str, int] = {}
        self._reported_misrouted = 0
        self._reported_skipped = 0

    def process(self, record: ConsumerRecord) -> bool:
        """Run one record through the topology; False if it was already processed (dropped).

        Raises :class:`RecordError` on bad input; the record then counts as processed (it goes
        to the dead-letter topic instead). A machine error propagates as it is and the record
        does not count as processed.
        """
        return self.process_batch((record,)) == 1

    def process_batch(self, records: Sequence[ConsumerRecord]) -> int:
        """Run ``records`` through the topology in order, each as :meth:`process` would;
        returns how many ran (the others were at or below the processed position: dropped).

        A :class:`RecordError` stops the batch; its ``index`` is the bad record's place in
        ``records`` (it and those before it are done, the caller goes on after it)."""
        processed = self.processed
        sources = self.sources
        ctx = self.context
        ran = 0
        tp: TopicPartition | None = None
        topic, partition = "", -1
        # Per record, only what changes: the partition's key is looked up once per run of
        # records from one partition (a fetch's batch is one partition's).
        try:
            for index, record in enumerate(records):
                if record.partition != partition or record.topic != topic:
                    topic, partition = record.topic, record.partition
                    tp = self._partition_keys.get((topic, partition))
                    if tp is None:
                        tp = self._partition_keys[(topic, partition)] = TopicPartition(
                            topic, partition)
                    source = sources[topic]
                    loads_key, loads_value = source.key_serde.loads, source.value_serde.loads
                offset = record.offset
                if offset < processed.get(tp, -1):
                    self.records_skipped += 1
                    continue
                try:
                    raw = record.key
                    key = None if raw is None else loads_key(raw)
                    raw = record.value
                    value = None if raw is None else loads_value(raw)
                except Exception as exc:
                    processed[tp] = offset + 1  # type: ignore[index]
                    raise RecordError("deserialize", record, exc, index,
                                      failed_part(record, loads_key)) from exc
                timestamp = record.timestamp
                ctx.topic, ctx.partition, ctx.offset = topic, partition, offset
                ctx.timestamp_ms = timestamp
                ctx.headers = record.headers
                try:
                    source.process(ctx, key, value)
                    if ctx.missing_key is not None:
                        raise ctx.missing_key
                except MACHINE_ERRORS:
                    ctx.missing_key = None
                    raise
                except Exception as exc:
                    ctx.missing_key = None
                    processed[tp] = offset + 1  # type: ignore[index]
                    if timestamp > ctx.stream_time_ms:
                        ctx.stream_time_ms = timestamp
                    raise RecordError("process", record, exc, index) from exc
                processed[tp] = offset + 1  # type: ignore[index]
                # The record's timestamp, or what the source's timestamp extractor made of it.
                timestamp = ctx.timestamp_ms
                if timestamp > ctx.stream_time_ms:
                    ctx.stream_time_ms = timestamp
                ran += 1
                if self._misroute_partitions:
                    self._until_misroute_check -= 1
                    if self._until_misroute_check < 0:
                        self._until_misroute_check = MISROUTE_SAMPLE - 1
                        self._check_partition(record)
        finally:
            if ran and not self.records_processed:
                log.info("task %s: first records processed %.2fs after it started", self.task_id,
                         time.monotonic() - self.started_at)
            self.records_processed += ran
        if ctx.punctuations is not None:
            ctx.punctuations.fire(ctx, PunctuationType.STREAM_TIME, ctx.stream_time_ms)
        return ran

    def punctuate(self, now_ms: int | None = None) -> int:
        """Fire the wall-clock punctuations due at ``now_ms`` (the clock by default); the
        stream thread's loop calls it. Custom processors are set up first, so that they
        schedule theirs before any record reaches them. Returns how many fired."""
        ctx = self.context
        if not self._custom_nodes:
            return 0
        if len(ctx.custom) < len(self._custom_nodes):
            for node in self._custom_nodes:
                node.instance(ctx)
        if ctx.punctuations is None:
            return 0
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return ctx.punctuations.fire(ctx, PunctuationType.WALL_CLOCK_TIME, now)
    def _check_partition(self, record: ConsumerRecord) -> None:
        if record.key is None:
            return
        expected = partition_of(record.key, self._misroute_partitions)
        if expected == record.partition:
            return
        self.misrouted += 1
        if self.misrouted == 1:
            log.warning(
                "task %s: a record of %s[%d]@%d has a key that murmur2 places in partition "
                "%d: its producer does not partition as Kafka's Java clients do, so this "
                "task's state misses that key's other records and queries for it miss (use "
                "the murmur2 partitioner, e.g. partitioner=murmur2_random in confluent-kafka; "
                "relay_misrouted_records_total counts such records, one in %d checked; "
                "logged once per task)", self.task_id, record.topic, record.partition,
                record.offset, expected, MISROUTE_SAMPLE)

    def take_counts(self) -> TaskCounts:
        """Records dropped (by reason), misrouted and skipped since the last call."""
        dropped = {reason: n - self._reported.get(reason, 0)
                   for reason, n in self.context.dropped.items()
                   if n > self._reported.get(reason, 0)}
        self._reported = dict(self.context.dropped)
        misrouted, self._reported_misrouted = (self.misrouted - self._reported_misrouted,
                                               self.misrouted)
        skipped, self._reported_skipped = (self.records_skipped - self._reported_skipped,
                                           self.records_skipped)
        return TaskCounts(self.task_id, dropped, misrouted, skipped)

    def record_input_position(self) -> None:
        """Write the input offsets processed so far and the stream time into every store,
        with the data."""
        stream_time = self.context.stream_time_ms
        if not self.stores or (self.processed == self._recorded
                               and stream_time == self._recorded_stream_time):
            return
        position = {f"{tp.topic}:{tp.partition}": offset for tp, offset in self.processed.items()}
        if stream_time >= 0:
            position[STREAM_TIME_ENTRY] = stream_time
        if self.context.punctuations is not None:
            position.update(self.context.punctuations.positions())
        for node, observed in self.context.observed_ms.items():
            position[NODE_STREAM_TIME_PREFIX + node] = observed
        for store in self.stores.values():
            store.write_input_position(position)
        self._recorded = dict(self.processed)
        self._recorded_stream_time = stream_time

    def restored_input_position(self) -> dict[TopicPartition, int]:
        """The input offsets every store's restored state reflects (the smallest per input);
        also takes the stream time back from the state."""
        merged: dict[TopicPartition, int] = {}
        stream_times: list[int] = []
        punctuations: dict[str, int] = {}
        observed: dict[str, list[int]] = {}
        for i, store in enumerate(self.stores.values()):
            positions = {}
            for name, offset in store.read_input_position().items():
                if name == STREAM_TIME_ENTRY:
                    stream_times.append(offset)
                    continue
                if name.startswith(PUNCTUATION_PREFIX):
                    entry = name[len(PUNCTUATION_PREFIX):]
                    punctuations[entry] = min(offset, punctuations.get(entry, offset))
                    continue
                if name.startswith(NODE_STREAM_TIME_PREFIX):
                    observed.setdefault(name[len(NODE_STREAM_TIME_PREFIX):], []).append(offset)
                    continue
                topic, _, partition = name.rpartition(":")
                positions[TopicPartition(topic, int(partition))] = offset
            if i == 0:
                merged = positions
            else:
                merged = {tp: min(o, positions[tp]) for tp, o in merged.items() if tp in positions}
        self._recorded = dict(merged)
        if punctuations:
            if self.context.punctuations is None:
                self.context.punctuations = Punctuations()
            self.context.punctuations.restored.update(punctuations)
        if stream_times:
            # Like the offsets, the stream time of the state that is furthest behind.
            self.context.stream_time_ms = max(self.context.stream_time_ms, min(stream_times))
        for node in self._window_nodes:
            restore_times = getattr(node, "restore_times", None)
            if restore_times is not None:
                restore_times(self.context, observed)  # a node keeping times of its own
                continue
            # State written before windowed aggregations kept their own time has the task's.
            times = observed.get(node.name) or (stream_times if stream_times else [-1])
            if min(times) >= 0:
                self.context.observed_ms[node.name] = max(
                    self.context.observed_ms.get(node.name, -1), min(times))
        self._recorded_stream_time = self.context.stream_time_ms
        return merged

    @property
    def stream_time_ms(self) -> int:
        """The largest record timestamp this task has processed (-1 before any)."""
        return self.context.stream_time_ms

    def advance_window_stream_time(self, to_ms: int) -> None:
        """Move every windowed aggregation's stream time to at least ``to_ms``."""
        observed = self.context.observed_ms
        for node in self._window_nodes:
            if not hasattr(node, "restore_times"):  # not a node keeping times of its own
                observed[node.name] = max(observed.get(node.name, -1), to_ms)

    def purge_expired_windows(self) -> int:
        return sum(node.purge(self.context) for node in self._window_nodes)

    def take_outputs(self) -> list:
        outputs, self.context.outputs = self.context.outputs, []
        return outputs

    def close(self) -> None:
        for store in self.stores.values():
            store.close()



def punctuate_all(tasks: Iterable[StreamTask]) -> None:
    """Fire the due wall-clock punctuations of ``tasks`` (the stream thread's loop)."""
    now_ms = int(time.time() * 1000)
    for task in tasks:
        task.punctuate(now_ms)
