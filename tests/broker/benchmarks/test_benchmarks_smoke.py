"""The benchmarks run end to end at tiny sizes (figures are printed, never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import restore, scaling

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.broker
def test_restore_benchmark_verifies_the_restored_store(bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "restore.json"
    restore.main(["--records", "3000", "--repeat", "1", "--bootstrap", bootstrap,
                  "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["verified"] is True
    assert result["records"] == 3000
    assert result["aiokafka_raw"]["best_records_per_s"] > 0
    assert result["relay_restore"]["best_records_per_s"] > 0
    assert {"ratio_best", "fill_records_per_s", "peak_rss_mb", "versions"} <= set(result)
    # A broker it did not start is named by its address; its join round is measured on it.
    assert result["broker"] == {"engine": "given", "bootstrap": bootstrap,
                                "note": result["broker"]["note"]}
    assert result["join_round"]["median_s"] > 0 and not result["errors"]


def test_assignor_benchmark_reports_time_and_size(tmp_path: Path) -> None:
    out = tmp_path / "assignor.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.assignor", "--tasks", "300", "--instances", "10",
         "--threads", "2", "--repeat", "1", "--json", str(out)],
        cwd=ROOT, check=True, capture_output=True,
    )
    result = json.loads(out.read_text())
    assert result["tasks"] == 300 and result["members"] == 22
    assert 0 < result["metadata_bytes"] < 2**20


SCALING_SMALL = ["--strategies", "relay-learner", "--instances", "1", "--partitions", "2",
                 "--keys", "200", "--value-bytes", "100", "--rate", "100", "--settle", "1"]
PHASE_FIELDS = {"seconds_to_balance", "longest_gap_moved_s", "longest_gap_unmoved_s",
                "longest_gap_moved_rounds", "to_balance_rounds", "moved_tasks", "rebalances",
                "restored_records", "reprocessed_records", "owners_before", "owners_after",
                "balanced", "completed"}


@pytest.mark.broker
def test_scaling_benchmark_reports_a_change_at_each_state_size(
        bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    scaling.main([*SCALING_SMALL, "--phases", "scale-out", "--state-mb", "0.02", "0.04",
                  "--join-rounds", "2", "--bootstrap", bootstrap, "--json", str(out)])
    data = json.loads(out.read_text())
    assert len(data["join_round"]["samples_s"]) == 2 and data["join_round"]["error"] is None
    assert [r["state_mb"] for r in data["results"]] == [0.02, 0.04]
    for result in data["results"]:
        assert result["strategy"] == "relay-learner"
        assert result["error"] is None and result["phases_completed"] == 1
        assert result["start"]["restored_records"] > 0
        [phase] = result["phases"]
        assert phase["kind"] == "scale-out"
        assert set(phase) >= PHASE_FIELDS and phase["completed"] is True
        assert [m["label"] for m in result["marks"]] == ["scale out"]
        assert result["throughput"] and result["member_status"]
    assert out.with_suffix(".png").stat().st_size > 0


@pytest.mark.broker
def test_scaling_benchmark_reports_a_hand_over(bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    scaling.main([*SCALING_SMALL, "--phases", "scale-out", "hand-over", "--state-mb", "0.02",
                  "--join-rounds", "1", "--bootstrap", bootstrap, "--json", str(out)])
    [result] = json.loads(out.read_text())["results"]
    assert result["error"] is None and result["phases_completed"] == 2
    assert [p["kind"] for p in result["phases"]] == ["scale-out", "hand-over"]
    assert all(set(p) >= PHASE_FIELDS and p["completed"] is True for p in result["phases"])
    assert any("exited by itself" in note or "did not exit" in note
               for note in result["phases"][1]["notes"])
    assert [m["label"] for m in result["marks"]] == ["scale out", "hand over"]


@pytest.mark.broker
def test_scaling_benchmark_reports_a_strategy_that_failed_before_its_first_change(
        bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    scaling.main(["--strategies", "relay-learner", "--phases", "scale-out", "--instances", "1",
                  "--partitions", "2", "--keys", "200", "--state-mb", "0.02",
                  "--value-bytes", "100", "--rate", "100", "--settle", "0",
                  "--start-timeout", "0.1", "--join-rounds", "1", "--bootstrap", bootstrap,
                  "--json", str(out)])
    [result] = json.loads(out.read_text())["results"]
    assert result["error"] is not None and "StrategyFailed" in result["error"]
    assert result["phases_completed"] == 0 and result["phases"] == []
    assert result["start"]["completed"] is False


@pytest.mark.broker
def test_observability_overhead_benchmark_reports_both_modes(
        bootstrap: str, tmp_path: Path) -> None:
    from benchmarks import observability_overhead

    out = tmp_path / "overhead.json"
    observability_overhead.main(["--records", "3000", "--keys", "20", "--partitions", "2",
                                 "--repeat", "1", "--timeout", "60", "--bootstrap", bootstrap,
                                 "--json", str(out)])
    data = json.loads(out.read_text())
    assert [(r["mode"], r["error"]) for r in data["runs"]] == [("off", None), ("on", None)]
    assert all(r["records_per_s"] > 0 and r["cpu_us_per_record"] > 0 for r in data["runs"])
    for figure in ("throughput_records_per_s", "cpu_us_per_record"):
        assert data[figure]["runs"] == {"off": 1, "on": 1}
        assert data[figure]["on_over_off_median_pairwise"] > 0
