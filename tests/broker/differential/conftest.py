"""The Kafka Streams oracle, one JVM for the whole session (one per xdist worker; the
differential tests share one worker)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.peers.kafka_streams import KafkaStreamsUnavailable
from tests.broker.differential.oracle import Oracle


@pytest.fixture(scope="session")
def oracle() -> Iterator[Oracle]:
    try:
        running = Oracle()
    except KafkaStreamsUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    try:
        yield running
    finally:
        running.close()
