"""Writing a DataFrame into a Kafka topic, partitioned the way the runtime partitions.

A stream app reads a record's key in the task of the partition the producer's default
partitioner (murmur2 of the serialized key) picks, which is what every sink and repartition
topic of the runtime uses; the writer picks partitions with that same function so that records
written from Spark land in the task that owns their key. Records without a key go to a random
partition, like the runtime's.

Columns: ``key`` and ``value`` (binary, or any type when ``keySerde`` / ``valueSerde`` name the
serde that encodes it; strings without a serde are UTF-8), optional ``headers``
(array of struct<key string, value binary>). Other columns are ignored.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage

from pipeline import kafka
from pipeline.errors import OptionError
from pipeline.options import TopicOptions
from statestore.serdes import serde_from_name

KafkaRecord = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]] | None]


@dataclass
class WrittenCounts(WriterCommitMessage):
    """Records written per partition by one Spark task."""

    per_partition: dict[int, int]


def _encoder(serde_name: str | None, column: str) -> Any:
    if serde_name is not None:
        return serde_from_name(serde_name).dumps

    def raw(value: Any) -> bytes:
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        if isinstance(value, str):
            return value.encode()
        raise OptionError(
            f"column {column} holds {type(value).__name__}; give {column}Serde "
            f"(e.g. msgpack) to encode it, or cast it to binary or string"
        )

    return raw


def kafka_records(
    rows: Iterable[Any], options: TopicOptions, partitions: int
) -> Iterator[KafkaRecord]:
    """``(partition, key, value, headers)`` for each row, partitioned like the runtime."""
    encode_key = _encoder(options.key_serde, "key")
    encode_value = _encoder(options.value_serde, "value")
    for row in rows:
        fields = row.asDict() if hasattr(row, "asDict") else dict(row)
        key = fields.get("key")
        value = fields.get("value")
        raw_key = None if key is None else encode_key(key)
        raw_value = None if value is None else encode_value(value)
        partition = (random.randrange(partitions) if raw_key is None
                     else kafka.partition_for(raw_key, partitions))
        headers = [(h["key"], bytes(h["value"]) if h["value"] is not None else b"")
                   for h in fields.get("headers") or []]
        yield partition, raw_key, raw_value, headers


def check_columns(columns: Iterable[str]) -> None:
    if not {"key", "value"} & set(columns):
        raise OptionError("the DataFrame to write needs a key or a value column (or both)")


class TopicWriter(DataSourceWriter):
    """``df.write.format("relay-kafka")``: each Spark task produces its rows."""

    def __init__(self, options: TopicOptions, partitions: int) -> None:
        self.options = options
        self.partitions = partitions

    def write(self, iterator: Iterator[Any]) -> WrittenCounts:
        records = kafka_records(iterator, self.options, self.partitions)
        counts = kafka.run_sync(kafka.produce(self.options.bootstrap, self.options.topic, records))
        return WrittenCounts(counts)


def write_topic(
    df: DataFrame, bootstrap: str, topic: str, *, key_serde: str | None = None,
    value_serde: str | None = None,
) -> dict[int, int]:
    """Produce ``df`` into ``topic`` (which must exist); returns the records per partition."""
    check_columns(df.columns)
    options = TopicOptions(bootstrap, topic, key_serde, value_serde)
    for serde in (key_serde, value_serde):
        if serde is not None:
            serde_from_name(serde)
    partitions = kafka.run_sync(kafka.partition_count(bootstrap, topic))

    def produce_partition(rows: Iterator[Any]) -> Iterator[dict[int, int]]:
        records = kafka_records(rows, options, partitions)
        yield kafka.run_sync(kafka.produce(options.bootstrap, options.topic, records))

    totals: dict[int, int] = {}
    for counts in df.rdd.mapPartitions(produce_partition).collect():
        for partition, count in counts.items():
            totals[partition] = totals.get(partition, 0) + count
    return dict(sorted(totals.items()))
