"""Kafka Streams beside Relay: builds the Java project in ``benchmarks/peers/kafka-streams``
with Maven on first use (into its gitignored ``target/``; Maven keeps the jars in its own
cache) and gives the command that runs one of its programs.

Two programs live there: ``relay.peers.Oracle``, the differential oracle of the DSL tests
(a topology in JSON run on Kafka Streams' ``TopologyTestDriver``), and
``relay.peers.CountingApp``, the peer app of ``benchmarks.throughput``.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

PROJECT = Path(__file__).resolve().parent / "kafka-streams"
TARGET = PROJECT / "target"
CLASSPATH_FILE = TARGET / "classpath.txt"
BUILD_TIMEOUT_S = 900


class KafkaStreamsUnavailable(RuntimeError):
    """Java or Maven is missing, or the build failed: the message says which, in one line."""


def _newest_source_mtime() -> float:
    sources = [PROJECT / "pom.xml", *(PROJECT / "src").rglob("*.java")]
    return max(p.stat().st_mtime for p in sources)


def _is_built() -> bool:
    stamp = TARGET / "built.stamp"
    return (CLASSPATH_FILE.exists() and stamp.exists()
            and stamp.stat().st_mtime >= _newest_source_mtime())


def build() -> str:
    """Build the project if a source changed since the last build; returns the classpath.

    Concurrent callers (xdist workers, benchmark runs) take a lock, so that one builds and
    the others wait for it."""
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            raise KafkaStreamsUnavailable(
                f"Kafka Streams peer: '{tool}' is not on PATH (Java 17 and Maven are needed "
                f"to build {PROJECT.name})")
    TARGET.mkdir(exist_ok=True)
    with open(TARGET / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_built():
            started = _newest_source_mtime()
            try:
                done = subprocess.run(
                    ["mvn", "-q", "-B", "compile"], cwd=PROJECT, capture_output=True,
                    text=True, timeout=BUILD_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                raise KafkaStreamsUnavailable(
                    f"Kafka Streams peer: the Maven build took over {BUILD_TIMEOUT_S} s"
                ) from None
            if done.returncode != 0:
                lines = [line for line in (done.stdout + done.stderr).splitlines()
                         if "ERROR" in line] or ["(no error line)"]
                raise KafkaStreamsUnavailable(
                    f"Kafka Streams peer: the Maven build failed: {lines[0].strip()}")
            stamp = TARGET / "built.stamp"
            stamp.touch()
            if _newest_source_mtime() > started:
                # A source changed during the build: the next caller builds again.
                stamp.unlink()
    return f"{TARGET / 'classes'}:{CLASSPATH_FILE.read_text().strip()}"


def java_command(main_class: str, *args: str, heap: str | None = None) -> list[str]:
    """The command line that runs ``main_class`` of the project (built first if needed)."""
    classpath = build()
    # Warnings and errors only: the benchmark shows the tail of a failed worker's log.
    options = ["-Dorg.slf4j.simpleLogger.defaultLogLevel=warn"]
    if heap:
        options.append(f"-Xmx{heap}")
    return ["java", *options, "-cp", classpath, f"relay.peers.{main_class}", *args]
