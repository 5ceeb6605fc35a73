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
    # Read after the run from the broker itself (on Apache Kafka these came out None once).
    assert app["dead_letters"] == 0


@pytest.mark.broker
@pytest.mark.tansu
def test_the_join_round_probe_measures_static_members_when_asked(bootstrap: str) -> None:
    # The static soak's limit took the round of dynamic members: on Tansu those take about
    # 5 s, static ones about 8 to 9 s.
    from benchmarks.scaling_rounds import measure_join_rounds

    rounds = asyncio.run(measure_join_rounds(bootstrap, 1, 10_000, static=True))
    assert rounds.error is None and len(rounds.samples_s) == 1
