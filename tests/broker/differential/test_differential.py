"""Relay's DSL against Kafka Streams: random topologies and inputs, run through Relay's
topology test driver and through Kafka Streams' (the oracle, caching off), must write the same
records, in the same order, to every output topic (one partition each, as Kafka Streams'
driver has).

Where Relay differs on purpose the comparison maps the encodings (docs/kafka-streams.md):
keys and values are msgpack on Relay's side and longs on the oracle's, a windowed key is
``[key, start, end]`` on both after decoding. Keys, values and timestamps are compared on
every output.

``DIFFERENTIAL_EXAMPLES`` sets how many examples to run (default sized for the test
suite's budget); ``DIFFERENTIAL_FAMILIES`` which families of topologies to draw.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from streams import TopologyTestDriver
from tests.broker.differential.oracle import Oracle
from tests.broker.differential.topologies import records, topologies
from tests.broker.differential.vocabulary import build_app, output_topics

EXAMPLES = int(os.environ.get("DIFFERENTIAL_EXAMPLES", "150"))
#: Which topology families to draw (all by default): e.g. ``streams,tables`` to check the
#: aggregations and table joins alone.
FAMILIES = os.environ.get("DIFFERENTIAL_FAMILIES", "streams,tables,stream-joins")


MEMORY_FS = Path("/dev/shm")


@contextlib.contextmanager
def state_dir() -> Iterator[str]:
    """A fresh state directory, in memory where the machine has one: RocksDB syncs its files
    as it opens and closes a store, which costs more than the example on a disk."""
    base = MEMORY_FS if MEMORY_FS.is_dir() and os.access(MEMORY_FS, os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="relay-differential-", dir=base) as path:
        yield path


def run_relay(topology: dict[str, Any], inputs: list[dict[str, Any]]
              ) -> dict[str, list[list[Any]]]:
    with state_dir() as path, TopologyTestDriver(build_app(topology), state_dir=path) as driver:
        for r in inputs:
            driver.pipe(r["topic"], r["key"], r["value"], timestamp_ms=r["timestamp"])
        return {topic: [[r.key, r.value, r.timestamp_ms] for r in driver.read_output(topic)]
                for topic in output_topics(topology)}


def assert_same(topology: dict[str, Any], inputs: list[dict[str, Any]],
                relay: dict[str, list[list[Any]]], kafka: dict[str, list[list[Any]]]) -> None:
    for topic in output_topics(topology):
        ours, theirs = relay.get(topic, []), kafka.get(topic, [])
        if ours != theirs:
            first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False))
                          if a != b), min(len(ours), len(theirs)))
            raise AssertionError(
                f"{topic}: Relay and Kafka Streams differ at output {first} "
                f"(Relay {ours[first:first + 3]}, Kafka Streams {theirs[first:first + 3]}; "
                f"{len(ours)} against {len(theirs)} records)\n"
                f"topology: {json.dumps(topology)}\ninputs: {json.dumps(inputs)}\n"
                f"Relay: {ours}\nKafka Streams: {theirs}")


@settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_relay_writes_what_kafka_streams_writes(oracle: Oracle, data: st.DataObject) -> None:
    topology = data.draw(topologies(FAMILIES), label="topology")
    inputs = data.draw(records(topology), label="records")
    for step in topology["steps"]:  # counted in --hypothesis-show-statistics
        event(step["op"] + (f" {step['kind']}" if "kind" in step else ""))
    assert_same(topology, inputs, run_relay(topology, inputs), oracle.run(topology, inputs))
