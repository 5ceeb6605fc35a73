"""``benchmarks.restore --snapshot`` runs end to end at a tiny size: both restores verified,
the snapshot figures reported (never asserted on). It builds in the tier's shared Spark
session (``spark``), which the benchmark uses rather than starting a JVM of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from benchmarks import restore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.mark.broker
def test_restore_benchmark_with_snapshot(spark: SparkSession, bootstrap: str,
                                         tmp_path: Path) -> None:
    out = tmp_path / "restore.json"
    restore.main(["--records", "2000", "--repeat", "1", "--snapshot", "--bootstrap", bootstrap,
                  "--json", str(out)])
    snapshot = json.loads(out.read_text())["snapshot"]
    assert snapshot["verified"] is True
    assert snapshot["snapshot_offset"] == 2000
    assert snapshot["tail_records"] == 20
    assert snapshot["replay_records"] == 2020
    assert snapshot["snapshot_tail_records"] == 20
    assert {"build_seconds", "spark_start_seconds", "replay_seconds",
            "snapshot_restore_seconds", "speedup"} <= set(snapshot)
