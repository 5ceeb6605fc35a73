"""Processor nodes: the steps a record goes through inside a task, from its source node to
sinks, with stateful steps reading and writing the task's stores.

Nodes are built once per topology and shared by its tasks; everything that belongs to one task
(its stores, stream time, outputs, custom processor instances) lives in the
:class:`ProcessorContext` the task passes along with each record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from statestore.record_size import MAX_RECORD_BYTES, check_record_size
from statestore.serdes import MsgPackSerde, Serde, TimestampedSerde
from statestore.store import KeyValueStore
from streams.dsl.errors import TopologyError
from streams.dsl.punctuation import Punctuations, PunctuationType, Schedule
from streams.dsl.windows import HoppingWindows, Windowed, row_key, windowed_key_serde

log = logging.getLogger(__name__)


class MissingKeyError(ValueError):
    """A record without a key reached a step that needs one (an aggregation, a table, a join,
    a repartition): a bad record, dead-lettered like the others."""


def _has_key(node: Node, ctx: ProcessorContext, key: Any, why: str) -> bool:
    """False, and the record noted as bad, when ``key`` is None. The step then drops it and
    the rest of the record's processing goes on (its other outputs, as in Kafka Streams); the
    task dead-letters the input record once that is done."""
    if key is not None:
        return True
    if ctx.missing_key is None:
        ctx.missing_key = MissingKeyError(
            f"{node.name}: the record has no key, and {why} needs one")
    return False


#: The reason a processor drops a record whose window had closed.
DROPPED_LATE = "late"


@dataclass(slots=True)
class Output:
    topic: str
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: Any = ()


class ProcessorContext:
    """What a node sees of the task processing the current record."""

    def __init__(self, task_id: str, stores: dict[str, KeyValueStore]) -> None:
        self.task_id = task_id
        self.stores = stores
        self.outputs: list[Output] = []
        self.topic = ""
        self.partition = -1
        self.offset = -1
        self.timestamp_ms = 0
        self.stream_time_ms = -1
        #: Per windowed aggregation (by node name), the largest timestamp of the records that
        #: reached it: what closes its windows. Records dropped before it (by a filter, say)
        #: do not move it, as in Kafka Streams.
        self.observed_ms: dict[str, int] = {}
        #: Late records dropped since the runtime last took the figure (it resets it).
        self.late_records_dropped = 0
        #: Records the task's processors dropped, by reason, since the task opened.
        self.dropped: dict[str, int] = {}
        #: Windows (node, start) a late record was dropped for: each is logged once.
        self._late_windows: set[tuple[str, int]] = set()
        self.custom: dict[str, Processor] = {}
        #: The headers of the record being processed: forwarded with what it leads to.
        self.headers: Any = ()
        #: The task's punctuation schedules, once a processor scheduled one.
        self.punctuations: Punctuations | None = None
        #: What a node keeps in memory for this task (derived from its stores: rebuilt
        #: after a restart), by node name.
        self.node_state: dict[str, Any] = {}
        #: Wall-clock time in ms (the test driver sets its own).
        self.wall_clock: Callable[[], int] = _wall_clock_ms
        #: Set when a step dropped the current record for want of a key.
        self.missing_key: MissingKeyError | None = None

    def drop_late(self, node: str, store: str, start: int, end: int, grace_ms: int,
                  end_included: bool = False, gap_ms: int | None = None) -> None:
        """Count a record dropped because its window ``[start, end)`` (a session's
        ``[start, end]``: ``end_included``, closed ``gap_ms`` and the grace after its end) had
        closed, and log the first one of each window."""
        self.late_records_dropped += 1
        self.dropped[DROPPED_LATE] = self.dropped.get(DROPPED_LATE, 0) + 1
        if (node, start) in self._late_windows:
            return
        self._late_windows.add((node, start))
        rule = (f"the window's end plus grace ({grace_ms} ms)" if gap_ms is None else
                f"the session's end plus its inactivity gap ({gap_ms} ms) and grace "
                f"({grace_ms} ms)")
        log.warning(
            "task %s: a record of %s dropped as late for %s [%d, %d%s of store %s: its "
            "stream time %d is past %s; later ones for this %s are only counted "
            "(relay_dropped_records_total{reason=\"late\"})",
            self.task_id, self.topic, "window" if gap_ms is None else "session", start, end,
            "]" if end_included else ")", store, self.stream_time_ms, rule,
            "window" if gap_ms is None else "session")

    def forget_late_windows(self, node: str, before_ms: int) -> None:
        """Windows that started before ``before_ms`` are purged: stop remembering them."""
        self._late_windows = {(n, s) for n, s in self._late_windows
                              if n != node or s >= before_ms}

    def store(self, name: str) -> KeyValueStore:
        """The task's store ``name``. A failure of RocksDB itself comes out of it as a
        ``StoreIOError`` (an error of the machine, never dead-lettered); a key or value the
        serdes cannot encode as a ``SerdeError`` (the record's fault)."""
        try:
            return self.stores[name]
        except KeyError:
            raise KeyError(
                f"task {self.task_id} has no store {name!r}; declare it on the processor "
                f"(stores=[...]) or the operation that creates it"
            ) from None

    def send(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        if len(key or b"") + len(value or b"") > MAX_RECORD_BYTES:
            # Refused now, as the current record's error, not by the producer when shipped.
            check_record_size(topic, key, value)
        self.outputs.append(Output(topic, key, value, self.timestamp_ms, self.headers))


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class Node:
    """A processing step. ``process`` handles one record and forwards results to children."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.children: list[Node] = []
        self._preparers: list[Callable[[ProcessorContext, Any, Any], None]] | None = None

    def add_child(self, child: Node) -> Node:
        self.children.append(child)
        # Most steps have one child: forwarding then calls it directly, one Python call
        # less per record and step.
        if len(self.children) == 1:
            self.forward = child.process  # type: ignore[method-assign]
        else:
            self.forward = self._forward_to_all  # type: ignore[method-assign]
        return child

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        self.forward(ctx, key, value)

    def forward(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        """Send a record on to every child (replaced by a direct call when there is one)."""
        self._forward_to_all(ctx, key, value)

    def forward_at(self, ctx: ProcessorContext, key: Any, value: Any, timestamp: int) -> None:
        """Forward a record stamped ``timestamp`` (an aggregate's or a join's own timestamp,
        not the current record's): what the steps below see as its timestamp, and what a
        sink writes."""
        previous = ctx.timestamp_ms
        if timestamp == previous:
            self.forward(ctx, key, value)
            return
        ctx.timestamp_ms = timestamp
        try:
            self.forward(ctx, key, value)
        finally:
            ctx.timestamp_ms = previous

    def _forward_to_all(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        preparers = self._preparers
        if preparers is None:
            preparers = self._preparers = [c.prepare for c in self.children
                                           if hasattr(c, "prepare")]
        # A table update reaching several table-table joins is first recorded by all of
        # them: a join it reaches through another then sees this update, as Kafka Streams'
        # value getters read the table's store, already updated.
        for prepare in preparers:
            prepare(ctx, key, value)
        for child in self.children:
            child.process(ctx, key, value)

    def store_names(self) -> list[str]:
        return []


class SourceNode(Node):
    def __init__(self, name: str, topic: str, key_serde: Serde, value_serde: Serde) -> None:
        super().__init__(name)
        self.topic = topic
        self.key_serde = key_serde
        self.value_serde = value_serde


class FilterNode(Node):
    def __init__(self, name: str, predicate: Callable[[Any, Any], bool]) -> None:
        super().__init__(name)
        self.predicate = predicate

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if self.predicate(key, value):
            self.forward(ctx, key, value)


class MapNode(Node):
    def __init__(self, name: str, fn: Callable[[Any, Any], tuple[Any, Any]]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        new_key, new_value = self.fn(key, value)
        self.forward(ctx, new_key, new_value)


class MapValuesNode(Node):
    def __init__(self, name: str, fn: Callable[[Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        self.forward(ctx, key, self.fn(value))


class FlatMapNode(Node):
    def __init__(self, name: str, fn: Callable[[Any, Any], Iterable[tuple[Any, Any]]]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        pairs = self.fn(key, value)
        if isinstance(pairs, str | bytes):
            # Iterable, but not a list of (key, value) pairs: a str of two-character words
            # would make a record of each.
            raise TypeError(f"{self.name}: the function returned a {type(pairs).__name__} "
                            f"({pairs!r:.40}), not a list of (key, value) pairs: return "
                            f"[(key, value)] for one record")
        for new_key, new_value in pairs:
            self.forward(ctx, new_key, new_value)


class PeekNode(Node):
    def __init__(self, name: str, fn: Callable[[Any, Any], None]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        self.fn(key, value)
        self.forward(ctx, key, value)


class BranchNode(Node):
    """Sends each record to the first branch whose predicate holds (or to none)."""

    def __init__(self, name: str, predicates: list[Callable[[Any, Any], bool]]) -> None:
        super().__init__(name)
        self.predicates = predicates
        self.branches: list[Node] = [Node(f"{name}-{i}") for i in range(len(predicates))]
        self.children = list(self.branches)

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        for predicate, branch in zip(self.predicates, self.branches, strict=True):
            if predicate(key, value):
                branch.process(ctx, key, value)
                return


class SinkNode(Node):
    """Writes records to a topic (also used for repartition topics, which need a key: it picks
    the partition, hence the task, of the stateful step after them)."""

    def __init__(
        self, name: str, topic: str, key_serde: Serde, value_serde: Serde,
        requires_key: bool = False,
    ) -> None:
        super().__init__(name)
        self.topic = topic
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.requires_key = requires_key

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if self.requires_key and not _has_key(self, ctx, key, "repartitioning by key"):
            return
        key_serde = windowed_key_serde(self.key_serde) if isinstance(key, Windowed) else (
            self.key_serde)
        raw_key = None if key is None else key_serde.dumps(key)
        raw_value = None if value is None else self.value_serde.dumps(value)
        ctx.send(self.topic, raw_key, raw_value)


def stamped(stored: Sequence[Any] | None, timestamp: int) -> int:
    """An updated aggregate's timestamp: the larger of the record's and the one stored with
    the aggregate it updates (Kafka Streams' KStreamAggregate, KTableAggregate and their
    windowed and reducing kin); the record's for a new aggregate. A value stored without a
    timestamp (-1) gives the record's."""
    if stored is None:
        return timestamp
    return stored[0] if stored[0] > timestamp else timestamp


class AggregateNode(Node):
    """Aggregates by key into a store and forwards each updated aggregate, stamped with the
    largest timestamp among the records aggregated (kept beside it in the store). Records
    with a None value are skipped (a windowed aggregation takes them: Kafka Streams does
    both)."""

    def __init__(
        self,
        name: str,
        store: str,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
    ) -> None:
        super().__init__(name)
        self.store = store
        self.initializer = initializer
        self.aggregator = aggregator

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if not _has_key(self, ctx, key, "an aggregation"):
            return
        if value is None:
            # A tombstone has nothing to aggregate: skipped, as Kafka Streams does.
            return
        # ctx.store(), stamped() and forward_at() inlined: the counting app's per-record
        # path (the topology declared the store: every task has it).
        store = ctx.stores[self.store]
        stored = store.get_timestamped(key)
        timestamp = ctx.timestamp_ms
        if stored is None:
            current = self.initializer()
        else:
            current = stored[1]
            if stored[0] > timestamp:
                timestamp = stored[0]
        updated = self.aggregator(key, value, current)
        store.put_timestamped(key, updated, timestamp)
        if timestamp == ctx.timestamp_ms:
            self.forward(ctx, key, updated)
        else:
            self.forward_at(ctx, key, updated, timestamp)

    def store_names(self) -> list[str]:
        return [self.store]


class ReduceNode(Node):
    def __init__(self, name: str, store: str, reducer: Callable[[Any, Any], Any]) -> None:
        super().__init__(name)
        self.store = store
        self.reducer = reducer

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if not _has_key(self, ctx, key, "a reduce"):
            return
        if value is None:
            return
        store = ctx.store(self.store)
        stored = store.get_timestamped(key)
        timestamp = stamped(stored, ctx.timestamp_ms)
        updated = value if stored is None else self.reducer(stored[1], value)
        store.put_timestamped(key, updated, timestamp)
        self.forward_at(ctx, key, updated, timestamp)

    def store_names(self) -> list[str]:
        return [self.store]


class WindowedAggregation(Node):
    """What every windowed aggregation shares (time, session and sliding windows): one store,
    its windows, an initializer and an aggregator, and a stream time of its own.

    Its stream time is the largest timestamp among the records that reached it (not those a
    step before it dropped): Kafka Streams' observed stream time.
    """

    def __init__(
        self,
        name: str,
        store: str,
        windows: Any,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
    ) -> None:
        super().__init__(name)
        self.store = store
        self.windows = windows
        self.initializer = initializer
        self.aggregator = aggregator

    def store_names(self) -> list[str]:
        return [self.store]

    def advance_stream_time(self, ctx: ProcessorContext, timestamp: int) -> int:
        """Take ``timestamp`` into this node's stream time; returns the stream time."""
        stream_time = max(ctx.observed_ms.get(self.name, -1), timestamp)
        ctx.observed_ms[self.name] = stream_time
        return stream_time


class WindowAggregateNode(WindowedAggregation):
    """Aggregates by (key, window) into a store keyed ``(key, window_start)``.

    A record whose window closed (end + grace <= stream time) is dropped and counted; windows
    older than the retention are purged as stream time advances.
    """

    windows: HoppingWindows
    #: How long a window is kept past its start, for queries of past windows: the size
    #: plus the grace unless asked for longer (Kafka Streams' ``Materialized.withRetention``).
    retention_ms: int = 0

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if not _has_key(self, ctx, key, "a windowed aggregation"):
            return
        store = ctx.store(self.store)
        timestamp = ctx.timestamp_ms
        stream_time = self.advance_stream_time(ctx, timestamp)
        for start, end in self.windows.windows_for(timestamp):
            if end + self.windows.grace_ms <= stream_time:
                ctx.drop_late(self.name, self.store, start, end, self.windows.grace_ms)
                continue
            stored = store.get_timestamped((key, start))
            stamp = stamped(stored, timestamp)
            updated = self.aggregator(key, value,
                                      self.initializer() if stored is None else stored[1])
            store.put_timestamped((key, start), updated, stamp)
            self.forward_at(ctx, Windowed(key, start, end), updated, stamp)

    def purge(self, ctx: ProcessorContext) -> int:
        """Delete windows past retention; returns how many."""
        horizon = ctx.observed_ms.get(self.name, -1) - max(self.windows.retention_ms,
                                                           self.retention_ms)
        if horizon <= 0:
            return 0
        ctx.forget_late_windows(self.name, horizon - self.windows.size_ms)
        store = ctx.store(self.store)
        expired = [k for k, _ in store.items() if k[1] + self.windows.size_ms <= horizon]
        for key in expired:
            store.delete(key)
        return len(expired)


class TableNode(Node):
    """Materializes a topic as a table: the latest value per key with its record's timestamp
    (Kafka Streams' KTableSource: a foreign-key join stamps its results with it), tombstones
    delete."""

    def __init__(self, name: str, store: str) -> None:
        super().__init__(name)
        self.store = store

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if not _has_key(self, ctx, key, "a table"):
            return
        # None deletes; a windowed table's rows are kept under (key, start, end).
        ctx.store(self.store).put_timestamped(row_key(key), value, ctx.timestamp_ms)
        self.forward(ctx, key, value)

    def store_names(self) -> list[str]:
        return [self.store]


class StreamTableJoinNode(Node):
    """Joins each stream record with the table's current value for its key."""

    def __init__(
        self, name: str, table_store: str, joiner: Callable[[Any, Any], Any], left: bool
    ) -> None:
        super().__init__(name)
        self.table_store = table_store
        self.joiner = joiner
        self.left = left

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if value is None:
            # A tombstone joins nothing, inner or left: dropped, as Kafka Streams does.
            return
        # A left join has an answer without a key (no table value); an inner join has none.
        if not self.left and not _has_key(self, ctx, key, "an inner join"):
            return
        other = None if key is None else ctx.store(self.table_store).get(key)
        if other is None and not self.left:
            return
        self.forward(ctx, key, self.joiner(value, other))


class Processor(Protocol):
    """A custom processor: ``init`` gets its context once per task; ``process`` gets records.

    ``context.store(name)`` opens the stores declared for it; ``context.forward`` sends
    results to the next steps.
    """

    def init(self, context: CustomContext) -> None: ...

    def process(self, key: Any, value: Any) -> None: ...


class CustomContext:
    def __init__(self, node: CustomProcessorNode, ctx: ProcessorContext) -> None:
        self._node = node
        self._ctx = ctx

    def store(self, name: str) -> KeyValueStore:
        if name not in self._node.stores:
            raise UndeclaredStoreError(
                f"processor {self._node.name} did not declare store {name!r} (it declares "
                f"{', '.join(map(repr, self._node.stores)) or 'none'}): pass it in "
                f"process(factory, stores=[...])")
        return self._ctx.store(name)

    def forward(self, key: Any, value: Any, headers: Any = None) -> None:
        """Send a record to the next steps; ``headers`` (a list of ``(str, bytes)``) replace
        the current record's for it."""
        if headers is None:
            self._node.forward(self._ctx, key, value)
            return
        ctx = self._ctx
        previous, ctx.headers = ctx.headers, tuple(headers)
        try:
            self._node.forward(ctx, key, value)
        finally:
            ctx.headers = previous

    def schedule(self, interval_ms: int, type: PunctuationType,
                 callback: Callable[[int], None]) -> Schedule:
        """Call ``callback(time_ms)`` every ``interval_ms`` of stream time or wall-clock time
        (see :mod:`streams.dsl.punctuation`); returns the schedule (``cancel()`` stops it)."""
        ctx = self._ctx
        if ctx.punctuations is None:
            ctx.punctuations = Punctuations()
        return ctx.punctuations.add(self._node.name, interval_ms, type, callback,
                                    ctx.wall_clock())

    @property
    def headers(self) -> tuple[tuple[str, bytes], ...]:
        """The headers of the record being processed, ``(key, value bytes)`` pairs."""
        return tuple(self._ctx.headers or ())

    @property
    def stream_time_ms(self) -> int:
        """The task's stream time: the largest timestamp it has processed."""
        return max(self._ctx.stream_time_ms, self._ctx.timestamp_ms)

    @property
    def timestamp_ms(self) -> int:
        return self._ctx.timestamp_ms

    @property
    def task_id(self) -> str:
        return self._ctx.task_id

    @property
    def topic(self) -> str:
        """The topic of the record being processed."""
        return self._ctx.topic

    @property
    def partition(self) -> int:
        """The partition of the record being processed."""
        return self._ctx.partition

    @property
    def offset(self) -> int:
        """The offset of the record being processed."""
        return self._ctx.offset


class UndeclaredStoreError(TopologyError, KeyError):
    """A processor asked for a store it did not declare: a mistake of the app's code, not of
    a record, so it stops the app (a topology error, exit 4) rather than dead-letter every
    record."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class CustomProcessorNode(Node):
    def __init__(self, name: str, factory: Callable[[], Processor], stores: list[str]) -> None:
        super().__init__(name)
        self.factory = factory
        self.stores = list(stores)
        self._told_of_return = False

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        processor = ctx.custom.get(self.name)
        if processor is None:
            processor = self.instance(ctx)
        returned = processor.process(key, value)
        if returned is not None and not self._told_of_return:
            # A faust agent yields and a Quix function returns its result: here it is lost.
            self._told_of_return = True
            log.warning("processor %s: process() returned %.60r, which goes nowhere; send "
                        "records on with context.forward(key, value)", self.name, returned)

    def instance(self, ctx: ProcessorContext) -> Processor:
        """The task's instance of the processor, made and initialized on first use."""
        processor = ctx.custom.get(self.name)
        if processor is None:
            processor = self.factory()
            processor.init(CustomContext(self, ctx))
            ctx.custom[self.name] = processor
        return processor

    def store_names(self) -> list[str]:
        return list(self.stores)


@dataclass
class StoreDecl:
    """A store a topology declares, with the serdes of its values."""

    name: str
    value_serde: Serde = field(default_factory=MsgPackSerde)

    @classmethod
    def timestamped(cls, name: str) -> StoreDecl:
        """A store whose values carry the timestamp of the record that set them (an
        aggregation's, a table's): reads that want the value alone see it alone."""
        return cls(name, TimestampedSerde())


def walk_nodes(roots: Iterable[Node]) -> list[Node]:
    """Every node reachable from ``roots``, each once."""
    seen: dict[int, Node] = {}
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen[id(node)] = node
            stack.extend(node.children)
    return list(seen.values())
