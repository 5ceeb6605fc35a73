"""The relay-kafka data source against the real broker: exact records over partitions and
offset ranges (split or not), decoding with the runtime's serdes, clear errors for bad
input, and a writer that partitions keys like the runtime's producer. Local Spark."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgpack
import pytest
from aiokafka import AIOKafkaProducer
from pyspark.sql import DataFrame, SparkSession

from pipeline.kafka import produce
from pipeline.writer import write_topic
from tests.broker.pipeline.conftest import create_topic

pytestmark = pytest.mark.broker
PARTITIONS = 3
# (partition, key, value, headers): null keys and values (tombstones) and headers included.
RECORDS = [
    (i % PARTITIONS, None if i % 11 == 0 else f"k{i}".encode(),
     None if i % 13 == 2 else msgpack.packb({"i": i}), [("n", str(i).encode())] if i % 5 == 0
     else [])
    for i in range(90)
]


@pytest.fixture(scope="module")
def topic(bootstrap: str) -> str:
    import uuid

    name = f"source-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, name, PARTITIONS)
    asyncio.run(produce(bootstrap, name, RECORDS))
    return name


def read(spark: SparkSession, bootstrap: str, topic: str, **options: str) -> DataFrame:
    reader = spark.read.format("relay-kafka").option("bootstrap.servers", bootstrap)
    return reader.option("topic", topic).options(**options).load()


def by_position() -> dict[tuple[int, int], tuple[bytes | None, bytes | None, list]]:
    """The produced records by (partition, offset): offsets count up per partition."""
    positions: dict[tuple[int, int], tuple[bytes | None, bytes | None, list]] = {}
    next_offset = dict.fromkeys(range(PARTITIONS), 0)
    for partition, key, value, headers in RECORDS:
        positions[(partition, next_offset[partition])] = (key, value, headers)
        next_offset[partition] += 1
    return positions


def rows(df: DataFrame) -> dict[tuple[int, int], tuple[bytes | None, bytes | None, list]]:
    return {
        (r.partition, r.offset): (r.key, r.value, [(h.key, h.value) for h in r.headers])
        for r in df.collect()
    }


def test_reads_exactly_the_topic(spark: SparkSession, bootstrap: str, topic: str) -> None:
    df = read(spark, bootstrap, topic)
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "headers"]
    assert df.rdd.getNumPartitions() == PARTITIONS
    assert rows(df) == by_position()
    assert df.count() == len(RECORDS)
    assert {r.topic for r in df.select("topic").collect()} == {topic}
    assert df.where("timestamp is null").count() == 0

    split = read(spark, bootstrap, topic, maxRecordsPerSplit="7")
    assert split.rdd.getNumPartitions() == PARTITIONS * 5  # 30 records per partition, by 7
    assert rows(split) == by_position()


def test_reads_offset_ranges(spark: SparkSession, bootstrap: str, topic: str) -> None:
    df = read(spark, bootstrap, topic, startingOffsets='{"0": 5, "2": 29}',
              endingOffsets='{"0": 12, "1": 3}', maxRecordsPerSplit="4")
    expected = {
        pos: record for pos, record in by_position().items()
        if (pos[0] == 0 and 5 <= pos[1] < 12) or (pos[0] == 1 and pos[1] < 3)
        or (pos[0] == 2 and pos[1] >= 29)
    }
    assert rows(df) == expected
    empty = read(spark, bootstrap, topic, startingOffsets='{"0": 30, "1": 30, "2": 30}')
    assert empty.count() == 0


def test_decodes_with_the_runtime_serdes(spark: SparkSession, bootstrap: str,
                                         topic: str) -> None:
    df = read(spark, bootstrap, topic, keySerde="str", valueSerde="msgpack",
              endingOffsets='{"0": 3, "1": 0, "2": 0}')
    assert [(r.key, r.value) for r in df.orderBy("offset").collect()] == [
        (None, '{"i": 0}'), ("k3", '{"i": 3}'), ("k6", '{"i": 6}')]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": '{"0": 31}'}, "starting offset 31 of {topic}[0] is out of range"),
        ({"endingOffsets": '{"1": 99}'}, "ending offset 99 of {topic}[1] is past the "
                                         "partition's end 30"),
        ({"startingOffsets": '{"2": 9}', "endingOffsets": '{"2": 4}'},
         "ending offset 4 is before starting 9"),
        ({"startingOffsets": '{"7": 0}'}, "names partition(s) [7] but topic '{topic}' has 3"),
        ({"startingOffsets": "[1, 2]"}, "must be a JSON object of partition -> offset"),
        ({"maxRecordsPerSplit": "0"}, "maxRecordsPerSplit must be an integer >= 1"),
        ({"valueSerde": "yaml"}, "unknown serde 'yaml'"),
        ({"topic": "no-such-topic"}, "topic 'no-such-topic' does not exist"),
        ({"bootstrap.servers": "127.0.0.1:1"}, "cannot reach the broker at 127.0.0.1:1"),
    ],
    ids=["start", "end", "reversed", "partition", "json", "split", "serde", "topic", "broker"],
)
def test_bad_reads_are_clear_errors(spark: SparkSession, bootstrap: str, topic: str,
                                    options: dict[str, str], message: str) -> None:
    settings = {"bootstrap.servers": bootstrap, "topic": topic} | options
    with pytest.raises(Exception) as raised:
        spark.read.format("relay-kafka").options(**settings).load().collect()
    assert message.format(topic=topic) in str(raised.value)


def runtime_partitions(bootstrap: str, topic: str, keys: list[bytes]) -> dict[bytes, int]:
    """Where the runtime's producer (aiokafka, no explicit partition) puts each key."""

    async def send() -> dict[bytes, int]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            sent = [await producer.send(topic, key=k, value=b"x") for k in keys]
            return {k: (await f).partition for k, f in zip(keys, sent, strict=True)}
        finally:
            await producer.stop()

    return asyncio.run(send())


def test_writer_partitions_keys_like_the_runtime(
    spark: SparkSession, bootstrap: str, unique: Callable[[str], str]
) -> None:
    reference, target, via_format = unique("ref"), unique("sink"), unique("sink-fmt")
    for name in (reference, target, via_format):
        create_topic(bootstrap, name, 4)
    users = [f"user-{i}" for i in range(40)]
    expected = runtime_partitions(bootstrap, reference,
                                  [msgpack.packb(u) for u in users])
    df = spark.createDataFrame([(u, i) for i, u in enumerate(users)], "key string, value int")

    counts = write_topic(df, bootstrap, target, key_serde="msgpack", value_serde="msgpack")
    assert sum(counts.values()) == len(users)
    (df.write.format("relay-kafka").mode("append").option("bootstrap.servers", bootstrap)
     .option("topic", via_format).option("keySerde", "msgpack").option("valueSerde", "msgpack")
     .save())

    for name in (target, via_format):
        written = read(spark, bootstrap, name).collect()
        assert {r.key: r.partition for r in written} == expected
        assert sorted(msgpack.unpackb(r.value) for r in written) == list(range(len(users)))


def test_writer_refuses_unknown_topic_and_unencodable_columns(
    spark: SparkSession, bootstrap: str, unique: Callable[[str], str]
) -> None:
    df = spark.createDataFrame([("a", 1)], "key string, value int")
    with pytest.raises(Exception, match="topic 'no-such-sink' does not exist"):
        write_topic(df, bootstrap, "no-such-sink")
    sink = unique("sink")
    create_topic(bootstrap, sink, 2)
    with pytest.raises(Exception, match="column value holds int; give valueSerde"):
        write_topic(df, bootstrap, sink)
    with pytest.raises(Exception, match="a topic can only be appended to"):
        (df.write.format("relay-kafka").mode("overwrite").option("bootstrap.servers", bootstrap)
         .option("topic", sink).save())
    assert read(spark, bootstrap, sink).count() == 0
