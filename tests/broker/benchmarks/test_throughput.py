"""The throughput benchmark's runs against a broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import throughput
from tests.unit.benchmarks.test_throughput import FIGURES


@pytest.mark.broker
def test_throughput_benchmark_reports_every_figure_with_verified_counts(
        bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    throughput.main(["--records", "2000", "--keys", "50", "--timeout", "90",
                     "--strategies", "relay-alo-100ms", "aiokafka-passthrough",
                     "--bootstrap", bootstrap, "--json", str(out)])
    data = json.loads(out.read_text())
    assert [r["strategy"] for r in data["results"]] == ["relay-alo-100ms",
                                                       "aiokafka-passthrough"]
    for result in data["results"]:
        assert result["error"] is None, result["error"]
        assert all(result[name] is not None and result[name] > 0 for name in FIGURES), result
        assert result["records_done"] >= 2000
        assert result["outputs"] == 2000 and result["keys_wrong"] == 0
        assert result["counts"] == "exact"
    [ratio] = [r for r in data["ratios"] if r["over"] == "fastest passthrough"]
    assert ratio["records_per_s_steady"]["denominator"] == "aiokafka-passthrough"
    assert ratio["records_per_s_steady"]["ratio"] > 0
    assert out.with_suffix(".png").stat().st_size > 0


@pytest.mark.broker
def test_a_failing_strategy_is_reported_and_the_run_goes_on(
        bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    # No time at all: each strategy is past its deadline at the first look, before its process
    # could have started (0.5 s was enough for a whole run on Apache Kafka, whose joins take
    # 0.01 s); the first one fails, and the next still runs.
    throughput.main(["--records", "1000", "--keys", "10", "--timeout", "0",
                     "--strategies", "confluent-consume", "aiokafka-consume",
                     "--bootstrap", bootstrap, "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    assert [r["strategy"] for r in results] == ["confluent-consume", "aiokafka-consume"]
    assert all(r["error"] and "TimeoutError" in r["error"] for r in results)
    assert all(r["peak_rss_mib"] and r["exit_code"] is not None for r in results)
