"""The scaling benchmark's Kafka Streams strategies, their pure parts: the app's status records
read as member status, the changelog prefilled in the app's store encoding, the workers'
settings, and the strategies reported as failed, with the reason, on Tansu."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack

from benchmarks.scaling import (
    PROBING_REBALANCE_MS,
    TANSU_WITHOUT_KAFKA_STREAMS,
    Sizes,
    last_line,
    parse_args,
    run_strategy,
)
from benchmarks.scaling_observe import kafka_streams_status
from benchmarks.scaling_prefill import changelog_topic, input_key, kafka_streams_encoder
from benchmarks.scaling_workers import (
    COMMIT_INTERVAL_MS,
    KafkaStreamsPool,
    PoolSettings,
    RelayPool,
)


def _status(**changes: Any) -> dict[str, Any]:
    record = {"instance": "app-w1", "pid": 7, "generation": 3, "state": "RUNNING",
              "active": ["0_0", "0_2"], "standby": [], "restoring": [],
              "standbys_configured": 0, "rebalances": 2, "restored_records": 500,
              "updated_ms": 1_000}
    return {**record, **changes}


def test_a_running_member_without_copies_is_settled() -> None:
    status = kafka_streams_status("app-w1", _status())
    assert (status.pid, status.generation, status.tasks) == (7, 3, frozenset({"0_0", "0_2"}))
    assert not status.moving and status.restored_records == 500


def test_restoring_an_active_or_rebalancing_is_moving() -> None:
    assert kafka_streams_status("k", _status(restoring=["0_2"])).moving
    assert kafka_streams_status("k", _status(state="REBALANCING")).moving


def test_a_standby_task_is_a_warm_up_only_when_no_standbys_are_configured() -> None:
    assert kafka_streams_status("k", _status(standby=["0_1"])).moving
    assert not kafka_streams_status(
        "k", _status(standby=["0_1"], standbys_configured=1)).moving


def test_the_prefill_writes_the_kafka_streams_app_s_store_encoding() -> None:
    """Keys as the input's bytes (Serdes.Bytes), values the msgpack map the app writes."""
    key, value = kafka_streams_encoder()("k7", {"n": 2, "blob": "xy"})
    assert key == input_key(7)
    assert msgpack.unpackb(value) == {"n": 2, "blob": "xy"}
    assert changelog_topic("app") == "app-state-changelog"


def test_kafka_streams_workers_get_relay_s_settings(tmp_path: Path) -> None:
    settings = PoolSettings("b:9092", "app", "app-in", "app-out", "app-ks-status", 4, 6000, 1,
                            tmp_path)
    env = KafkaStreamsPool(settings, 1000, 2, PROBING_REBALANCE_MS, 1200.0).environment("w3")
    assert env["BENCH_INSTANCE"] == "app-w3"
    assert env["BENCH_STATE_DIR"] == str(tmp_path / "state" / "w3")
    assert (env["BENCH_ACCEPTABLE_LAG"], env["BENCH_MAX_WARMUPS"], env["BENCH_STANDBYS"],
            env["BENCH_PROBING_MS"], env["BENCH_SESSION_TIMEOUT_MS"]) == (
        "1000", "2", "1", "60000", "6000")
    assert env["BENCH_COMMIT_MS"] == str(COMMIT_INTERVAL_MS)
    # It restores its first assignment before it runs: it waits for that as long as the
    # benchmark waits for a start (800 MB per task outlasted the app's own 120 s under load).
    assert env["BENCH_JOIN_TIMEOUT_S"] == "1200"


def test_on_tansu_a_kafka_streams_strategy_fails_with_the_reason(tmp_path: Path) -> None:
    args = parse_args(["--engine", "tansu", "--json", str(tmp_path / "s.json")])
    result = asyncio.run(run_strategy("kafka-streams-warmup", args,
                                      Sizes(2, 4, 100, 1, 100, 10), "127.0.0.1:1", tmp_path))
    assert result["error"] == f"StrategyFailed: {TANSU_WITHOUT_KAFKA_STREAMS}"
    assert result["phases_completed"] == 0 and result["phases"] == []


def test_a_failed_worker_s_last_log_line_is_quoted(tmp_path: Path) -> None:
    log = tmp_path / "w1-1.log"
    log.write_text("starting\nkafka-streams scaling app: the group did not form\n\n")
    assert last_line(log) == "kafka-streams scaling app: the group did not form"
    assert last_line(tmp_path / "missing.log") == ""


def test_relay_static_workers_are_static_members_named_for_the_worker(tmp_path: Path) -> None:
    settings = PoolSettings("b:9092", "app", "app-in", "app-out", "app-status", 4, 6000, 0,
                            tmp_path)
    static = RelayPool(settings, "cooperative", 1000, 2, static=True).environment("w3")
    dynamic = RelayPool(settings, "cooperative", 1000, 2).environment("w3")
    assert static["RELAY_GROUP_INSTANCE_ID"] == "w3"
    assert "RELAY_GROUP_INSTANCE_ID" not in dynamic
