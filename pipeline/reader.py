"""Reading a Kafka topic into Spark: the plan (one offset range per topic partition, split when
large) and the reader that fetches one range with aiokafka inside a Spark task.

The plan is fixed on the driver: every range ends at an offset known when the query was
planned (the high watermark at that time, or the requested end), so a read is a bounded,
repeatable batch even while producers keep writing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pipeline import kafka
from pipeline.errors import OffsetRangeError
from pipeline.options import TopicOptions
from statestore.serdes import Serde, serde_from_name

BATCH_RECORDS = 20_000


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Records ``start <= offset < end`` of one topic partition: one Spark partition."""

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        # InputPartition keeps a ``value``; Spark only pickles the object.
        object.__setattr__(self, "value", (self.topic, self.partition, self.start, self.end))

    @property
    def count(self) -> int:
        return self.end - self.start


def _decoded_type(serde: str | None) -> Any:
    # Decoded keys and values have no fixed type: bytes stay binary, text is a string and
    # structured serdes (msgpack, json, ordered) become JSON text.
    return BinaryType() if serde in (None, "bytes") else StringType()


def record_schema(options: TopicOptions) -> StructType:
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType([
        StructField("key", _decoded_type(options.key_serde)),
        StructField("value", _decoded_type(options.value_serde)),
        StructField("topic", StringType(), nullable=False),
        StructField("partition", IntegerType(), nullable=False),
        StructField("offset", LongType(), nullable=False),
        StructField("timestamp", TimestampType()),
        StructField("headers", ArrayType(header)),
    ])


async def plan_ranges(options: TopicOptions) -> list[OffsetRange]:
    """Check the requested offsets against the topic and cut them into ranges."""
    partitions = await kafka.partition_count(options.bootstrap, options.topic)
    for name, requested in (("startingOffsets", options.starting_offsets),
                            ("endingOffsets", options.ending_offsets)):
        unknown = sorted(p for p in requested or {} if p >= partitions)
        if unknown:
            raise OffsetRangeError(
                f"{name} names partition(s) {unknown} but topic {options.topic!r} has "
                f"{partitions} partitions (0..{partitions - 1})"
            )
    bounds = await kafka.offset_bounds(options.bootstrap, options.topic, range(partitions))
    ranges: list[OffsetRange] = []
    for partition, (log_start, high_watermark) in sorted(bounds.items()):
        start = (options.starting_offsets or {}).get(partition, log_start)
        end = (options.ending_offsets or {}).get(partition, high_watermark)
        where = f"{options.topic}[{partition}]"
        if start < log_start or start > high_watermark:
            raise OffsetRangeError(
                f"starting offset {start} of {where} is out of range: the partition holds "
                f"offsets {log_start}..{high_watermark} (end exclusive)"
            )
        if end > high_watermark:
            raise OffsetRangeError(
                f"ending offset {end} of {where} is past the partition's end {high_watermark}"
            )
        if end < start:
            raise OffsetRangeError(f"{where}: ending offset {end} is before starting {start}")
        split = options.max_records_per_split
        for offset in range(start, end, split):
            ranges.append(OffsetRange(options.topic, partition, offset, min(end, offset + split)))
    return ranges


class TopicReader(DataSourceReader):
    """Plans the offset ranges on the driver and reads each one in a Spark task."""

    def __init__(self, options: TopicOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[OffsetRange]:
        ranges = kafka.run_sync(plan_ranges(self.options))
        # Spark needs at least one partition; an empty one reads nothing.
        return ranges or [OffsetRange(self.options.topic, 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        if partition.count <= 0:
            return
        to_arrow = _ArrowBatches(self.options, self.schema)
        for records in kafka.read_range(
            self.options.bootstrap, partition.topic, partition.partition, partition.start,
            partition.end, BATCH_RECORDS,
        ):
            yield to_arrow(records)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=_json_fallback)


def _json_fallback(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    return repr(value)


class _ArrowBatches:
    """Turns aiokafka records into Arrow record batches of the data source's schema."""

    def __init__(self, options: TopicOptions, schema: StructType) -> None:
        self._key = _decoder(options.key_serde)
        self._value = _decoder(options.value_serde)
        self._arrow_schema = pa.schema([
            ("key", pa.binary() if isinstance(schema["key"].dataType, BinaryType)
             else pa.string()),
            ("value", pa.binary() if isinstance(schema["value"].dataType, BinaryType)
             else pa.string()),
            pa.field("topic", pa.string(), nullable=False),
            pa.field("partition", pa.int32(), nullable=False),
            pa.field("offset", pa.int64(), nullable=False),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        ])

    def __call__(self, records: list[Any]) -> pa.RecordBatch:
        key, value = self._key, self._value
        columns = [
            [None if r.key is None else key(r.key) for r in records],
            [None if r.value is None else value(r.value) for r in records],
            [r.topic for r in records],
            [r.partition for r in records],
            [r.offset for r in records],
            [r.timestamp * 1000 if r.timestamp is not None and r.timestamp >= 0 else None
             for r in records],
            [[{"key": k, "value": v} for k, v in r.headers] if r.headers else []
             for r in records],
        ]
        return pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(columns, self._arrow_schema, strict=True)],
            schema=self._arrow_schema,
        )


def _decoder(serde_name: str | None) -> Any:
    if serde_name is None or serde_name == "bytes":
        return bytes
    serde: Serde = serde_from_name(serde_name)
    loads = serde.loads
    return lambda raw: _text(loads(raw))
