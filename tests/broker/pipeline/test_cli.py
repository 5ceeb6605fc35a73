"""``relay snapshot build`` and ``relay snapshot list``: from the changelog and from Parquet,
the summary tables, and bad arguments with their exit codes as a person sees them (the
command in a process of its own).

The builds run in this process, through the command's Click entry point, on the tests' shared
Spark session (a JVM start per build would cost more than the builds): the command uses a
session its process already runs and leaves it running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from statestore.snapshot import MANIFEST_FILE, read_manifest
from tests.broker.pipeline.conftest import create_changelog, open_store, write_history
from tools import snapshot as snapshot_tool
from tools.cli import cli

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[3]


def relay(*args: str) -> tuple[int, str]:
    python_path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    done = subprocess.run(
        [sys.executable, "-m", "tools.cli", *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": python_path, "COLUMNS": "200"},
    )
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def relay_here(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str]]:
    """``relay`` in this process (its Spark session is the tests' own), printing tables as
    wide as a terminal of 200 columns would."""
    monkeypatch.setattr(snapshot_tool.console, "width", 200)

    def run(*args: str) -> tuple[int, str]:
        done = CliRunner().invoke(cli, list(args))
        return done.exit_code, done.output

    return run


def test_build_from_changelog_and_list(
    spark: SparkSession, relay_here: Callable[..., tuple[int, str]], bootstrap: str,
    tmp_path: Path, unique: Callable[[str], str]
) -> None:
    app = unique("cli")
    create_changelog(bootstrap, app, 2)
    store = open_store(tmp_path / "state", app, 1)
    write_history(bootstrap, store, 150, seed=3)
    position, keys = store.position, len(dict(store.raw_items()))
    store.close()

    out = tmp_path / "snapshots"
    code, text = relay_here("snapshot", "build", app, "counts", "--out", str(out),
                            "--bootstrap", bootstrap)
    assert code == 0, text
    assert "2 snapshots" in text and "0_0" in text and "0_1" in text
    manifest = read_manifest(out / app / "counts" / "0_1")
    assert manifest is not None
    assert (manifest.offset, manifest.records, manifest.source) == (position, keys + 1,
                                                                   "changelog")

    code, text = relay_here("snapshot", "list", str(out))
    assert code == 0, text
    assert app in text and f"{position:,}" in text and manifest.sha256[:12] in text

    (out / app / "counts" / "0_0" / MANIFEST_FILE).write_text("{")
    code, text = relay_here("snapshot", "list", str(out))
    assert code == 1 and "corrupt snapshot manifest" in text and app in text


def test_build_from_parquet(
    spark: SparkSession, relay_here: Callable[..., tuple[int, str]], tmp_path: Path
) -> None:
    history = tmp_path / "history.parquet"
    pq.write_table(pa.table({"key": [f"user-{i % 5}" for i in range(20)],
                             "value": pa.array(range(20), pa.int64()),
                             "offset": pa.array(range(20), pa.int64())}), str(history))
    out = tmp_path / "snapshots"
    code, text = relay_here("snapshot", "build", "clicks", "counts", "--source", "parquet",
                            str(history), "--partitions", "3", "--out", str(out),
                            "--input-offsets", '{"clicks": {"0": 4, "2": 6}}')
    assert code == 0, text
    assert spark.range(3).count() == 3  # the session the command found runs on
    manifests = [json.loads(p.read_text()) for p in sorted(out.rglob(MANIFEST_FILE))]
    assert [m["task"] for m in manifests] == ["0_0", "0_1", "0_2"]
    assert sum(m["records"] for m in manifests) == 5 + 2  # keys, and two input positions
    assert {m["source"] for m in manifests} == {"dataframe"}


def test_bad_arguments_exit_with_their_codes(bootstrap: str, tmp_path: Path) -> None:
    out = str(tmp_path / "snapshots")
    code, text = relay("snapshot", "build", "app", "counts", "--source", "parquet",
                       "--out", out)
    assert code == 2 and "--source parquet needs the PATH" in text
    code, text = relay("snapshot", "build", "app", "counts", "--out", out,
                       "--bootstrap", "127.0.0.1:1")
    assert code == 3 and "cannot reach the broker at 127.0.0.1:1" in text
    code, text = relay("snapshot", "build", "no-such-app", "counts", "--out", out,
                       "--bootstrap", bootstrap)
    assert code == 2 and "unknown app or store no-such-app/counts" in text
    code, text = relay("snapshot", "build", "app", "counts", "--source", "kafka", "--out", out)
    assert code == 2 and "'kafka' is not one of" in text
    code, text = relay("snapshot", "build", "app", "counts", "--source", "parquet", str(tmp_path),
                       "--input-offsets", "[1]", "--out", out)
    assert code == 2 and "--input-offsets" in text
    code, text = relay("snapshot", "list", str(tmp_path / "missing"))
    assert code == 2 and "does not exist" in text
    assert not Path(out).exists()
