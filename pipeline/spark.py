"""Starting a Spark session for the pipeline: Python workers run this interpreter (so they see
Relay and its dependencies) and the ``relay-kafka`` data source is registered."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from pipeline.datasource import register


def spark_session(master: str = "local[*]", app_name: str = "relay-pipeline",
                  shuffle_partitions: int | None = None) -> SparkSession:
    # Without this Spark starts workers with whatever `python3` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.sql.session.timeZone", "UTC")
    )
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return register(spark)


def active_spark_session() -> SparkSession | None:
    """The Spark session this thread of the process already runs, with the ``relay-kafka``
    data source registered; None when there is none."""
    running = SparkSession.getActiveSession()
    return register(running) if running is not None else None
