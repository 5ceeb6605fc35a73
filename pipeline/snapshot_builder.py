"""The snapshot builder: a store's latest state per task, computed with Spark, written as one
sorted SST file and a manifest per task (see :mod:`statestore.snapshot` for the format and
how stores bootstrap from it).

Input is either the store's changelog (read through the ``relay-kafka`` data source, up to the
high watermark when the build starts) or any DataFrame of keys and values, e.g. history kept in
Parquet. Spark keeps the last record per (partition, key) by offset order, drops tombstones,
and sorts each partition's keys; each Spark task then streams its sorted rows into SST files,
so no task holds a whole partition in memory. The output directory must be reachable from
every executor (local mode, or a shared file system).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgpack
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType
from rocksdict import Options, SstFileWriter

from pipeline import kafka
from pipeline.datasource import FORMAT
from pipeline.errors import OptionError, PipelineError
from statestore.serdes import Serde, serde_from_name
from statestore.snapshot import (
    SST_FILE,
    SnapshotManifest,
    file_sha256,
    snapshot_directory,
    write_manifest,
)
from statestore.store import INPUT_POSITION_KEY, RESERVED_PREFIX, changelog_topic_name

ENCODED = StructType([
    StructField("partition", IntegerType(), nullable=False),
    StructField("key", BinaryType(), nullable=False),
    StructField("value", BinaryType()),
    StructField("offset", LongType()),
])


@dataclass(frozen=True)
class SnapshotTarget:
    """Which store the snapshot is for and where it goes."""

    app: str
    store: str
    out_dir: Path
    #: The sub-topology whose tasks own the store (task ids are ``<sub-topology>_<partition>``).
    subtopology: int = 0
    key_serde: str = "ordered"
    value_serde: str = "msgpack"

    @property
    def changelog(self) -> str:
        return changelog_topic_name(self.app, self.store)

    def task(self, partition: int) -> str:
        return f"{self.subtopology}_{partition}"

    def directory(self, partition: int) -> Path:
        return snapshot_directory(self.out_dir, self.app, self.store, self.task(partition))


def build_from_changelog(
    spark: SparkSession, bootstrap: str, target: SnapshotTarget, *,
    max_records_per_split: int = 500_000,
) -> list[SnapshotManifest]:
    """Snapshot every partition of the store's changelog as it is now."""
    partitions = kafka.run_sync(kafka.partition_count(bootstrap, target.changelog))
    bounds = kafka.run_sync(kafka.offset_bounds(bootstrap, target.changelog, range(partitions)))
    # Fixed now, so the snapshot covers exactly these offsets whatever is written meanwhile.
    ends = {partition: end for partition, (_, end) in bounds.items()}
    df = (
        spark.read.format(FORMAT)
        .option("bootstrap.servers", bootstrap)
        .option("topic", target.changelog)
        .option("endingOffsets", _json_offsets(ends))
        .option("maxRecordsPerSplit", str(max_records_per_split))
        .load()
        .where(F.col("key").isNotNull())
        .select("partition", "key", "value", "offset")
    )
    return _build(df, target, "changelog", ends)


def build_from_dataframe(
    df: DataFrame, target: SnapshotTarget, *, partitions: int | None = None,
    order_column: str = "offset", partition_key_serde: str = "msgpack",
    input_offsets: dict[str, dict[int, int]] | None = None,
) -> list[SnapshotManifest]:
    """Snapshot a DataFrame of ``key`` and ``value`` (null value: deleted).

    Keys and values that are not binary are encoded with the store's serdes. Rows are ordered
    by ``order_column`` (the last one per key wins); without that column every key must occur
    once per partition. A ``partition`` column says which task a key belongs to; without it,
    ``partitions`` is required and a key goes where the runtime's partitioner puts it (its
    topic encoding is ``partition_key_serde``, msgpack like the DSL's default).

    ``input_offsets`` (input topic -> partition -> next offset) says which input the history
    already reflects: each task's snapshot then carries it as the store's input position, and
    the task resumes its input there instead of processing those records again.
    """
    missing = {"key", "value"} - set(df.columns)
    if missing:
        raise OptionError(f"the DataFrame needs columns key and value; missing {sorted(missing)}")
    has_partition = "partition" in df.columns
    if not has_partition and partitions is None:
        raise OptionError("the DataFrame has no partition column: give the partition count")
    if partitions is not None and partitions < 1:
        raise OptionError(f"partitions must be >= 1, not {partitions}")
    has_order = order_column in df.columns
    columns = ["key", "value"] + (["partition"] if has_partition else [])
    columns += [order_column] if has_order else []
    encode = _RowEncoder(target, partitions, partition_key_serde, has_order, order_column)
    # Reserved keys cannot come from a DataFrame: the input position is given explicitly.
    rows = df.select(*columns).rdd.map(encode).filter(
        lambda row: not row[1].startswith(RESERVED_PREFIX))
    encoded = rows.toDF(ENCODED)
    positions = _input_positions(input_offsets or {}, partitions)
    if positions:
        encoded = encoded.unionByName(df.sparkSession.createDataFrame(positions, ENCODED))
    offsets = dict.fromkeys(range(partitions), 0) if partitions else {}
    return _build(encoded, target, "dataframe", offsets, dedupe=has_order)


def _input_positions(input_offsets: dict[str, dict[int, int]], partitions: int | None
                     ) -> list[tuple[int, bytes, bytes, int]]:
    """One input position row per task, encoded like ``KeyValueStore.write_input_position``,
    ordered after every history row."""
    per_task: dict[int, dict[str, int]] = {}
    for topic, by_partition in input_offsets.items():
        for partition, offset in by_partition.items():
            if partition < 0 or offset < 0 or (partitions is not None
                                               and partition >= partitions):
                raise OptionError(f"input offset {topic}[{partition}] = {offset} is not a "
                                  f"partition and offset of this store's tasks")
            per_task.setdefault(int(partition), {})[f"{topic}:{partition}"] = int(offset)
    return [(p, INPUT_POSITION_KEY, msgpack.packb(position), 2**62)
            for p, position in sorted(per_task.items())]


@dataclass
class _RowEncoder:
    """Runs in Spark tasks: a row as (partition, encoded key, encoded value, order)."""

    target: SnapshotTarget
    partitions: int | None
    partition_key_serde: str
    has_order: bool
    order_column: str
    _serdes: tuple[Serde, Serde, Serde] | None = field(default=None, repr=False)

    def __call__(self, row: Any) -> tuple[int, bytes, bytes | None, int | None]:
        if self._serdes is None:
            self._serdes = (serde_from_name(self.target.key_serde),
                            serde_from_name(self.target.value_serde),
                            serde_from_name(self.partition_key_serde))
        store_keys, values, topic_keys = self._serdes
        fields = row.asDict()
        key, value = fields["key"], fields["value"]
        if key is None:
            raise PipelineError("a snapshot row has no key")
        is_raw = isinstance(key, bytes | bytearray)
        raw_key = bytes(key) if is_raw else store_keys.dumps(_key(key))
        if value is None or isinstance(value, bytes | bytearray):
            raw_value = None if value is None else bytes(value)
        else:
            raw_value = values.dumps(_plain(value))
        if fields.get("partition") is not None:
            partition = int(fields["partition"])
        else:
            # Where the runtime would send the record: its key as the input topic encodes it.
            plain_key = store_keys.loads(raw_key) if is_raw else _key(key)
            partition = kafka.partition_for(topic_keys.dumps(plain_key), self.partitions or 1)
        if self.partitions is not None and not 0 <= partition < self.partitions:
            raise PipelineError(f"partition {partition} is outside 0..{self.partitions - 1}")
        order = _order(fields[self.order_column]) if self.has_order else None
        return partition, raw_key, raw_value, order


def _plain(value: Any) -> Any:
    """A Spark struct as a dict (values are encoded by the store's value serde)."""
    return value.asDict(recursive=True) if hasattr(value, "asDict") else value


def _key(value: Any) -> Any:
    """A Spark struct or array as a tuple: ordered keys are scalars or tuples of them."""
    if isinstance(value, tuple | list):
        return tuple(_key(item) for item in value)
    return value


def _order(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1_000_000)
    return int(value)


def _json_offsets(offsets: dict[int, int]) -> str:
    return "{" + ", ".join(f'"{p}": {o}' for p, o in sorted(offsets.items())) + "}"


def _build(
    df: DataFrame, target: SnapshotTarget, source: str, offsets: dict[int, int],
    dedupe: bool = True,
) -> list[SnapshotManifest]:
    if dedupe:
        # max over (offset, value) structs: the value of each key's highest offset.
        df = (
            df.groupBy("partition", "key")
            .agg(F.max(F.struct("offset", "value")).alias("last"))
            .select("partition", "key", F.col("last.value").alias("value"))
        )
    live = df.where(F.col("value").isNotNull()).select("partition", "key", "value")
    tasks = max(1, len(offsets) or live.rdd.getNumPartitions())
    ordered = live.repartitionByRange(tasks, "partition").sortWithinPartitions("partition", "key")
    writer = _SstWriter(target, source, offsets, created_ms=int(time.time() * 1000))
    written = {m["partition"]: SnapshotManifest(**m)
               for m in ordered.rdd.mapPartitions(writer).collect()}
    # Partitions with no live key still get a manifest: their offset is worth knowing.
    for partition in sorted(set(offsets) - set(written)):
        directory = target.directory(partition)
        (directory / SST_FILE).unlink(missing_ok=True)
        written[partition] = writer.manifest(partition, 0, None)
        write_manifest(directory, written[partition])
    return [written[p] for p in sorted(written)]


@dataclass
class _SstWriter:
    """Runs in a Spark task: streams sorted rows into one SST file per topic partition."""

    target: SnapshotTarget
    source: str
    offsets: dict[int, int]
    created_ms: int

    def manifest(self, partition: int, records: int, sha256: str | None) -> SnapshotManifest:
        return SnapshotManifest(
            app=self.target.app, store=self.target.store, task=self.target.task(partition),
            partition=partition, changelog=self.target.changelog,
            offset=self.offsets.get(partition, 0), records=records, sha256=sha256,
            source=self.source, key_serde=self.target.key_serde,
            value_serde=self.target.value_serde, created_ms=self.created_ms,
        )

    def __call__(self, rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
        current: int | None = None
        sst: SstFileWriter | None = None
        path = Path()
        previous: bytes | None = None
        count = 0
        for partition, key, value in rows:
            key = bytes(key)
            if partition != current:
                if sst is not None and current is not None:
                    yield self._finish(current, sst, path, count)
                current, sst, previous, count = partition, None, None, 0
            if previous is not None and key <= previous:
                raise PipelineError(
                    f"partition {partition}: key {key!r} occurs twice (give the DataFrame an "
                    f"order column so the latest one wins) or rows are out of order"
                )
            if sst is None:
                path = self.target.directory(partition) / f"{SST_FILE}.{os.getpid()}.tmp"
                path.parent.mkdir(parents=True, exist_ok=True)
                sst = SstFileWriter(options=Options(raw_mode=True))
                sst.open(str(path))
            sst[key] = bytes(value)
            previous = key
            count += 1
        if sst is not None and current is not None:
            yield self._finish(current, sst, path, count)

    def _finish(self, partition: int, sst: SstFileWriter, path: Path, count: int
                ) -> dict[str, Any]:
        sst.finish()
        final = path.parent / SST_FILE
        os.replace(path, final)
        manifest = self.manifest(partition, count, file_sha256(final))
        write_manifest(final.parent, manifest)
        return asdict(manifest)

