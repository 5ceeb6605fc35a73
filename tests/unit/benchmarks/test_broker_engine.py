"""What a benchmark's report says about its broker, and the engine flag's refusals."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.broker_engine import add_engine_arguments, describe, engine_label, start_broker


def test_the_engine_flag_defaults_to_tansu_and_refuses_others() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, kafka_nodes=3)
    args = parser.parse_args([])
    assert (args.engine, args.kafka_nodes) == ("tansu", 3)
    assert parser.parse_args(["--engine", "kafka"]).engine == "kafka"
    with pytest.raises(SystemExit):
        parser.parse_args(["--engine", "redpanda"])
    with pytest.raises(ValueError, match="unknown broker engine 'redpanda'"):
        start_broker("redpanda")
    with pytest.raises(ValueError, match="at least 1"):
        start_broker("kafka", kafka_nodes=0)


def test_a_report_names_the_engine_its_version_and_the_join_round() -> None:
    kafka = describe("kafka", 3, None)
    assert kafka["engine"] == "kafka" and kafka["nodes"] == 3 and kafka["version"]
    label = engine_label({"broker": kafka, "join_round": {"median_s": 0.031}})
    assert label == f"broker: Apache Kafka {kafka['version']} (3 nodes); join round 0.03 s"
    given = describe("kafka", 1, "10.0.0.1:9092")
    assert given["engine"] == "given" and given["bootstrap"] == "10.0.0.1:9092"
    assert engine_label({"broker": describe("tansu", 1, None), "join_round": None}).endswith(
        "join round not measured")
