"""``python -m examples.demo`` (or ``make demo``): Relay end to end on the embedded broker.

A producer writes click events; the demo app (:mod:`examples.demo_app`) runs in two worker
processes with one standby copy per task; the demo prints the group's tasks (from the status
topic the members publish) and the results as they change. Midway it kills one worker
(SIGKILL: no commit, no goodbye); the other takes over its tasks from its standby copies; then
the worker comes back and gets work again. At the end every click must be counted exactly once.

The demo starts the embedded broker itself and points the workers at it
(``RELAY_BOOTSTRAP_SERVERS``); each worker is ``python -m streams run``, i.e. ``relay run``.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition
from rich.console import Console
from rich.table import Table

from examples.demo_app import APP_ID, CLICKS, TOTALS, WINDOWED
from statestore.topics import COMPACTED, TopicSpec, ensure_topics
from streams.group.status_topic import status_topic_name
from streams.testing.broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[1]
USERS = [f"user-{i:02d}" for i in range(12)]
console = Console()


def start_worker(name: str, bootstrap: str, state_root: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "RELAY_BOOTSTRAP_SERVERS": bootstrap,
        "RELAY_STATE_DIR": str(state_root / name),
        "RELAY_NUM_STANDBYS": "1",
        "RELAY_SESSION_TIMEOUT_MS": "6000",
        "RELAY_HEARTBEAT_INTERVAL_MS": "1000",
        "RELAY_COMMIT_INTERVAL_MS": "500",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "streams", "run", "examples.demo_app:app", "--log-level", "ERROR"],
        env=env, cwd=ROOT,
    )


class Reader:
    """Follows a topic from the beginning and keeps the latest value per key."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, raw_keys: bool = False) -> None:
        self.latest: dict[Any, Any] = {}
        self._raw_keys = raw_keys
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self._tps = [TopicPartition(topic, p) for p in range(partitions)]

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.assign(self._tps)
        await self._consumer.seek_to_beginning(*self._tps)

    async def poll(self) -> None:
        batches = await self._consumer.getmany(timeout_ms=200)
        for records in batches.values():
            for r in records:
                if self._raw_keys:
                    key = r.key
                else:
                    key = msgpack.unpackb(r.key, raw=False) if r.key else None
                key = tuple(key) if isinstance(key, list) else key
                if r.value is None:
                    self.latest.pop(key, None)
                else:
                    self.latest[key] = msgpack.unpackb(r.value, raw=False)

    async def stop(self) -> None:
        await self._consumer.stop()


def group_table(status: dict[Any, Any], names: dict[int, str]) -> Table:
    table = Table(title="the group, as its members report it")
    for column in ("worker", "pid", "active tasks", "restoring", "standby copies (lag)"):
        table.add_column(column)
    for _, s in sorted(status.items(), key=lambda kv: str(kv[0])):
        copies = ", ".join(f"{t} ({lag})" for t, lag in sorted(s["standbys"].items()))
        table.add_row(
            f"{names.get(s['pid'], '?')} thread {s['thread']}", str(s["pid"]),
            ", ".join(s["active"]) or "-", ", ".join(s["restoring"]) or "-", copies or "-",
        )
    return table


def results_table(
    totals: dict[Any, Any], windows: dict[Any, Any], produced: dict[str, int]
) -> Table:
    table = Table(title="clicks per user: produced / counted (latest 10 s window)")
    for column in ("user", "produced", "counted", "latest window"):
        table.add_column(column)
    for user in USERS:
        latest_window = max((w for w in windows if w[0] == user), default=None,
                            key=lambda w: w[1])
        window_text = "-"
        if latest_window is not None:
            start = time.strftime("%H:%M:%S", time.localtime(latest_window[1] / 1000))
            window_text = f"{windows[latest_window]} @ {start}"
        table.add_row(user, str(produced.get(user, 0)), str(totals.get(user, 0)), window_text)
    return table


async def run_demo(seconds_per_phase: float) -> int:
    state_root = Path(tempfile.mkdtemp(prefix="relay-demo-"))
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        console.print(f"[bold]embedded broker[/] on {bootstrap}; state under {state_root}")
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        # The status topic too: the demo reads it before the workers would create it.
        await ensure_topics(admin, [TopicSpec(CLICKS, 4), TopicSpec(WINDOWED, 1),
                                    TopicSpec(TOTALS, 1),
                                    TopicSpec(status_topic_name(APP_ID), 1, COMPACTED)])
        await admin.close()

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        await producer.start()
        produced: dict[str, int] = {}
        producing = True
        rng = random.Random(7)

        async def produce() -> None:
            while producing:
                for _ in range(20):
                    user = rng.choice(USERS)
                    await producer.send(CLICKS, key=msgpack.packb(user),
                                        value=msgpack.packb({"page": rng.randrange(50)}))
                    produced[user] = produced.get(user, 0) + 1
                await asyncio.sleep(0.1)

        workers = {"worker-a": start_worker("worker-a", bootstrap, state_root),
                   "worker-b": start_worker("worker-b", bootstrap, state_root)}
        status = Reader(bootstrap, status_topic_name(APP_ID), 1, raw_keys=True)
        totals = Reader(bootstrap, TOTALS, 1)
        windows = Reader(bootstrap, WINDOWED, 1)
        for reader in (status, totals, windows):
            await reader.start()

        async def show(seconds: float, headline: str) -> None:
            console.rule(headline)
            deadline = time.monotonic() + seconds
            last = 0.0
            while time.monotonic() < deadline:
                for reader in (status, totals, windows):
                    await reader.poll()
                if time.monotonic() - last > 5:
                    last = time.monotonic()
                    live = {k: v for k, v in status.latest.items()
                            if time.time() * 1000 - v["updated_ms"] < 4000}
                    names = {p.pid: name for name, p in workers.items()}
                    console.print(group_table(live, names))

        producer_task = asyncio.create_task(produce())
        try:
            await show(seconds_per_phase * 1.5, "two workers start and share the 4 tasks")
            console.print("[bold red]killing worker-b with SIGKILL[/]")
            workers["worker-b"].send_signal(signal.SIGKILL)
            workers["worker-b"].wait()
            await show(seconds_per_phase, "worker-a takes over from its standby copies")
            console.print("[bold green]worker-b comes back[/]")
            workers["worker-b"] = start_worker("worker-b", bootstrap, state_root)
            await show(seconds_per_phase, "worker-b rejoins")
            producing = False
            await producer_task
            await producer.flush()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and totals.latest != produced:
                await totals.poll()
                await windows.poll()
        finally:
            producing = False
            for process in workers.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in workers.values():
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
            for reader in (status, totals, windows):
                await reader.stop()
            await producer.stop()
        console.print(results_table(totals.latest, windows.latest, produced))
        total = sum(produced.values())
        if totals.latest == produced:
            console.print(f"[bold green]OK[/]: all {total} clicks counted exactly once, "
                          "across a crash and a rejoin")
            return 0
        console.print(f"[bold red]MISMATCH[/]: produced {produced}, counted {totals.latest}")
        return 1


def main() -> None:
    seconds = float(os.environ.get("RELAY_DEMO_PHASE_SECONDS", "25"))
    sys.exit(asyncio.run(run_demo(seconds)))


if __name__ == "__main__":
    main()
