"""Worker processes of the scaling benchmark: one app instance per process, Relay, faust or
Kafka Streams.

A pool starts, stops and restarts named workers (``w1``, ``w2``, …), each with its own state
directory that survives its restarts and a log file of its own. Every worker is tied to the
benchmark: it gets SIGKILL when the benchmark process dies (Linux parent-death signal), and
:meth:`WorkerPool.kill_all` ends what is left on any exit path, so no run leaves orphans.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from benchmarks.peers import kafka_streams

_PR_SET_PDEATHSIG = 1
#: Every framework's commit interval in this benchmark (Relay's and Kafka Streams'; faust's
#: ``broker_commit_interval`` is the same 0.5 s).
COMMIT_INTERVAL_MS = 500
#: Workers import the apps as ``benchmarks.…`` from the repository's root.
REPO_ROOT = Path(__file__).resolve().parents[1]


def die_with_the_benchmark() -> None:
    """Runs in the child before exec: the kernel kills it when its parent dies."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class PoolSettings:
    """What every worker of one strategy shares."""

    bootstrap: str
    app_id: str
    source: str
    sink: str
    status_topic: str
    partitions: int
    session_timeout_ms: int
    standbys: int
    run_dir: Path


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    #: A worker told to leave (marked leaving) ends by itself; that is no failure.
    may_exit: bool = False


class WorkerPool(ABC):
    """Named worker processes of one strategy."""

    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings
        self.workers: dict[str, Worker] = {}
        self._starts = 0

    @abstractmethod
    def command(self) -> list[str]:
        """The command line of a worker process."""

    @abstractmethod
    def environment(self, name: str) -> dict[str, str]:
        """Settings of worker ``name`` (its state directory among them)."""

    def state_dir(self, name: str) -> Path:
        return self.settings.run_dir / "state" / name

    def start(self, name: str) -> int:
        """Start worker ``name`` (again, after a stop); returns its pid."""
        if name in self.workers:
            raise RuntimeError(f"worker {name} is already running")
        self._starts += 1
        self.state_dir(name).mkdir(parents=True, exist_ok=True)
        log = open(self.settings.run_dir / f"{name}-{self._starts}.log", "wb")  # noqa: SIM115
        process = subprocess.Popen(
            self.command(), env={**os.environ, **self.environment(name)},
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
            preexec_fn=die_with_the_benchmark,
        )
        self.workers[name] = Worker(name, process, log)
        return process.pid

    def pid(self, name: str) -> int:
        return self.workers[name].process.pid

    def pids(self) -> set[int]:
        return {w.process.pid for w in self.workers.values() if w.process.poll() is None}

    def exited(self, name: str) -> bool:
        return self.workers[name].process.poll() is not None

    async def stop(self, name: str, timeout_s: float = 60.0,
                   sig: signal.Signals = signal.SIGTERM) -> int | None:
        """``sig`` (SIGTERM: the graceful shutdown of every framework), SIGKILL after
        ``timeout_s``. Returns the exit code, or None when the worker had to be killed. Waits
        without blocking the event loop: the input and the observers go on meanwhile."""
        worker = self.workers.pop(name)
        try:
            if worker.process.poll() is None:
                worker.process.send_signal(sig)
            deadline = time.monotonic() + timeout_s
            while worker.process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait()
                return None
            return worker.process.returncode
        finally:
            worker.log.close()

    def forget(self, name: str) -> int | None:
        """Drop a worker that exited on its own; returns its exit code."""
        worker = self.workers.pop(name)
        worker.log.close()
        return worker.process.poll()

    def kill_all(self) -> None:
        """End every worker now, whatever state the run is in."""
        for worker in self.workers.values():
            with contextlib.suppress(OSError):
                worker.process.kill()
        deadline = time.monotonic() + 10
        for worker in self.workers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            worker.log.close()
        self.workers.clear()

    async def stop_all(self, timeout_s: float = 30.0) -> None:
        for name in list(self.workers):
            await self.stop(name, timeout_s)


class RelayPool(WorkerPool):
    """Relay workers running :mod:`benchmarks.scaling_app`; ``protocol`` is
    ``cooperative`` (learners) or ``eager`` (stop the world)."""

    def __init__(self, settings: PoolSettings, protocol: str, acceptable_lag: int,
                 max_learners: int, log_level: str = "INFO", static: bool = False) -> None:
        super().__init__(settings)
        self.log_level = log_level
        self.static = static
        self.protocol = protocol
        self.acceptable_lag = acceptable_lag
        self.max_learners = max_learners

    def command(self) -> list[str]:
        return [sys.executable, "-m", "streams", "run", "benchmarks.scaling_app:app",
                "--log-level", self.log_level]

    def environment(self, name: str) -> dict[str, str]:
        s = self.settings
        return {
            "BENCH_APP_ID": s.app_id, "BENCH_INPUT": s.source, "BENCH_OUTPUT": s.sink,
            "RELAY_BOOTSTRAP_SERVERS": s.bootstrap,
            "RELAY_STATE_DIR": str(self.state_dir(name)),
            "RELAY_REBALANCE_PROTOCOL": self.protocol,
            "RELAY_SESSION_TIMEOUT_MS": str(s.session_timeout_ms),
            "RELAY_HEARTBEAT_INTERVAL_MS": "1000",
            "RELAY_COMMIT_INTERVAL_MS": str(COMMIT_INTERVAL_MS),
            "RELAY_NUM_STANDBYS": str(s.standbys),
            "RELAY_ACCEPTABLE_LAG": str(self.acceptable_lag),
            "RELAY_MAX_LEARNERS": str(self.max_learners),
            # A static member per stream thread, ``<name>-thread-<n>``: a restart moves nothing.
            **({"RELAY_GROUP_INSTANCE_ID": name} if self.static else {}),
        }


class FaustPool(WorkerPool):
    """faust-streaming workers running :mod:`benchmarks.scaling_faust_app`, web server off."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "faust", "-A", "benchmarks.scaling_faust_app",
                "worker", "--without-web", "--loglevel", "warn"]

    def environment(self, name: str) -> dict[str, str]:
        s = self.settings
        return {
            "BENCH_APP_ID": s.app_id, "BENCH_INPUT": s.source, "BENCH_OUTPUT": s.sink,
            "BENCH_STATUS": s.status_topic, "BENCH_BOOTSTRAP": s.bootstrap,
            "BENCH_PARTITIONS": str(s.partitions),
            "BENCH_DATA_DIR": str(self.state_dir(name)),
            "BENCH_SESSION_TIMEOUT_S": str(s.session_timeout_ms / 1000),
            "BENCH_STANDBYS": str(s.standbys),
        }


class KafkaStreamsPool(WorkerPool):
    """Kafka Streams workers running ``relay.peers.ScalingApp`` (one JVM each, built by Maven
    on first use): static members named ``<app id>-<worker>``, the HighAvailabilityTaskAssignor
    with ``max_warmups`` warm-up replicas, Relay's acceptable lag and a probing rebalance every
    ``probing_ms``. SIGTERM closes a worker as Kafka Streams does by default (a static member
    stays in the group); :data:`LEAVE_SIGNAL` closes it with LEAVE_GROUP."""

    #: The JVM's heap: the store lives in RocksDB, off the heap.
    HEAP = "512m"
    #: Makes the app close with ``CloseOptions.groupMembershipOperation(LEAVE_GROUP)``.
    LEAVE_SIGNAL = signal.SIGUSR1

    def __init__(self, settings: PoolSettings, acceptable_lag: int, max_warmups: int,
                 probing_ms: int, start_timeout_s: float) -> None:
        super().__init__(settings)
        self.acceptable_lag = acceptable_lag
        self.max_warmups = max_warmups
        self.probing_ms = probing_ms
        self.start_timeout_s = start_timeout_s
        self._command: list[str] | None = None

    def command(self) -> list[str]:
        if self._command is None:
            self._command = kafka_streams.java_command("ScalingApp", heap=self.HEAP)
        return self._command

    def environment(self, name: str) -> dict[str, str]:
        s = self.settings
        return {
            "BENCH_APP_ID": s.app_id, "BENCH_INPUT": s.source, "BENCH_OUTPUT": s.sink,
            "BENCH_STATUS": s.status_topic, "BENCH_BOOTSTRAP": s.bootstrap,
            "BENCH_STATE_DIR": str(self.state_dir(name)),
            "BENCH_INSTANCE": f"{s.app_id}-{name}",
            "BENCH_SESSION_TIMEOUT_MS": str(s.session_timeout_ms),
            "BENCH_COMMIT_MS": str(COMMIT_INTERVAL_MS),
            "BENCH_STANDBYS": str(s.standbys),
            "BENCH_MAX_WARMUPS": str(self.max_warmups),
            "BENCH_ACCEPTABLE_LAG": str(self.acceptable_lag),
            "BENCH_PROBING_MS": str(self.probing_ms),
            # Kafka Streams is RUNNING only once its first assignment is restored: with
            # hundreds of MB per task that can take longer than the app's default wait for
            # its group (120 s), so the app waits as long as the benchmark does.
            "BENCH_JOIN_TIMEOUT_S": str(max(1, round(self.start_timeout_s))),
        }
