"""``python -m benchmarks.scaling``: what scaling a stateful app costs, per strategy.

The same stateful app (per key a running count and the last payload; one output per record)
runs as worker processes on an embedded broker while a producer writes at a steady rate, and
the group changes: scale out by one instance, scale in by one, and a rolling restart of every
instance. Strategies:

- ``relay-learner``: Relay with learners and cooperative rebalancing; scale-in marks the
  instance leaving (``relay mark-leaving``), and it exits once it handed everything over;
- ``relay-stop-the-world``: Relay with ``rebalance_protocol=eager`` (every rebalance stops and
  closes every task; a moved task restores before it runs); scale-in as above;
- ``faust``: faust-streaming running the equivalent app (:mod:`benchmarks.scaling_faust_app`);
  it has no leaving mark, so scale-in stops the instance with SIGTERM (its graceful shutdown).

Each strategy gets a fresh broker and its own input topic, prefilled with the same records,
so every strategy starts from the same state. For each change the benchmark reports the
longest processing gap of a task that moved and of tasks that did not, the time until the
group is balanced again, the rebalances, the changelog records restored and the input records
processed twice; it writes JSON and a plot of throughput over time with the changes marked.

Everything is measured from the app's outputs (each names its task, process and time) and
from the members' status records (generation, tasks, records restored), which both frameworks
publish, so the strategies are measured the same way. The group counts as balanced when, over
the last ``--balance-window`` seconds, every task's outputs came from exactly one process,
those are exactly the running workers with loads within one task, and the members' status
agrees and shows nothing still moving (no learner, no restoring active, no leaving mark).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import shutil
import signal
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from benchmarks.scaling_analysis import (
    Phase,
    member_counters,
    processing_gaps,
    reprocessed_records,
    throughput,
)
from benchmarks.scaling_observe import (
    MemberStatus,
    OutputFollower,
    StatusFollower,
    faust_status,
    relay_status,
)
from benchmarks.scaling_plot import plot_throughput
from benchmarks.scaling_workers import FaustPool, PoolSettings, RelayPool, WorkerPool
from statestore.bulk_send import BoundedSender
from statestore.topics import COMPACTED, TopicSpec, ensure_topics
from streams.control import LeavingMark, control_topic_name, encode_mark
from streams.embedded_broker import EmbeddedBroker
from streams.status import status_topic_name

STRATEGIES = ("relay-learner", "relay-stop-the-world", "faust")
PHASES = ("scale-out", "scale-in", "rolling-restart")
#: Outputs reach the benchmark a little after they were processed; the balance check looks
#: at a window that ends this long before now.
OUTPUT_DELAY_S = 0.5
#: A task that produced nothing for this long was interrupted (the steady input gives every
#: task tens of records per second).
PAUSE_S = 1.0


@dataclass(frozen=True)
class Sizes:
    instances: int
    partitions: int
    keys: int
    records_per_task: int
    value_bytes: int
    rate: int

    @property
    def prefill_records(self) -> int:
        return self.records_per_task * self.partitions


class StrategyFailed(RuntimeError):
    """A strategy could not go on (a worker died, the group never balanced at start)."""


# -- input --------------------------------------------------------------------------------

def _record(seq: int, keys: int, blob: str) -> tuple[bytes, bytes]:
    return msgpack.packb(f"k{seq % keys}"), msgpack.packb({"blob": blob, "seq": seq})


async def prefill(bootstrap: str, topic: str, sizes: Sizes) -> float:
    """Write the records that become the app's state; returns records/s written."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20,
                                max_batch_size=512 * 1024)
    await producer.start()
    blob = "x" * sizes.value_bytes
    started = time.perf_counter()
    try:
        sender = BoundedSender(producer)
        for seq in range(sizes.prefill_records):
            key, value = _record(seq, sizes.keys, blob)
            await sender.send(topic, key=key, value=value)
        await sender.flush()
    finally:
        await producer.stop()
    return sizes.prefill_records / max(1e-9, time.perf_counter() - started)


@dataclass
class Written:
    """Input records written so far (prefill and steady traffic)."""

    count: int = 0


async def steady_traffic(bootstrap: str, topic: str, sizes: Sizes, stop: asyncio.Event,
                         written: Written) -> int:
    """Write ``sizes.rate`` records/s (same keys and payload size as the prefill) until
    ``stop``; returns how many were written."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    blob = "x" * sizes.value_bytes
    seq = sizes.prefill_records
    tick = 0.05
    started = time.monotonic()
    try:
        while not stop.is_set():
            # Catch up to the schedule rather than sleep a fixed tick: a busy machine slows
            # the loop, not the rate.
            due = sizes.prefill_records + int((time.monotonic() - started) * sizes.rate)
            while seq < due:
                key, value = _record(seq, sizes.keys, blob)
                await producer.send(topic, key=key, value=value)
                seq += 1
            written.count = seq
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), tick)
        await producer.flush()
    finally:
        await producer.stop()
    return seq - sizes.prefill_records


# -- the balance condition ----------------------------------------------------------------

def balance_problem(outputs: OutputFollower, members: list[MemberStatus], expected: set[int],
                    partitions: int, window_s: float) -> str | None:
    """Why the group is not balanced now, or None when it is."""
    now = time.time() - OUTPUT_DELAY_S
    owners = outputs.owners(now - window_s, now)
    tasks = {f"0_{p}" for p in range(partitions)}
    if set(owners) != tasks:
        return f"tasks without outputs: {sorted(tasks - set(owners))}"
    shared = sorted(t for t, pids in owners.items() if len(pids) > 1)
    if shared:
        return f"tasks processed by several processes: {shared}"
    load = Counter(next(iter(pids)) for pids in owners.values())
    if set(load) != expected and not (partitions < len(expected) and set(load) <= expected):
        return f"processing pids {sorted(load)} are not the running workers {sorted(expected)}"
    if max(load.values()) - min(load.values()) > 1:
        return f"uneven load {dict(load)}"
    if {m.pid for m in members} != expected:
        return f"members' pids {sorted({m.pid for m in members})} != {sorted(expected)}"
    if any(m.moving for m in members):
        return "learners, restoring tasks or a leaving mark"
    if len({m.generation for m in members}) != 1:
        return "members report different generations"
    status_owner = {t: m.pid for m in members for t in m.tasks}
    if any(status_owner.get(t) != next(iter(pids)) for t, pids in owners.items()):
        return "status and outputs disagree on owners"
    return None


# -- one strategy -------------------------------------------------------------------------

@dataclass
class Run:
    """One strategy's run: its workers, what it observes, its phases."""

    name: str
    pool: WorkerPool
    outputs: OutputFollower
    status: StatusFollower
    sizes: Sizes
    args: argparse.Namespace
    bootstrap: str
    app_id: str
    started: float = 0.0
    #: Workers handing over before they exit: the balanced group no longer includes them.
    leaving: set[int] = field(default_factory=set)

    async def wait_balanced(self, since: float, timeout_s: float) -> tuple[bool, float, str]:
        """Wait (up to ``timeout_s``) for balance; returns (balanced, since when, the last
        reason it was not). Balanced since the latest moment a task began running where it
        runs now (after a move or a pause), and not before ``since``."""
        deadline = time.monotonic() + timeout_s
        problem = "not checked"
        while time.monotonic() < deadline:
            self.check_workers()
            problem = balance_problem(self.outputs, self.status.live(),
                                      self.pool.pids() - self.leaving,
                                      self.sizes.partitions, self.args.balance_window) or ""
            if not problem:
                until = time.time() - OUTPUT_DELAY_S
                starts = self.outputs.run_starts(since, until, PAUSE_S)
                return True, max(starts.values(), default=since), ""
            await asyncio.sleep(0.25)
        return False, time.time(), problem

    def check_workers(self) -> None:
        for name, worker in self.pool.workers.items():
            code = worker.process.poll()
            if code is not None and not worker.may_exit:
                raise StrategyFailed(f"worker {name} (pid {worker.process.pid}) exited with "
                                     f"code {code}; see its log in {self.pool.settings.run_dir}")

    async def phase(self, title: str, action: Callable[[Phase], Awaitable[None]]) -> Phase:
        phase = Phase(title, time.time())
        await action(phase)
        if not phase.ended:
            phase.balanced, balanced_at, problem = await self.wait_balanced(
                phase.started, self.args.phase_timeout)
            phase.ended = balanced_at
            if not phase.balanced:
                phase.notes.append(f"not balanced within {self.args.phase_timeout:.0f}s: "
                                   f"{problem}")
        if phase.balanced:
            phase.seconds_to_balance = phase.ended - phase.started
        shown = "-" if phase.seconds_to_balance is None else f"{phase.seconds_to_balance:.1f}s"
        print(f"  {self.name}: {title}: balanced={phase.balanced} after {shown}", flush=True)
        return phase

    async def scale_out(self, phase: Phase) -> None:
        self.pool.start(f"w{self.sizes.instances + 1}")

    async def scale_in(self, phase: Phase) -> None:
        name = f"w{self.sizes.instances + 1}"
        pid = self.pool.pid(name)
        if isinstance(self.pool, FaustPool):
            # faust has no leaving mark: its graceful shutdown on SIGTERM is the scale-in.
            code = await self.pool.stop(name, timeout_s=self.args.phase_timeout)
            phase.notes.append(f"{name} stopped with SIGTERM (exit code {code})")
            return
        instance = next((m.key.rsplit("-thread-", 1)[0] for m in self.status.live()
                         if m.pid == pid), None)
        if instance is None:
            raise StrategyFailed(f"worker {name} (pid {pid}) publishes no status")
        await mark_leaving(self.bootstrap, self.app_id, instance)
        self.pool.workers[name].may_exit = True
        self.leaving.add(pid)
        phase.balanced, balanced_at, problem = await self.wait_balanced(
            phase.started, self.args.phase_timeout)
        phase.ended = balanced_at
        if not phase.balanced:
            phase.notes.append(f"not balanced within {self.args.phase_timeout:.0f}s: {problem}")
        deadline = time.monotonic() + self.args.phase_timeout
        while not self.pool.exited(name) and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
        if self.pool.exited(name):
            phase.notes.append(f"{name} exited by itself after handing over (exit code "
                               f"{self.pool.forget(name)})")
        else:
            code = await self.pool.stop(name)
            phase.notes.append(f"{name} did not exit after handing over; stopped with SIGTERM "
                               f"(exit code {code})")
        self.leaving.discard(pid)

    async def rolling_restart(self, phase: Phase) -> None:
        for name in sorted(self.pool.workers):
            stop_started = time.monotonic()
            code = await self.pool.stop(name, timeout_s=self.args.phase_timeout)
            stopped_after = time.monotonic() - stop_started
            self.pool.start(name)
            balanced, _, problem = await self.wait_balanced(phase.started,
                                                            self.args.phase_timeout)
            phase.notes.append(
                f"{name}: stopped in {stopped_after:.1f}s (exit code {code}), restarted, "
                + ("balanced again" if balanced else f"not balanced: {problem}"))

    def mark(self, phase: Phase, label: str) -> dict[str, Any]:
        return {"label": label, "at_s": phase.started - self.started,
                "balanced_at_s": (phase.ended - self.started) if phase.balanced else None}


async def mark_leaving(bootstrap: str, app_id: str, instance: str) -> None:
    """What ``relay mark-leaving`` does: the mark on the app's control topic."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(
            control_topic_name(app_id), key=instance.encode(),
            value=encode_mark(LeavingMark(int(time.time() * 1000), None)))
    finally:
        await producer.stop()


async def run_strategy(name: str, args: argparse.Namespace, sizes: Sizes, bootstrap: str,
                       run_dir: Path) -> dict[str, Any]:
    app_id = f"scaling-{name}-{uuid.uuid4().hex[:8]}"
    source, sink = f"{app_id}-in", f"{app_id}-out"
    faust = name == "faust"
    status_topic = f"{app_id}-faust-status" if faust else status_topic_name(app_id)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        specs = [TopicSpec(source, sizes.partitions), TopicSpec(sink, 1),
                 TopicSpec(status_topic, 1, COMPACTED)]
        if not faust:
            specs.append(TopicSpec(control_topic_name(app_id), 1, COMPACTED))
        await ensure_topics(admin, specs)
    finally:
        await admin.close()
    rate = await prefill(bootstrap, source, sizes)
    print(f"  {name}: prefilled {sizes.prefill_records:,} records of {sizes.value_bytes} B "
          f"({rate:,.0f}/s)", flush=True)
    settings = PoolSettings(bootstrap, app_id, source, sink, status_topic, sizes.partitions,
                            args.session_timeout_ms, args.standbys, run_dir / name)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    pool: WorkerPool = (
        FaustPool(settings) if faust else RelayPool(
            settings, "eager" if name == "relay-stop-the-world" else "cooperative",
            args.acceptable_lag, args.max_learners))
    outputs = OutputFollower(bootstrap, sink)
    status = StatusFollower(bootstrap, status_topic, faust_status if faust else relay_status)
    run = Run(name, pool, outputs, status, sizes, args, bootstrap, app_id)
    result: dict[str, Any] = {"strategy": name, "app_id": app_id, "error": None, "phases": [],
                              "marks": [], "throughput": [], "logs": str(settings.run_dir)}
    phases: list[Phase] = []
    stop_traffic = asyncio.Event()
    traffic: asyncio.Task[int] | None = None
    await outputs.start()
    await status.start()
    try:
        run.started = time.time()
        written = Written(sizes.prefill_records)
        traffic = asyncio.create_task(
            steady_traffic(bootstrap, source, sizes, stop_traffic, written))
        start = Phase(f"start {sizes.instances} instances and catch up with the input",
                      run.started)
        for i in range(1, sizes.instances + 1):
            pool.start(f"w{i}")
        # The steady state begins once the backlog (the prefill, and the steady input that
        # arrived meanwhile) has been processed: at most two seconds of input outstanding.
        deadline = time.monotonic() + args.start_timeout

        def caught_up() -> bool:
            return len(outputs.processed) >= written.count - 2 * sizes.rate

        while not caught_up() and time.monotonic() < deadline:
            run.check_workers()
            await asyncio.sleep(0.5)
        if not caught_up():
            raise StrategyFailed(f"the input backlog was not processed within "
                                 f"{args.start_timeout:.0f}s of the start")
        caught_up_at = time.time() - OUTPUT_DELAY_S
        start.balanced, balanced_at, problem = await run.wait_balanced(
            run.started, max(1.0, deadline - time.monotonic()))
        start.ended = max(balanced_at, caught_up_at)
        if not start.balanced:
            raise StrategyFailed(f"not balanced within {args.start_timeout:.0f}s of the start: "
                                 f"{problem}")
        start.seconds_to_balance = start.ended - start.started
        print(f"  {name}: started and balanced after {start.seconds_to_balance:.1f}s",
              flush=True)
        result["start"] = start
        actions = {"scale-out": ("scale out by one instance", "scale out", run.scale_out),
                   "scale-in": ("scale in by one instance", "scale in", run.scale_in),
                   "rolling-restart": ("rolling restart of every instance", "rolling restart",
                                       run.rolling_restart)}
        for key in args.phases:
            await asyncio.sleep(args.settle)  # a deliberate steady-state observation window
            title, label, action = actions[key]
            phase = await run.phase(title, action)
            phases.append(phase)
            result["marks"].append(run.mark(phase, label))
        await asyncio.sleep(args.settle)
    except Exception as exc:
        traceback.print_exc()
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"  {name}: FAILED: {result['error']}", flush=True)
    finally:
        stop_traffic.set()
        if traffic is not None:
            with contextlib.suppress(Exception):
                result["produced_steady"] = await traffic
        try:
            await pool.stop_all()
        finally:
            pool.kill_all()
            # The workers' stores are big and of no use after the run; their logs stay.
            shutil.rmtree(settings.run_dir / "state", ignore_errors=True)
        with contextlib.suppress(Exception):
            await outputs.caught_up()
            await status.caught_up()
        await outputs.stop()
        await status.stop()
    processing_gaps(phases, outputs.outputs)
    # Work a change causes may go on after the group is balanced (a last status record, a
    # follow-up rebalance): counters run until the next change starts.
    ends = [p.started for p in phases[1:]] + [time.time()]
    reprocessed_records(phases, outputs.outputs, ends)
    for phase, counted_until in zip(phases, ends, strict=True):
        member_counters(phase, status.history, counted_until)
    if "start" in result:
        first_change = phases[0].started if phases else time.time()
        member_counters(result["start"], status.history, first_change)
        result["start"] = asdict(result["start"])
    result["phases"] = [asdict(p) for p in phases]
    result["outputs"] = len(outputs.outputs)
    if args.save_outputs:
        # Every output, for questions the figures do not answer (who processed what, when).
        path = args.json.with_name(f"{args.json.stem}-{name}-outputs.csv.gz")
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as out:
            out.write("task,pid,t,seq\n")
            out.writelines(f"{o.task},{o.pid},{o.t:.4f},{o.seq}\n" for o in outputs.outputs)
        result["outputs_file"] = str(path)
    result["member_status"] = [
        {**asdict(m), "tasks": sorted(m.tasks)} for m in status.history]
    result["throughput"] = throughput(outputs.outputs, run.started)
    result["throughput_by_task"] = {
        f"0_{p}": throughput(outputs.outputs, run.started, f"0_{p}")
        for p in range(sizes.partitions)}
    return result


# -- the run ------------------------------------------------------------------------------

async def run_all(args: argparse.Namespace, sizes: Sizes) -> list[dict[str, Any]]:
    run_dir = Path(tempfile.mkdtemp(prefix="scaling-run-"))
    print(f"worker logs and state under {run_dir}", flush=True)
    results = []
    for name in args.strategies:
        print(f"strategy {name}", flush=True)
        broker = None if args.bootstrap else EmbeddedBroker().start()
        try:
            bootstrap = args.bootstrap or broker.bootstrap_servers  # type: ignore[union-attr]
            results.append(await run_strategy(name, args, sizes, bootstrap, run_dir))
        finally:
            if broker is not None:
                broker.stop()
    return results


def summary_lines(results: list[dict[str, Any]]) -> list[str]:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}s"

    lines = []
    for result in results:
        lines.append(f"\n{result['strategy']} ({result.get('outputs', 0):,} outputs)"
                     + (f" FAILED: {result['error']}" if result["error"] else ""))
        for p in result["phases"]:
            lines.append(
                f"  {p['name']}: balanced in {seconds(p['seconds_to_balance'])}, longest gap "
                f"moved {seconds(p['longest_gap_moved_s'])} ({len(p['moved_tasks'])} tasks), "
                f"unmoved {seconds(p['longest_gap_unmoved_s'])}, rebalances {p['rebalances']}, "
                f"restored {p['restored_records']:,}, reprocessed {p['reprocessed_records']:,}")
            lines.extend(f"    note: {note}" for note in p["notes"])
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_argument_group("sizes")
    size.add_argument("--instances", type=int, default=2, help="instances before scaling out")
    size.add_argument("--partitions", type=int, default=4, help="input partitions (tasks)")
    size.add_argument("--keys", type=int, default=40_000)
    size.add_argument("--records-per-task", type=int, default=50_000,
                      help="prefilled records per task: the changelog a moved task restores")
    size.add_argument("--value-bytes", type=int, default=8000)
    size.add_argument("--rate", type=int, default=400, help="steady input records/s")
    timing = parser.add_argument_group("timing")
    timing.add_argument("--settle", type=float, default=8.0,
                        help="seconds of steady state observed before each change and at end")
    timing.add_argument("--start-timeout", type=float, default=600.0,
                        help="deadline for the first balance (includes the prefill backlog)")
    timing.add_argument("--phase-timeout", type=float, default=240.0,
                        help="deadline for the group to balance again after a change")
    timing.add_argument("--balance-window", type=float, default=1.5,
                        help="seconds the balanced condition must hold")
    timing.add_argument("--session-timeout-ms", type=int, default=6000)
    relay = parser.add_argument_group("relay")
    relay.add_argument("--acceptable-lag", type=int, default=1000)
    relay.add_argument("--max-learners", type=int, default=2)
    parser.add_argument("--standbys", type=int, default=0,
                        help="standby copies per task (Relay num_standbys, faust "
                             "table_standby_replicas)")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    parser.add_argument("--save-outputs", action="store_true",
                        help="also write every output (task, pid, time, input sequence "
                             "number) beside the JSON, one gzipped CSV per strategy")
    parser.add_argument("--bootstrap", default=None,
                        help="an existing broker (default: a fresh embedded one per strategy)")
    parser.add_argument("--json", type=Path, default=Path("results/scaling.json"),
                        help="where to write the figures; the plot goes beside it (.png)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # SIGTERM ends a run like Ctrl-C does: workers and brokers are stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sizes = Sizes(args.instances, args.partitions, args.keys, args.records_per_task,
                  args.value_bytes, args.rate)
    started = time.time()
    results = asyncio.run(run_all(args, sizes))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    png = args.json.with_suffix(".png")
    args.json.write_text(json.dumps({
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "sizes": asdict(sizes), "wall_seconds": time.time() - started,
        "plot": str(png), "results": results}, indent=2))
    plot_throughput(results, sizes.rate, png)
    print("\n".join(summary_lines(results)))
    print(f"\nwrote {args.json} and {png} in {time.time() - started:.0f}s")


if __name__ == "__main__":
    main()
