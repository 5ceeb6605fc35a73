"""The fault benchmark: its checks are computed from what went in and came out (fast tests of
the pure part), and a tiny run with one kill reports every figure (a broker smoke test)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest

from benchmarks import faults
from benchmarks.faults_check import (
    compare_latest,
    compare_occurrences,
    longest_stalls,
    rebalances,
)
from tests.broker.streams.harness import read_all


def test_latest_values_are_compared_key_by_key() -> None:
    result = compare_latest({"a": 3, "b": 2, "c": 1, "d": 4}, {"a": 3, "b": 5, "c": 0, "x": 1})
    assert (result.cases, result.exact, result.over, result.under) == (4, 1, 1, 2)
    assert (result.over_by, result.under_by, result.unexpected) == (3, 5, 1)
    assert not result.is_exact
    assert compare_latest({"a": 1}, {"a": 1}).is_exact


def test_each_input_record_must_come_out_once() -> None:
    result = compare_occurrences([1, 2, 3, 4], Counter({1: 1, 2: 3, 5: 1}), wrong=1)
    assert (result.exact, result.over, result.over_by, result.under) == (1, 1, 2, 2)
    assert result.unexpected == 1 and result.wrong == 1 and not result.is_exact


def test_a_stall_counts_from_the_start_and_until_the_end() -> None:
    stalls = longest_stalls({"0_0": [101, 102, 130, 131], "0_1": [], "0_2": [105, 170]},
                            start=100, end=140)
    assert (stalls["0_0"].gap_s, stalls["0_0"].from_s, stalls["0_0"].to_s) == (28, 2, 30)
    assert stalls["0_1"].gap_s == 40
    assert stalls["0_2"].gap_s == 35 and stalls["0_2"].to_s == 40
    assert rebalances([3, 3, 4, 6, 6]) == 2


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
