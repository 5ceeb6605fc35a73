"""The ``relay-kafka`` Spark data source: ``spark.read.format("relay-kafka")`` reads a topic
(bounded by the high watermark when the query is planned), ``df.write.format("relay-kafka")``
appends to one. Register it once per session with :func:`register`.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceWriter
from pyspark.sql.types import StructType

from pipeline import kafka
from pipeline.errors import OptionError
from pipeline.options import parse_options
from pipeline.reader import TopicReader, record_schema
from pipeline.writer import TopicWriter, check_columns

FORMAT = "relay-kafka"


class RelayKafkaDataSource(DataSource):
    """Kafka topics as Spark DataFrames, read and written with aiokafka."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return record_schema(parse_options(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return TopicReader(parse_options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError("a topic can only be appended to: use mode('append')")
        check_columns(schema.fieldNames())
        options = parse_options(self.options)
        partitions = kafka.run_sync(kafka.partition_count(options.bootstrap, options.topic))
        return TopicWriter(options, partitions)


def register(spark: SparkSession) -> SparkSession:
    """Make ``format("relay-kafka")`` known to ``spark``."""
    spark.dataSource.register(RelayKafkaDataSource)
    return spark
