"""The Apache Kafka launcher's decisions, without starting a JVM: the pinned version, one
clear line for a missing Java or Maven, and each node's settings in one- and three-node
clusters."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.testing import apache_kafka
from streams.testing.apache_kafka import KafkaCluster, find_java, kafka_jars, kafka_version
from streams.testing.loopback import BrokerError


def test_the_maven_project_pins_one_version() -> None:
    assert kafka_version() == "4.4.0"


def test_a_missing_java_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(BrokerError, match=r"needs Java 17 or newer: install"):
        find_java()


def test_a_missing_maven_with_an_empty_cache_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setenv(apache_kafka.CACHE_ENV, str(tmp_path))
    with pytest.raises(BrokerError, match=r"needs Maven: install it"):
        kafka_jars()


def settings(nodes: int, **kwargs: object) -> dict[int, dict[str, str]]:
    cluster = KafkaCluster(nodes=nodes, **kwargs)  # type: ignore[arg-type]
    cluster._work = Path("/nowhere")
    ports = {n: (9000 + 2 * n, 9001 + 2 * n) for n in range(1, nodes + 1)}
    return {n: cluster.settings_for(n, ports) for n in ports}


def test_three_nodes_replicate_three_times_with_two_in_sync_each_in_its_own_directory() -> None:
    by_node = settings(3)
    voters = "1@127.0.0.1:9003,2@127.0.0.1:9005,3@127.0.0.1:9007"
    for node, s in by_node.items():
        assert s["node.id"] == str(node)
        assert s["controller.quorum.voters"] == voters
        assert s["process.roles"] == "broker,controller"
        assert (s["default.replication.factor"], s["min.insync.replicas"]) == ("3", "2")
        assert s["offsets.topic.replication.factor"] == "3"
        assert s["transaction.state.log.min.isr"] == "2"
        assert "group.initial.rebalance.delay.ms" not in s  # Kafka's default, as users run it
    assert len({s["log.dirs"] for s in by_node.values()}) == 3


def test_one_node_holds_its_internal_topics_and_tests_get_no_rebalance_delay() -> None:
    (s,) = settings(1, for_tests=True).values()
    assert s["offsets.topic.replication.factor"] == s["default.replication.factor"] == "1"
    assert s["group.initial.rebalance.delay.ms"] == "0"
