"""Bad environment that needs a process of its own: the CLI run in a subprocess against an
unreachable broker, a state directory on a read-only file system (a mount in a fresh namespace)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from streams.exit_codes import ExitCode
from tests.broker.streams.harness import create_topics
from tests.unit.streams.test_bad_environment import (
    WORKER,
    assert_one_line,
    closed_port,
    run_worker,
)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare for a read-only mount")
def test_a_state_dir_on_a_read_only_file_system_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "ro").mkdir()
    script = (f"mount -t tmpfs -o ro tmpfs {tmp_path / 'ro'} && "
              f"RELAY_STATE_DIR={tmp_path / 'ro' / 'state'} "
              f"RELAY_BOOTSTRAP_SERVERS=127.0.0.1:{closed_port()} "
              f"{sys.executable} -m streams run worker:app --log-level ERROR")
    probe = subprocess.run(["unshare", "-rm", "sh", "-c",
                            f"mount -t tmpfs -o ro tmpfs {tmp_path / 'ro'}"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no user and mount namespaces here for a read-only mount")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == ExitCode.CONFIG
    assert_one_line(done.stderr, "state_dir", "Read-only file system")


def test_an_unreachable_or_unresolvable_broker_is_one_line_and_exit_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    unreachable = f"127.0.0.1:{closed_port()}"
    code, output = run_worker(tmp_path, monkeypatch, bootstrap_servers=unreachable)
    assert code == ExitCode.UNREACHABLE
    assert_one_line(output, "broker unreachable: bootstrap_servers", unreachable)
    code, output = run_worker(tmp_path, monkeypatch, bootstrap_servers="relay-no-such.invalid:9092")
    assert code == ExitCode.UNREACHABLE
    assert_one_line(output, "bootstrap_servers", "cannot resolve relay-no-such.invalid")


def test_a_missing_source_topic_is_one_line_and_exit_4(bootstrap: str, tmp_path: Path) -> None:
    """The app stops before it runs: nothing it made for the run is left to complain, on
    stderr, that it was never closed."""
    (tmp_path / "missing.py").write_text(
        "from streams import App\napp = App('missing-source')\n"
        "app.stream('relay-no-such-topic').to('out')\n")
    env = {**os.environ, "RELAY_BOOTSTRAP_SERVERS": bootstrap,
           "RELAY_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-m", "streams", "run", "missing:app",
                           "--log-level", "ERROR"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == ExitCode.CONFIG
    assert_one_line(done.stderr, "topology error: source topic relay-no-such-topic does not exist")


def test_a_declared_topic_with_another_partition_count_is_one_line_and_exit_4(
        bootstrap: str, tmp_path: Path) -> None:
    """A restart cannot help: a supervisor told not to restart on 4 stops."""
    topic = f"relay-shaped-{os.getpid()}"
    asyncio.run(create_topics(bootstrap, {topic: 1}))
    (tmp_path / "shaped.py").write_text(
        f"from streams import App\napp = App('shaped')\n"
        f"app.stream(app.topic({topic!r}, partitions=2)).to('out')\n")
    env = {**os.environ, "RELAY_BOOTSTRAP_SERVERS": bootstrap,
           "RELAY_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-m", "streams", "run", "shaped:app",
                           "--log-level", "ERROR"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == ExitCode.CONFIG, done.stderr
    assert_one_line(done.stderr, f"topology error: topic {topic} exists with 1 partitions but "
                                 f"this application needs 2 (as declared with app.topic")


@pytest.mark.parametrize("setting", ["METRICS_PORT", "QUERY_PORT"])
def test_a_metrics_or_query_port_already_taken_is_one_line_and_exit_4(
    bootstrap: str, tmp_path: Path, setting: str,
) -> None:
    (tmp_path / "worker.py").write_text(
        f"from streams import App\napp = App('taken-{setting.lower().replace('_', '-')}')\n"
        "lines = app.topic('taken-lines', partitions=1)\n"
        "app.stream(lines).group_by_key().count(store='counts').to_stream().to('totals')\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "RELAY_BOOTSTRAP_SERVERS": bootstrap,
               "RELAY_STATE_DIR": str(tmp_path / "state"), f"RELAY_{setting}": str(port),
               "RELAY_METRICS_HOST": "127.0.0.1", "RELAY_QUERY_HOST": "127.0.0.1"}
        done = subprocess.run([sys.executable, "-m", "streams", "run", "worker:app",
                               "--log-level", "ERROR"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == ExitCode.CONFIG
    assert_one_line(done.stderr, "configuration error: cannot serve", f"127.0.0.1:{port}")
