"""A topology test driver: runs an app's topology in one process, with no broker.

Pipe records (keys, values, timestamps) into the app's source topics, read what it wrote to
its output topics and what its stores hold. The driver runs the runtime's own code: the
sub-topologies and partition counts ``App.prepare`` computes, one :class:`StreamTask` per
task with its RocksDB stores in a temporary state directory, the same processors, serdes,
dead-lettering and input positions. Topics are in-memory logs; a record written to a topic the
app reads (an internal repartition topic, say) is fed to the sub-topology that reads it, so a
multi-stage app runs end to end on one call.

    with TopologyTestDriver(app) as driver:
        driver.pipe("lines", None, "a b a", timestamp_ms=1_000)
        assert driver.read_key_value_map("word-totals") == {"a": 2, "b": 1}
        assert driver.store("word-counts")["a"] == 2

Records are partitioned as a broker's producers do: by the murmur2 hash of the key's encoded
bytes, over the topic's partition count (a record without a key goes round robin).

By default (``partition_order="sequential"``) each piped record is processed at once, with
everything it leads to, so records reach every task in the order they were piped. On a
broker, tasks run their partitions at their own pace: the records a re-keyed stream writes to
its repartition topic arrive out of timestamp order, and a windowed aggregation after it may
drop some as late. ``partition_order="interleaved"`` shows that: piped records wait in their
partitions, and :meth:`flush` (called by every read) processes them the way busy tasks can,
partition by partition in runs of random length (``seed`` makes it repeatable).

What it does not run: the group, rebalances, restoration over the network, commits to a
broker. Those need the real runtime and a broker.
"""

from __future__ import annotations

import itertools
import random
import shutil
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import ConsumerRecord

from statestore.record_size import truncated_payload
from statestore.serdes import BytesSerde, Serde, serde_from_name
from statestore.store import KeyValueStore, changelog_topic_name
from streams.dsl.processors import SinkNode, walk_nodes
from streams.dsl.topology import SubTopology, Topology
from streams.runtime.global_tables import GlobalTables
from streams.runtime.task import RecordError, StreamTask, open_task_stores

if TYPE_CHECKING:
    from streams.app import App

_CREATE_TIME = 0
_partitioner = DefaultPartitioner()


@dataclass(frozen=True)
class TestRecord:
    """A record read from a topic, decoded with the topic's serdes."""

    __test__ = False  # not a pytest test class

    key: Any
    value: Any
    timestamp_ms: int
    topic: str
    partition: int
    offset: int
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class DeadLetter:
    """A bad record the app sent to its dead-letter topic, and why."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    stage: str
    error: str
    #: The topology step whose code raised (``filter-0003``), when a step's did.
    step: str | None = None
    #: For a record that could not be deserialized: ``"key"`` or ``"value"``.
    part: str | None = None


@dataclass
class _Log:
    """One topic: its records in the order written, each with its partition and offset."""

    partitions: int
    records: list[ConsumerRecord] = field(default_factory=list)
    next_offsets: dict[int, int] = field(default_factory=dict)
    read: int = 0


class TopologyTestDriver:
    """Runs ``app``'s topology (an :class:`~streams.app.App` or a
    :class:`~streams.dsl.topology.Topology`) without a broker.

    ``partitions``: the partition count of the app's source and output topics, one count for
    all or a mapping per topic (1 for those it does not name); a topic declared with
    ``app.topic(name, partitions=N)`` has N. ``state_dir``: where the stores live (a
    temporary directory, deleted on :meth:`close`, by default). ``on_error``: what a bad record
    does, ``dead_letter`` or ``stop`` (raise its :class:`RecordError`); the app's setting by
    default. ``partition_order``: ``sequential`` (each record processed as it is piped) or
    ``interleaved`` (processed at :meth:`flush`, partitions in random runs of at most
    ``max_run`` records, drawn with ``seed``).
    """

    __test__ = False

    def __init__(
        self,
        app: App | Topology,
        *,
        partitions: int | Mapping[str, int] = 1,
        state_dir: Path | str | None = None,
        on_error: str | None = None,
        partition_order: str = "sequential",
        seed: int | None = None,
        max_run: int = 500,
    ) -> None:
        if partition_order not in ("sequential", "interleaved"):
            raise ValueError(f"partition_order must be 'sequential' or 'interleaved', not "
                             f"{partition_order!r}")
        if max_run < 1:
            raise ValueError(f"max_run must be >= 1, not {max_run}")
        self.partition_order = partition_order
        self._rng = random.Random(seed)
        self._max_run = max_run
        #: Interleaved: records waiting to be processed, per (topic, partition).
        self._queued: dict[tuple[str, int], deque[ConsumerRecord]] = {}
        config = getattr(app, "config", None)
        self.topology: Topology = app if isinstance(app, Topology) else app.topology
        self.application_id = self.topology.application_id
        self.on_error = on_error or (config.on_error if config is not None else "dead_letter")
        if self.on_error not in ("dead_letter", "stop"):
            raise ValueError(f"on_error must be 'dead_letter' or 'stop', not {self.on_error!r}")
        self.dead_letter_topic = (config.dead_letters if config is not None
                                  else f"{self.application_id}-dead-letters")
        self._partitions = partitions
        self.subs: list[SubTopology] = self.topology.sub_topologies()
        if not self.subs:
            raise ValueError("the app declares no streams or tables: nothing to run")
        external = {t for s in self.subs for t in s.sources
                    if t not in self.topology.repartition_topics}
        counts = {t: self._count_of(t) for t in external}
        repartition = self.topology.assign_partitions(self.subs, counts, self._count_of(""))
        self._logs: dict[str, _Log] = {
            t: _Log(n) for t, n in (counts | repartition).items()
        }
        self._sub_of_topic = {t: s for s in self.subs for t in s.sources}
        self._sinks = {n.topic: n for n in walk_nodes(self.topology.sources)
                       if isinstance(n, SinkNode)}
        self._changelogs: dict[tuple[str, int], list[tuple[bytes, bytes | None]]] = {}
        self._round_robin = itertools.count()
        self._dead_letters: list[DeadLetter] = []
        #: The timestamp of records piped without one.
        self.clock_ms = 0
        #: The wall-clock time processors see (``advance_wall_clock`` moves it).
        self.wall_clock_ms = 0
        self.tasks: dict[str, StreamTask] = {}
        self._closed = False
        self._own_state_dir = state_dir is None
        self.state_dir = Path(tempfile.mkdtemp(prefix="relay-driver-") if state_dir is None
                              else state_dir)
        #: The app's global tables, by topic: what is piped to the topic goes into them.
        self._global = {t.topic: t for t in getattr(app, "global_tables", [])}
        try:
            if self._global:
                self._global_tables = GlobalTables(list(self._global.values()))
                self._global_tables.open(self.state_dir, self.application_id)
            self._open_tasks(from_changelog=False)
        except BaseException:
            self.close()
            raise

    # -- input -------------------------------------------------------------------------------

    def pipe(
        self,
        topic: str,
        key: Any,
        value: Any,
        *,
        timestamp_ms: int | None = None,
        partition: int | None = None,
        headers: Iterable[tuple[str, bytes]] = (),
    ) -> None:
        """Write one record to a source topic (with the topic's serdes) and process it and
        everything it leads to. Without ``timestamp_ms`` the record has :attr:`clock_ms`;
        without ``partition`` the producer's default partitioner picks it from the key."""
        source: Any = self._global.get(topic) or self._source(topic)
        raw_key = None if key is None else source.key_serde.dumps(key)
        raw_value = None if value is None else source.value_serde.dumps(value)
        self.pipe_raw(topic, raw_key, raw_value, timestamp_ms=timestamp_ms,
                      partition=partition, headers=headers)

    def pipe_raw(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        timestamp_ms: int | None = None,
        partition: int | None = None,
        headers: Iterable[tuple[str, bytes]] = (),
    ) -> None:
        """Like :meth:`pipe` with the key and value already encoded (to test bad input)."""
        self._check_open("pipe")
        if topic in self._global:
            self._global[topic].apply_or_skip(key, value, f"{topic} (piped)")
            return
        self._source(topic)
        timestamp = self.clock_ms if timestamp_ms is None else timestamp_ms
        record = self._append(topic, key, value, timestamp, partition, tuple(headers))
        if self.partition_order == "interleaved":
            self._queue(record)
        else:
            self._run(deque([record]))

    def flush(self) -> None:
        """Interleaved: process every waiting record, and what they lead to, a partition at
        a time in runs of random length (as tasks that fetch and process at their own pace
        do); sequential: nothing waits. Reads call it first."""
        while True:
            waiting = sorted(k for k, q in self._queued.items() if q)
            if not waiting:
                return
            records = self._queued[self._rng.choice(waiting)]
            for _ in range(self._rng.randint(1, self._max_run)):
                if not records:
                    break
                for written in self._process(records.popleft()):
                    self._queue(written)

    @property
    def dead_letters(self) -> list[DeadLetter]:
        """The bad records sent to the dead-letter topic so far, and why."""
        self.flush()
        return self._dead_letters

    def pipe_all(self, topic: str, records: Iterable[tuple[Any, ...]]) -> None:
        """Pipe ``(key, value)`` or ``(key, value, timestamp_ms)`` tuples in order."""
        for record in records:
            key, value = record[0], record[1]
            timestamp = record[2] if len(record) > 2 else None
            self.pipe(topic, key, value, timestamp_ms=timestamp)

    def advance_stream_time(self, to_ms: int) -> None:
        """Move every task's stream time (and :attr:`clock_ms`) to at least ``to_ms``, as if a
        record that late had reached each task, then purge the windows past retention as the
        runtime does at a commit. Windows that closed no longer accept records."""
        self._check_open("advance_stream_time")
        self.flush()
        self.clock_ms = max(self.clock_ms, to_ms)
        for task in self.tasks.values():
            task.context.stream_time_ms = max(task.context.stream_time_ms, to_ms)
            task.advance_window_stream_time(to_ms)
            task.purge_expired_windows()
            task.record_input_position()
            self._drain_changelogs(task)

    def advance_wall_clock(self, now_ms: int) -> None:
        """Fire every task's wall-clock punctuations due at ``now_ms`` (as the stream
        thread's loop does with the clock), and process what they lead to."""
        self._check_open("advance_wall_clock")
        self.wall_clock_ms = now_ms
        pending: deque[ConsumerRecord] = deque()
        for task in self.tasks.values():
            task.punctuate(now_ms)
            pending.extend(self._ship(task))
        self._run(pending)

    # -- output ------------------------------------------------------------------------------

    def read_output(
        self, topic: str, key_serde: str | Serde | None = None,
        value_serde: str | Serde | None = None,
    ) -> list[TestRecord]:
        """The records written to ``topic`` since the last read of it, in the order written,
        decoded with the given serdes, else the topic's declared ones, else those of the
        operation that wrote it (msgpack by default; ``windowed`` reads windowed keys).
        A topic the app neither reads nor writes (a misspelt name, say) is a ``ValueError``."""
        self.flush()
        log = self._logs.get(topic)
        if log is None:
            if topic not in self._sinks and topic != self.dead_letter_topic:
                written = sorted(t for t in self._sinks
                                 if t not in self.topology.repartition_topics)
                raise ValueError(f"the app neither reads nor writes topic {topic!r}; "
                                 f"it writes {written}")
            return []
        keys, values = self._serdes_for(topic, key_serde, value_serde)
        records, log.read = log.records[log.read:], len(log.records)
        return [
            TestRecord(
                None if r.key is None else keys.loads(r.key),
                None if r.value is None else values.loads(r.value),
                r.timestamp, r.topic, r.partition, r.offset, tuple(r.headers),
            )
            for r in records
        ]

    def read_key_values(self, topic: str, key_serde: str | Serde | None = None,
                        value_serde: str | Serde | None = None) -> list[tuple[Any, Any]]:
        """``(key, value)`` of the records :meth:`read_output` returns."""
        return [(r.key, r.value) for r in self.read_output(topic, key_serde, value_serde)]

    def read_key_value_map(self, topic: str, key_serde: str | Serde | None = None,
                           value_serde: str | Serde | None = None) -> dict[Any, Any]:
        """The latest value per key of the records :meth:`read_output` returns; a None value
        deletes its key. List keys (msgpack arrays) become tuples."""
        latest: dict[Any, Any] = {}
        for key, value in self.read_key_values(topic, key_serde, value_serde):
            key = tuple(key) if isinstance(key, list) else key
            if value is None:
                latest.pop(key, None)
            else:
                latest[key] = value
        return latest

    def store(self, name: str) -> StoreView:
        """What the store ``name`` holds, across all the tasks that have it."""
        self._check_open("store")
        self.flush()
        stores = [task.stores[name] for _, task in sorted(self.tasks.items())
                  if name in task.stores]
        stores += [t.opened for t in self._global.values() if t.store == name and t.opened]
        if not stores:
            known = sorted([*self.topology.stores, *(t.store for t in self._global.values())])
            raise KeyError(f"the app has no store {name!r}; stores: {known}")
        return StoreView(name, stores)

    def changelog(self, store: str) -> list[tuple[bytes, bytes | None]]:
        """Every changelog record the store ``store`` wrote, encoded, all partitions."""
        self.flush()
        topic = changelog_topic_name(self.application_id, store)
        return [r for (t, _), records in sorted(self._changelogs.items()) if t == topic
                for r in records]

    @property
    def late_records_dropped(self) -> int:
        """Records dropped because their window had closed, over all tasks."""
        self.flush()
        return sum(task.context.late_records_dropped for task in self.tasks.values())

    def partitions_of(self, topic: str) -> int:
        """The partition count the driver gives ``topic``."""
        log = self._logs.get(topic)
        return log.partitions if log is not None else self._count_of(topic)

    # -- lifecycle ---------------------------------------------------------------------------

    def commit(self) -> None:
        """What the runtime does at a commit: purge expired windows, then flush every store
        and write its checkpoint."""
        self._check_open("commit")
        self.flush()
        for task in self.tasks.values():
            task.purge_expired_windows()
            task.record_input_position()
            self._drain_changelogs(task)
            for store in task.stores.values():
                store.commit()

    def restart(self, *, from_changelog: bool = False) -> None:
        """Commit, close every task and open it again, as a clean restart of the app does:
        stores reopen from their checkpoints (or, with ``from_changelog``, are wiped and
        restored from the changelog records they wrote), and each task takes its input
        position and stream time back from its state."""
        self.commit()
        for task in self.tasks.values():
            task.close()
        self.tasks = {}
        self._open_tasks(from_changelog=from_changelog)

    def close(self) -> None:
        self._closed = True
        for task in self.tasks.values():
            task.close()
        self.tasks = {}
        for table in self._global.values():
            if table.opened is not None:
                table.opened.close()
                table.opened = None
        if self._own_state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> TopologyTestDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ------------------------------------------------------------------------------

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise RuntimeError(f"{call}() on a closed TopologyTestDriver: call it inside the "
                               f"driver's with-block (what it wrote stays readable after)")

    def _count_of(self, topic: str) -> int:
        declared = self.topology.topics.get(topic)
        if declared is not None and declared.partitions is not None:
            return declared.partitions
        if isinstance(self._partitions, Mapping):
            return int(self._partitions.get(topic, 1))
        return int(self._partitions)

    def _open_tasks(self, from_changelog: bool) -> None:
        for sub in self.subs:
            for task_id in sub.task_ids():
                if from_changelog:
                    shutil.rmtree(self.state_dir / self.application_id / task_id,
                                  ignore_errors=True)
                stores = open_task_stores(sub, task_id, self.application_id, self.state_dir)
                if from_changelog:
                    for store in stores.values():
                        self._restore(store)
                task = StreamTask(task_id, sub, stores)
                task.context.wall_clock = lambda: self.wall_clock_ms
                task.processed.update(task.restored_input_position())
                self.tasks[task_id] = task

    def _restore(self, store: KeyValueStore) -> None:
        assert store.changelog_topic is not None
        records = self._changelogs.get((store.changelog_topic, store.partition), [])
        store.apply_restore_batch(records, len(records))

    def _source(self, topic: str) -> Any:
        sub = self._sub_of_topic.get(topic)
        if sub is None or topic in self.topology.repartition_topics:
            readable = sorted(t for t in self._sub_of_topic
                              if t not in self.topology.repartition_topics)
            raise ValueError(f"the app does not read topic {topic!r}; it reads {readable}")
        return sub.sources[topic]

    def _log(self, topic: str) -> _Log:
        log = self._logs.get(topic)
        if log is None:
            log = self._logs[topic] = _Log(self._count_of(topic))
        return log

    def _append(
        self, topic: str, key: bytes | None, value: bytes | None, timestamp_ms: int,
        partition: int | None, headers: tuple[tuple[str, bytes], ...] = (),
    ) -> ConsumerRecord:
        log = self._log(topic)
        if partition is None:
            partitions = list(range(log.partitions))
            partition = (_partitioner(key, partitions, partitions) if key is not None
                         else next(self._round_robin) % log.partitions)
        elif not 0 <= partition < log.partitions:
            raise ValueError(f"topic {topic} has partitions 0..{log.partitions - 1}, "
                             f"not {partition}")
        offset = log.next_offsets.get(partition, 0)
        log.next_offsets[partition] = offset + 1
        record = ConsumerRecord(
            topic=topic, partition=partition, offset=offset, timestamp=timestamp_ms,
            timestamp_type=_CREATE_TIME, key=key, value=value, checksum=None,
            serialized_key_size=-1 if key is None else len(key),
            serialized_value_size=-1 if value is None else len(value), headers=headers,
        )
        log.records.append(record)
        return record

    def _queue(self, record: ConsumerRecord) -> None:
        self._queued.setdefault((record.topic, record.partition), deque()).append(record)

    def _run(self, pending: deque[ConsumerRecord]) -> None:
        while pending:
            pending.extend(self._process(pending.popleft()))

    def _process(self, record: ConsumerRecord) -> list[ConsumerRecord]:
        """Run one record through its task; returns what it wrote to topics the app reads."""
        task = self.tasks[f"{self._sub_of_topic[record.topic].id}_{record.partition}"]
        try:
            task.process(record)
        except RecordError as error:
            if self.on_error == "stop":
                raise
            self._dead_letter(error)
        # What a record's processing wrote before it failed is shipped, as the runtime
        # ships a batch's outputs.
        return self._ship(task)

    def _ship(self, task: StreamTask) -> list[ConsumerRecord]:
        """Write the task's outputs to their topics; returns those the app reads."""
        written_inputs: list[ConsumerRecord] = []
        for output in task.take_outputs():
            written = self._append(output.topic, output.key, output.value,
                                   output.timestamp_ms, None, tuple(output.headers or ()))
            if output.topic in self._sub_of_topic:
                written_inputs.append(written)
        task.record_input_position()
        self._drain_changelogs(task)
        return written_inputs

    def _dead_letter(self, error: RecordError) -> None:
        record = error.record
        self._dead_letters.append(DeadLetter(
            record.topic, record.partition, record.offset, record.key, record.value,
            error.stage, f"{type(error.cause).__name__}: {error.cause}", error.step,
            error.part,
        ))
        key, value, cut = truncated_payload(record.key, record.value)
        self._append(self.dead_letter_topic, key, value, record.timestamp, 0,
                     tuple(error.dead_letter_headers() + cut))

    def _drain_changelogs(self, task: StreamTask) -> None:
        for store in task.stores.values():
            records = store.drain_changelog()
            if store.changelog_topic is None or not records:
                continue
            log = self._changelogs.setdefault((store.changelog_topic, store.partition), [])
            log.extend(records)
            store.acknowledged(len(log), len(records))

    def _serdes_for(self, topic: str, key_serde: str | Serde | None,
                    value_serde: str | Serde | None) -> tuple[Serde, Serde]:
        if topic == self.dead_letter_topic:
            fallback: tuple[Serde, Serde] = (BytesSerde(), BytesSerde())
        elif topic in self._sinks:
            fallback = (self._sinks[topic].key_serde, self._sinks[topic].value_serde)
        elif topic in self._sub_of_topic:
            source = self._sub_of_topic[topic].sources[topic]
            fallback = (source.key_serde, source.value_serde)
        else:
            fallback = self.topology.serdes_for(topic, None, None)
        declared = self.topology.topics.get(topic)
        keys = key_serde or (declared and declared.key_serde) or fallback[0]
        values = value_serde or (declared and declared.value_serde) or fallback[1]
        return serde_from_name(keys), serde_from_name(values)


class StoreView:
    """A store's contents across tasks, read-only: ``view[key]``, ``get``, ``in``, ``items``."""

    def __init__(self, name: str, stores: list[KeyValueStore]) -> None:
        self.name = name
        self._stores = stores

    def get(self, key: Any, default: Any = None) -> Any:
        for store in self._stores:
            value = store.get(key)
            if value is not None:
                return value
        return default

    def __getitem__(self, key: Any) -> Any:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: Any) -> bool:
        return any(key in store for store in self._stores)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every entry, task by task, each task's in key order."""
        for store in self._stores:
            yield from store.items()

    def keys(self) -> Iterator[Any]:
        return (key for key, _ in self.items())

    def __iter__(self) -> Iterator[Any]:
        return self.keys()

    def __len__(self) -> int:
        return sum(1 for _ in self.items())

    def to_dict(self) -> dict[Any, Any]:
        return dict(self.items())
