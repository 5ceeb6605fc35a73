"""The broker tier's shared Spark: one local session per xdist worker for every test that
builds with Spark (the pipeline tests and the snapshot benchmark's smoke test, which share a
worker under ``--dist loadgroup``, see tests/conftest.py). A JVM start is the dearest thing
these tests do, so there is one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: One core and two shuffle partitions: the tests' data sets are a few thousand records, and
#: the machine's other core runs the rest of the suite.
SPARK_MASTER = "local[1]"
SHUFFLE_PARTITIONS = 2
#: Every Spark driver the tests start (this process's, and the `relay snapshot build` they run
#: in a subprocess) compiles with the JVM's quick compiler alone: a third less CPU for a
#: session that lives a minute over small data.
os.environ.setdefault("PYSPARK_SUBMIT_ARGS",
                      "--driver-java-options -XX:TieredStopAtLevel=1 pyspark-shell")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pipeline.spark import spark_session

    session = spark_session(SPARK_MASTER, "relay-pipeline-tests",
                            shuffle_partitions=SHUFFLE_PARTITIONS)
    yield session
    session.stop()
