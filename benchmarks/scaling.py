"""``python -m benchmarks.scaling``: the downtime of scaling, learner strategy vs stop-the-world.

On one broker and in one run, the same stateful app (:mod:`benchmarks.scaling_app`) runs as
worker processes while a producer writes at a steady rate, and the group changes: scale out
by one instance, scale in by one (marked leaving), and a rolling restart of every instance.
Strategies: Relay with learners and cooperative rebalancing, and Relay in plain
stop-the-world mode (``rebalance_protocol=eager``: every rebalance stops and closes every
task; a moved task restores before it runs). For each change it reports the longest
processing gap of a task that moved and of tasks that did not, the time until the group is
balanced again, the rebalances, and the records restored; it writes JSON and a plot of
throughput over time with the changes marked.

Everything is measured from the app's own output (each output names its task, process and
time), so the strategies are measured the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from statestore.topics import COMPACTED, TopicSpec, ensure_topics
from streams.broker import EmbeddedBroker
from streams.control import LeavingMark, control_topic_name, encode_mark
from streams.status import status_topic_name

STRATEGIES = {"relay-learner": "cooperative", "relay-stop-the-world": "eager"}


@dataclass
class Phase:
    name: str
    started: float
    ended: float = 0.0
    balanced: bool = False
    longest_gap_moved_s: float | None = None
    longest_gap_unmoved_s: float | None = None
    moved_tasks: list[str] = field(default_factory=list)
    rebalances: int = 0
    restored_records: int = 0

    @property
    def seconds_to_balance(self) -> float:
        return self.ended - self.started


class Status:
    """Follows the app's status topic: what every live member runs."""

    def __init__(self, bootstrap: str, app_id: str) -> None:
        self.latest: dict[str, dict[str, Any]] = {}
        self.history: list[dict[str, Any]] = []
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self._tp = TopicPartition(status_topic_name(app_id), 0)

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.assign([self._tp])
        await self._consumer.seek_to_beginning(self._tp)

    async def poll(self) -> None:
        batches = await self._consumer.getmany(timeout_ms=100)
        for records in batches.values():
            for r in records:
                key = r.key.decode()
                if r.value is None:
                    self.latest.pop(key, None)
                else:
                    value = msgpack.unpackb(r.value, raw=False)
                    self.latest[key] = value
                    self.history.append(value)

    def live(self) -> list[dict[str, Any]]:
        now = time.time() * 1000
        return [s for s in self.latest.values() if now - s["updated_ms"] < 3000]

    async def stop(self) -> None:
        await self._consumer.stop()


def balanced(members: list[dict[str, Any]], tasks: int) -> bool:
    if not members:
        return False
    owners: list[str] = [t for m in members for t in m["active"]]
    if sorted(owners) != sorted(set(owners)) or len(owners) != tasks:
        return False
    if any(m["restoring"] or m["learners"] for m in members):
        return False
    per_instance: dict[str, int] = defaultdict(int)
    for m in members:
        if not m["leaving"]:
            per_instance[m["instance_id"]] += len(m["active"])
    loads = list(per_instance.values())
    return bool(loads) and max(loads) - min(loads) <= 1 and not any(m["leaving"] for m in members)


class Workers:
    def __init__(self, bootstrap: str, app_id: str, topics: tuple[str, str], protocol: str,
                 state_root: Path, settings: dict[str, Any]) -> None:
        self.bootstrap, self.app_id, self.topics = bootstrap, app_id, topics
        self.protocol, self.state_root, self.settings = protocol, state_root, settings
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> None:
        env = {**os.environ, "RELAY_APPLICATION_ID": self.app_id, "BENCH_APP_ID": self.app_id,
               "BENCH_INPUT": self.topics[0], "BENCH_OUTPUT": self.topics[1],
               "RELAY_BOOTSTRAP_SERVERS": self.bootstrap,
               "RELAY_STATE_DIR": str(self.state_root / name),
               "RELAY_REBALANCE_PROTOCOL": self.protocol}
        env.update({f"RELAY_{k.upper()}": str(v) for k, v in self.settings.items()})
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "streams", "run", "benchmarks.scaling_app:app",
             "--log-level", "ERROR"], env=env)

    def stop(self, name: str, timeout: float = 60) -> None:
        process = self.processes.pop(name)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def pid(self, name: str) -> int:
        return self.processes[name].pid

    def stop_all(self) -> None:
        for name in list(self.processes):
            self.stop(name, timeout=30)


async def produce_prefill(bootstrap: str, topic: str, records: int, keys: int,
                          blob: str) -> float:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20,
                                max_batch_size=512 * 1024)
    await producer.start()
    start = time.perf_counter()
    try:
        pending = []
        for i in range(records):
            pending.append(await producer.send(
                topic, key=msgpack.packb(f"k{i % keys}"), value=msgpack.packb({"blob": blob})))
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return records / (time.perf_counter() - start)


async def steady_traffic(bootstrap: str, topic: str, rate: int, keys: int, stop: asyncio.Event,
                         counter: list[int]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        tick = 0.05
        per_tick = max(1, int(rate * tick))
        n = 0
        while not stop.is_set():
            started = time.monotonic()
            for _ in range(per_tick):
                await producer.send(topic, key=msgpack.packb(f"k{n % keys}"),
                                    value=msgpack.packb({"blob": "x"}))
                n += 1
            counter[0] = n
            await asyncio.sleep(max(0.0, tick - (time.monotonic() - started)))
        await producer.flush()
    finally:
        await producer.stop()


async def read_outputs(bootstrap: str, topic: str) -> list[tuple[str, int, float]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                max_partition_fetch_bytes=16 * 1024 * 1024)
    await consumer.start()
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    out: list[tuple[str, int, float]] = []
    try:
        idle = 0
        while idle < 3:
            batches = await consumer.getmany(timeout_ms=500, max_records=50_000)
            if not any(batches.values()):
                idle += 1
                continue
            idle = 0
            for records in batches.values():
                for r in records:
                    v = msgpack.unpackb(r.value, raw=False)
                    out.append((v["task"], v["pid"], v["t"]))
    finally:
        await consumer.stop()
    return out


def analyse(phases: list[Phase], outputs: list[tuple[str, int, float]]) -> None:
    by_task: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for task, pid, t in outputs:
        by_task[task].append((t, pid))
    for series in by_task.values():
        series.sort()
    for phase in phases:
        moved_gaps, unmoved_gaps, moved = [], [], []
        for task, series in sorted(by_task.items()):
            before = [p for t, p in series if t < phase.started]
            inside = [(t, p) for t, p in series if phase.started <= t <= phase.ended]
            pids = {p for _, p in inside} | ({before[-1]} if before else set())
            times = ([t for t, _ in series if t < phase.started][-1:]
                     + [t for t, _ in inside])
            gaps = [b - a for a, b in itertools.pairwise(times)]
            if not inside:
                gaps.append(phase.ended - (times[-1] if times else phase.started))
            gap = max(gaps, default=0.0)
            if len(pids) > 1:
                moved.append(task)
                moved_gaps.append(gap)
            else:
                unmoved_gaps.append(gap)
        phase.moved_tasks = moved
        phase.longest_gap_moved_s = max(moved_gaps, default=None)
        phase.longest_gap_unmoved_s = max(unmoved_gaps, default=None)


async def wait_balanced(status: Status, tasks: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await status.poll()
        if balanced(status.live(), tasks):
            return True
    return False


def phase_counters(status: Status, phase: Phase, since_ms: float) -> None:
    seen = [s for s in status.history if s["updated_ms"] >= since_ms]
    generations = {s["generation"] for s in seen if s["generation"] >= 0}
    phase.rebalances = max(0, len(generations) - 1)
    restored: dict[tuple[int, int], int] = {}
    first: dict[tuple[int, int], int] = {}
    for s in status.history:
        key = (s["pid"], s["thread"])
        if s["updated_ms"] < since_ms:
            first[key] = s.get("restored_records", 0)
        else:
            restored[key] = s.get("restored_records", 0)
    phase.restored_records = sum(v - first.get(k, 0) for k, v in restored.items())


async def run_strategy(name: str, protocol: str, args: argparse.Namespace, bootstrap: str,
                       source: str, state_root: Path) -> dict[str, Any]:
    app_id = f"scaling-{name}-{int(time.time())}"
    sink = f"{app_id}-out"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await ensure_topics(admin, [TopicSpec(sink, 1),
                                TopicSpec(status_topic_name(app_id), 1, COMPACTED),
                                TopicSpec(control_topic_name(app_id), 1, COMPACTED)])
    await admin.close()
    settings = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000,
                "commit_interval_ms": 500, "acceptable_lag": args.acceptable_lag,
                "max_learners": args.max_learners}
    workers = Workers(bootstrap, app_id, (source, sink), protocol, state_root / name, settings)
    status = Status(bootstrap, app_id)
    await status.start()
    phases: list[Phase] = []
    stop_traffic = asyncio.Event()
    produced = [0]
    traffic: asyncio.Task[None] | None = None
    try:
        started = time.time()
        workers.start("w1")
        workers.start("w2")
        initial = Phase("start with two instances (prefilled state)", started)
        initial.balanced = await wait_balanced(status, args.partitions, args.timeout)
        initial.ended = time.time()
        traffic = asyncio.create_task(steady_traffic(
            bootstrap, source, args.rate, args.keys, stop_traffic, produced))
        await asyncio.sleep(args.settle)

        async def change(title: str, action: Any) -> None:
            phase = Phase(title, time.time())
            await action()
            phase.balanced = await wait_balanced(status, args.partitions, args.timeout)
            phase.ended = time.time()
            phase_counters(status, phase, phase.started * 1000)
            phases.append(phase)
            print(f"  {name}: {title}: balanced={phase.balanced} after "
                  f"{phase.seconds_to_balance:.1f}s", flush=True)
            await asyncio.sleep(args.settle)

        async def scale_out() -> None:
            workers.start("w3")

        async def scale_in() -> None:
            instance = next((s["instance_id"] for s in status.live()
                             if s["pid"] == workers.pid("w3")), None)
            if instance is None:
                raise RuntimeError("instance w3 is not in the status topic")
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
            await producer.start()
            await producer.send_and_wait(
                control_topic_name(app_id), key=instance.encode(),
                value=encode_mark(LeavingMark(int(time.time() * 1000), None)))
            await producer.stop()
            deadline = time.monotonic() + args.timeout
            while workers.processes["w3"].poll() is None and time.monotonic() < deadline:
                await status.poll()
            workers.stop("w3")

        async def rolling_restart() -> None:
            for worker in ("w1", "w2"):
                workers.stop(worker)
                workers.start(worker)
                await wait_balanced(status, args.partitions, args.timeout)

        await change("scale out by one instance", scale_out)
        await change("scale in by one instance (marked leaving)", scale_in)
        await change("rolling restart of every instance", rolling_restart)
    finally:
        stop_traffic.set()
        if traffic is not None:
            await traffic
        workers.stop_all()
        await status.stop()
    outputs = await read_outputs(bootstrap, sink)
    analyse(phases, outputs)
    return {"strategy": name, "rebalance_protocol": protocol, "initial": asdict(initial),
            "phases": [asdict(p) | {"seconds_to_balance": p.seconds_to_balance}
                       for p in phases],
            "outputs": len(outputs), "produced_steady": produced[0],
            "throughput": throughput(outputs, started),
            "phase_marks": [(p.name, p.started - started) for p in phases]}


def throughput(outputs: list[tuple[str, int, float]], started: float) -> list[int]:
    buckets: dict[int, int] = defaultdict(int)
    for _, _, t in outputs:
        buckets[int(t - started)] += 1
    return [buckets.get(i, 0) for i in range(max(buckets, default=0) + 1)]


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(11, 3.2 * len(results)), squeeze=False)
    for ax, result in zip(axes[:, 0], results, strict=True):
        ax.plot(result["throughput"], linewidth=0.8)
        for name, at in result["phase_marks"]:
            ax.axvline(at, color="red", linestyle="--", linewidth=0.8)
            ax.text(at, ax.get_ylim()[1] * 0.9, name.split(" (")[0], fontsize=7, rotation=90)
        ax.set_title(result["strategy"])
        ax.set_ylabel("records/s processed")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = EmbeddedBroker().start()
        bootstrap = broker.bootstrap_servers
    try:
        source = f"scaling-in-{int(time.time())}"
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        await ensure_topics(admin, [TopicSpec(source, args.partitions)])
        await admin.close()
        blob = "x" * args.value_bytes
        rate = await produce_prefill(bootstrap, source, args.records, args.keys, blob)
        print(f"prefilled {args.records:,} records of {args.value_bytes} B ({rate:,.0f}/s)")
        state_root = Path(tempfile.mkdtemp(prefix="relay-scaling-"))
        results = []
        for name in args.strategies:
            print(f"strategy {name}")
            results.append(await run_strategy(name, STRATEGIES[name], args, bootstrap, source,
                                              state_root))
        return results
    finally:
        if broker is not None:
            broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000,
                        help="records written before the run: the state to restore")
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rate", type=int, default=500, help="steady records/s")
    parser.add_argument("--acceptable-lag", type=int, default=1000)
    parser.add_argument("--max-learners", type=int, default=2)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES),
                        choices=list(STRATEGIES))
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--json", type=Path, default=Path("results/scaling.json"))
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                     "results": results}, indent=2))
    png = args.json.with_suffix(".png")
    plot(results, png)
    for result in results:
        print(f"\n{result['strategy']} ({result['outputs']:,} outputs)")
        for p in result["phases"]:
            moved = p["longest_gap_moved_s"]
            unmoved = p["longest_gap_unmoved_s"]
            print(f"  {p['name']}: balanced in {p['seconds_to_balance']:.1f}s, "
                  f"longest gap moved {'-' if moved is None else f'{moved:.1f}s'} "
                  f"({len(p['moved_tasks'])} tasks), unmoved "
                  f"{'-' if unmoved is None else f'{unmoved:.1f}s'}, rebalances "
                  f"{p['rebalances']}, restored {p['restored_records']:,} records")
    print(f"\nwrote {args.json} and {png}")


if __name__ == "__main__":
    main()
