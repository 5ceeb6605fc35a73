"""``relay broker``: an embedded broker in the foreground on a fixed port, over a real
process."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from streams.testing.broker import free_loopback_port
from tests.broker.streams.harness import list_topics

ROOT = Path(__file__).resolve().parents[3]


def relay(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "tools.cli", *args], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )



def test_serves_on_the_given_port_until_sigterm() -> None:
    port = free_loopback_port()
    process = relay("broker", "--port", str(port))
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once the broker answers
        assert f"127.0.0.1:{port}" in line, line
        assert isinstance(asyncio.run(list_topics(f"127.0.0.1:{port}")), set)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_serves_apache_kafka_with_engine_kafka() -> None:
    port = free_loopback_port()
    process = relay("broker", "--engine", "kafka", "--port", str(port))
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        while line.startswith("relay: fetching"):  # a fresh cache: Maven runs first
            line = process.stdout.readline()
        assert f"Apache Kafka 4.4.0 at 127.0.0.1:{port}" in line, line
        assert isinstance(asyncio.run(list_topics(f"127.0.0.1:{port}")), set)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_port_in_use_is_an_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = relay("broker", "--port", str(port))
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in output


def test_a_bad_port_is_a_usage_error() -> None:
    process = relay("broker", "--port", "70000")
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 2
    assert "--port" in output
