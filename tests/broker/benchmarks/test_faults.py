"""The fault benchmark's short run against a broker, with a kill."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from benchmarks import faults
from tests.broker.streams.harness import read_all


@pytest.mark.broker
def test_a_short_run_with_a_kill_reports_every_figure(bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "faults.json"
    faults.main(["--json", str(out), "--bootstrap", bootstrap, "--apps", "counts",
                 "--minutes", "0.35", "--faults", "kill", "--fault-interval", "4", "6",
                 "--workers", "2", "--threads", "1", "--partitions", "2", "--keys", "50",
                 "--rate", "50", "--session-timeout-ms", "6000", "--drain", "60",
                 "--run-dir", str(tmp_path / "run")])
    report = json.loads(out.read_text())
    assert report["error"] is None
    assert report["processing_guarantee"]["effective"] == "at_least_once"
    kills = [e for e in report["timeline"] if e.get("fault") == "kill"]
    assert kills and all(e["status"] == "applied" and e["worker"] for e in kills)
    app = report["apps"]["counts"]
    counts = app["outputs"]["counts"]
    assert counts["cases"] == 50 and app["input_records"] > 0
    assert counts["exact"] + counts["over"] + counts["under"] == counts["cases"]
    # The figures agree with the sink as read here: its latest count per key adds up to the
    # input, give or take what the report says is over and under.
    records = asyncio.run(read_all(bootstrap, app["sinks"]["counts"], 2))
    latest = {key: value["v"] for key, value in records}
    assert sum(latest.values()) == (app["input_records"] + counts["over_by"]
                                    - counts["under_by"])
    assert set(app["stalls"]) == {"0_0", "0_1"}
    assert app["longest_stall"]["gap_s"] == max(app["stalls"].values())
    assert app["rebalances"] >= 1
    assert set(app["verdict"]) == {"nothing_under", "all_exact", "no_stall_over_limit"}


def test_each_fault_gets_the_longest_stall_that_ended_before_the_next_one() -> None:
    from benchmarks.faults_check import fault_limit_s, gaps, stalls_per_fault

    times = {"0_0": [100, 110, 135, 150, 170], "1_0": [100, 112, 120, 160, 175]}
    found = gaps(times, 100, 180, at_least_s=9.5)
    assert [(s.task, s.gap_s, s.from_s, s.to_s) for s in found] == [
        ("0_0", 10, 0, 10), ("1_0", 12, 0, 12), ("0_0", 25, 10, 35), ("1_0", 40, 20, 60),
        ("0_0", 15, 35, 50), ("0_0", 20, 50, 70), ("1_0", 15, 60, 75), ("0_0", 10, 70, 80)]
    per_fault = stalls_per_fault(found, [(5, "kill w2", 18), (40, "stop w3", 18)], 80)
    assert [(f.fault, f.stall.task, f.stall.gap_s, f.over) for f in per_fault
            if f.stall is not None] == [("kill w2", "0_0", 25, True), ("stop w3", "1_0", 40, True)]
    # A kill back within its session waits for its worker; one back later does not.
    assert fault_limit_s("kill", 5, 10, 8) == 23
    assert fault_limit_s("kill", 20, 10, 8) == 18
    assert fault_limit_s("stop", 25, 10, 8) == 18
