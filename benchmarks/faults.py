"""The fault benchmark: two apps on worker processes under steady input while faults hit
them, and every output checked against an independent computation from the input.

``python -m benchmarks.faults --json results/faults.json [--minutes 10] [--seed N]
[--faults kill stop …] [--processing-guarantee G]``

Apps (:mod:`benchmarks.faults_apps`), each on ``--workers`` processes of ``--threads``
threads, against a fresh broker of ``--engine`` (or ``--bootstrap``): ``orders`` (a repartition by
user, a running total, 1-minute windowed counts, a stream-table join with ``users``) and
``counts`` (a count per key). After a warm-up (every task produced an output), a fault every
30 to 60 s (``--fault-interval``) until the input stops, random kills between the others:

- ``kill``: SIGKILL a random worker, restart it 1 to 5 s later;
- ``stop``: SIGSTOP a worker for 1.5 session timeouts, then SIGCONT;
- ``kill-restoring``: a worker loses its state directory and restarts; the first member
  seen restoring an active task, or that worker as soon as it holds any copy (each one
  rebuilt from its changelog in full), is SIGKILLed and restarted;
- ``kill-handover``: a worker is killed and restarted (so tasks move back to it through
  learners); the first member seen with a learner, or the owner of the learned task, is
  SIGKILLed and restarted;
- ``kill-leaving``: ``relay mark-leaving`` for a worker's instance, SIGKILL of it while it
  hands over, restart;
- ``corrupt-sst``, ``corrupt-current``: a worker stopped (SIGTERM), one of its stores
  corrupted (an SST file truncated to half, garbage in RocksDB's ``CURRENT``), restarted;
- ``disk-full``: the state directory of one worker (a tmpfs of ``--disk-mb``, mounted at
  the start; root only) filled for 20 s and freed; a worker that exits is restarted then;
- ``broker-kill``, ``broker-stop``, ``broker-rolling`` (``--engine kafka``, 3 nodes; see
  :mod:`benchmarks.faults_broker`): SIGKILL of the broker that coordinates the groups and
  leads the most input and changelog partitions, restarted 10 to 20 s later; SIGSTOP of a
  broker for 1.5 times the longer of its session and the workers'; every broker restarted
  in turn. Not run on the embedded broker (the report says why).

``--engine kafka|tansu`` (default tansu) starts that broker; on Apache Kafka the fault suite
runs on ``--kafka-nodes`` (default 3) nodes. Before the apps start, a probe group measures
the broker's join round, and the stall limit is the session timeout plus that round.

``--static`` gives each worker a static instance id (its name, so ``orders-w2``'s threads join
as ``orders-w2-thread-<n>``), as a deployment with static membership does. ``--script`` replaces
the random schedule with given faults, one per ``--fault-interval``, in order:
``kill:WORKER:DELAY_S`` (SIGKILL, restart DELAY_S later) and ``stop:WORKER:PAUSE_S`` (SIGSTOP for
PAUSE_S, then SIGCONT); WORKER is a worker's name or ``wN``, the N-th worker of the first app.
The static soak: ``--apps orders --static --rate 2000 --minutes 4.5 --fault-interval 40 40
--script kill:w2:5 kill:w3:2 kill:w2:20 stop:w3:25 kill:w3:2``. A stall's limit is the session
timeout plus one join round, plus the restart delay of a kill whose worker came back within
its session (its static member is still in the group, so nothing moves until it returns).

Faults other than kills come first in that order, each followed by a kill; one that cannot
run here is noted at once, one the input ended before is noted as not reached.

After the input stops, every worker runs again and the outputs are drained (until exact, or
nothing new for 20 s with nothing under, or ``--drain`` seconds). Reported per app and
output: cases exact, over and under (and by how much), each task's longest output stall
while input flowed, rebalances (generations the members published), dead letters, worker
exits; and the timeline of faults. A fault that fails or is not triggered is reported as
such, and the run goes on; the JSON is written whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from benchmarks.broker_engine import (
    add_engine_arguments,
    describe,
    engine_label,
    measure_join_round,
    rounds_dict,
    start_broker,
)
from benchmarks.faults_broker import (
    BROKER_SESSION_S,
    BrokerFaultUnavailable,
    Roles,
    kill_leader,
    require_cluster,
    roles_now,
    rolling_restart,
    stop_node,
)
from benchmarks.faults_check import (
    Exactness,
    applied_faults,
    compare_latest,
    compare_occurrences,
    gaps,
    longest_stalls,
    rebalances,
    stalls_per_fault,
)
from benchmarks.scaling import mark_leaving
from benchmarks.scaling_workers import PoolSettings, WorkerPool
from statestore.topics import COMPACTED, TopicSpec, ensure_topics, existing_partition_counts
from streams.config import AppConfig
from streams.group.control import control_topic_name
from streams.group.status_topic import status_topic_name
from streams.kafka.driver import read_committed_by_markers
from streams.testing.apache_kafka import KafkaCluster

BROKER_FAULTS = ("broker-kill", "broker-stop", "broker-rolling")
ALL_FAULTS = ("kill", "stop", "kill-restoring", "kill-handover", "kill-leaving", "corrupt-sst",
              "corrupt-current", "disk-full", *BROKER_FAULTS)
#: The order the faults other than plain kills come in (kills go between them).
SPECIAL_ORDER = ("broker-kill", "stop", "corrupt-sst", "broker-stop", "kill-restoring",
                 "disk-full", "broker-rolling", "kill-handover", "corrupt-current",
                 "kill-leaving")
APPS = ("orders", "counts")
#: Why the broker faults do not run on the embedded broker.
NOT_ON_TANSU = (
    "not run: needs --engine kafka (a 3-node cluster this benchmark starts); the embedded "
    "broker is one process whose memory engine loses every topic, offset and group on "
    "restart, and Tansu's s3:// engine survives one only with an S3-compatible server that "
    "this project does not depend on")


# -- worker processes ---------------------------------------------------------------------------


#: Output gaps at least this long are listed in the report (``gaps``), for reading against the
#: workers' logs.
GAP_REPORTED_S = 3.0

#: Not a Relay setting: tells the pool to give each worker its name as static instance id.
STATIC_SETTING = "BENCH_STATIC_MEMBERS"


@dataclasses.dataclass(frozen=True)
class ScriptedFault:
    """One fault of ``--script``: what, to which worker, and for how long."""

    kind: str
    worker: str
    seconds: float


def parse_script_entry(text: str) -> ScriptedFault:
    """``kill:w2:5`` or ``stop:orders-w3:25``; raises ``argparse.ArgumentTypeError``."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in ("kill", "stop"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a scripted fault is kill:WORKER:DELAY_S or stop:WORKER:PAUSE_S")
    try:
        seconds = float(parts[2])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {parts[2]!r} is not a number of "
                                         "seconds") from None
    if seconds < 0 or not parts[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: needs a worker and seconds >= 0")
    return ScriptedFault(parts[0], parts[1], seconds)


def stall_limit_s(session_s: float, join_round_s: float,
                  scripted: list[ScriptedFault]) -> float:
    """Session timeout + one join round, + the longest restart delay of a kill whose worker
    came back within its session (its static member never left, so its tasks wait for it)."""
    within = [f.seconds for f in scripted if f.kind == "kill" and f.seconds < session_s]
    return session_s + join_round_s + max(within, default=0.0)


class FaultPool(WorkerPool):
    """Workers of one app of :mod:`benchmarks.faults_apps`."""

    def __init__(self, settings: PoolSettings, app: str, topics: dict[str, str],
                 relay_settings: dict[str, str]) -> None:
        super().__init__(settings)
        self.app = app
        self.topics = topics
        self.relay_settings = relay_settings

    def command(self) -> list[str]:
        return [sys.executable, "-m", "streams", "run", f"benchmarks.faults_apps:{self.app}",
                "--log-level", "INFO"]

    def environment(self, name: str) -> dict[str, str]:
        static = ({"RELAY_GROUP_INSTANCE_ID": name}
                  if self.relay_settings.get(STATIC_SETTING) else {})
        settings = {k: v for k, v in self.relay_settings.items() if k != STATIC_SETTING}
        return {**self.topics, **settings, **static,
                "RELAY_STATE_DIR": str(self.state_dir(name))}


# -- following the broker -----------------------------------------------------------------------


class Tail:
    """Reads every partition of some topics from their beginning, in the background."""

    def __init__(self, bootstrap: str, topics: dict[str, int], committed: bool = False) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False,
            max_partition_fetch_bytes=4 * 1024 * 1024)
        #: Committed records only (exactly-once outputs), read by their markers.
        self.committed = committed
        self._tps = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
        self._task: asyncio.Task[None] | None = None
        self.records = 0
        self.last_record_at = time.time()

    async def start(self) -> None:
        await self._consumer.start()
        if self.committed:
            read_committed_by_markers(self._consumer)
        self._consumer.assign(self._tps)
        await self._consumer.seek_to_beginning(*self._tps)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=200, max_records=20_000)
            for tp, records in batches.items():
                for record in records:
                    self.records += 1
                    self.last_record_at = time.time()
                    self.handle(tp.topic, record)

    def handle(self, topic: str, record: Any) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._consumer.stop()


class StatusTail(Tail):
    """Every member's latest status record, and the generations they published."""

    def __init__(self, bootstrap: str, app_id: str) -> None:
        super().__init__(bootstrap, {status_topic_name(app_id): 1})
        self.latest: dict[str, dict[str, Any]] = {}
        #: ``(time, generation)`` of every status record.
        self.generations: list[tuple[float, int]] = []
        #: Each member's rounds as it measured them (join to assignment applied), once each.
        self.rounds: dict[tuple[str, float], None] = {}

    def handle(self, topic: str, record: Any) -> None:
        key = record.key.decode(errors="replace") if record.key else "?"
        if key.startswith("__"):
            return
        if record.value is None:
            self.latest.pop(key, None)
            return
        with contextlib.suppress(Exception):
            status = msgpack.unpackb(record.value, raw=False)
            self.latest[key] = status
            self.generations.append((time.time(), int(status["generation"])))
            if isinstance(status.get("last_round_s"), int | float):
                self.rounds[(f"{key}/{status.get('incarnation')}/{status.get('rebalances')}",
                             float(status["last_round_s"]))] = None

    def live(self, fresh_s: float = 3.0) -> list[dict[str, Any]]:
        now_ms = time.time() * 1000
        return [s for s in self.latest.values() if now_ms - s["updated_ms"] < fresh_s * 1000]


class Outputs(Tail):
    """The outputs of one app, reduced as they arrive: the latest value per key, how often
    each order came out of the join (and with what), and when each task produced."""

    def __init__(self, bootstrap: str, sinks: dict[str, str], partitions: int,
                 committed: bool = False) -> None:
        super().__init__(bootstrap, {topic: partitions for topic in sinks.values()}, committed)
        self.kind = {topic: kind for kind, topic in sinks.items()}
        self.latest: dict[str, dict[Any, int]] = {kind: {} for kind in sinks}
        self.joined: Counter[int] = Counter()
        self.joined_wrong = 0
        self.times: dict[str, list[float]] = {}
        self.expected_names: dict[str, str] = {}
        self.amounts: dict[int, tuple[str, int]] = {}

    def _at(self, task: str, t: float) -> None:
        self.times.setdefault(task, []).append(t)

    def handle(self, topic: str, record: Any) -> None:
        kind = self.kind[topic]
        key = msgpack.unpackb(record.key, raw=False)
        out = msgpack.unpackb(record.value, raw=False)
        self._at(out["task"], out["t"])
        if kind == "named":
            order = out["v"]
            self.joined[order["id"]] += 1
            self._at(order["src"], order["src_t"])
            expected = self.amounts.get(order["id"])
            if expected is not None and (expected[0] != key or expected[1] != order["amount"]
                                         or order["name"] != f"name-{key}"):
                self.joined_wrong += 1
        elif kind == "per_minute":
            self.latest[kind][(key[0], key[1])] = out["v"]
        else:
            self.latest[kind][key] = out["v"]


# -- input --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Produced:
    """What the benchmark wrote, and from it, what each output must be."""

    totals: dict[str, int] = dataclasses.field(default_factory=dict)
    per_minute: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)
    orders: dict[int, tuple[str, int]] = dataclasses.field(default_factory=dict)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)


class Input:
    """Steady input: ``rate`` orders and ``rate`` counted records per second, in tenths."""

    def __init__(self, bootstrap: str, topics: dict[str, str], apps: tuple[str, ...],
                 rate: int, users: int, keys: int, rng: random.Random,
                 idempotent: bool = True) -> None:
        self.bootstrap, self.topics, self.apps = bootstrap, topics, apps
        self.rate, self.users, self.keys, self.rng = rate, users, keys, rng
        self.produced = Produced()
        self.failed_sends = 0
        self._stop = asyncio.Event()
        # Idempotent (so acks=all): an acknowledged record survives a leader's crash, and a
        # retried send is not written twice, so what was acknowledged is what went in. Not
        # on the embedded broker: Tansu rejects aiokafka's InitProducerId (v0), and its one
        # node has no leader to lose.
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5,
                                          acks="all", enable_idempotence=idempotent)
        self._next_order = 0
        self._task: asyncio.Task[None] | None = None
        self.started_at = self.stopped_at = 0.0

    async def start(self) -> None:
        await self._producer.start()
        if "orders" in self.apps:
            futures = [await self._producer.send(
                self.topics["users"], key=msgpack.packb(f"u{i}"),
                value=msgpack.packb({"name": f"name-u{i}"})) for i in range(self.users)]
            await asyncio.gather(*futures)
        self.started_at = time.time()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        per_tick = max(1, self.rate // 10)
        tick = 0
        while not self._stop.is_set():
            sent: list[tuple[asyncio.Future[Any], str, Any]] = []
            now_ms = int(time.time() * 1000)
            for _ in range(per_tick):
                if "orders" in self.apps:
                    oid = self._next_order
                    self._next_order += 1
                    order = {"id": oid, "user": f"u{self.rng.randrange(self.users)}",
                             "amount": self.rng.randint(1, 100)}
                    future = await self._producer.send(
                        self.topics["orders"], key=msgpack.packb(oid),
                        value=msgpack.packb(order), timestamp_ms=now_ms)
                    sent.append((future, "order", (order, now_ms)))
                if "counts" in self.apps:
                    key = f"k{self.rng.randrange(self.keys)}"
                    future = await self._producer.send(
                        self.topics["counts_in"], key=msgpack.packb(key),
                        value=msgpack.packb(tick))
                    sent.append((future, "count", key))
            for future, what, item in sent:
                try:
                    await future
                except Exception:
                    self.failed_sends += 1
                    continue
                self._record(what, item)
            tick += 1
            # Steady pace from the start, whatever the sends cost.
            await asyncio.sleep(max(0.0, self.started_at + tick / 10 - time.time()))

    def _record(self, what: str, item: Any) -> None:
        p = self.produced
        if what == "count":
            p.counts[item] = p.counts.get(item, 0) + 1
            return
        order, ts = item
        user = order["user"]
        p.totals[user] = p.totals.get(user, 0) + order["amount"]
        window = (user, ts // 60_000 * 60_000)
        p.per_minute[window] = p.per_minute.get(window, 0) + 1
        p.orders[order["id"]] = (user, order["amount"])

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        self.stopped_at = time.time()
        await self._producer.stop()


# -- the run ------------------------------------------------------------------------------------


class FaultFailed(RuntimeError):
    """A fault could not be applied as planned (the timeline says what it did)."""


@dataclasses.dataclass
class AppRun:
    name: str
    app_id: str
    pool: FaultPool
    status: StatusTail
    outputs: Outputs
    expected_tasks: set[str]
    exits: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class Bench:
    def __init__(self, args: argparse.Namespace, bootstrap: str, run_dir: Path,
                 cluster: KafkaCluster | None = None) -> None:
        self.args = args
        self.bootstrap = bootstrap
        self.run_dir = run_dir
        #: The Apache Kafka cluster this run started (the broker faults hit its nodes).
        self.cluster = cluster
        #: Faults that cannot run here, with why.
        self.not_run: dict[str, str] = {}
        try:
            require_cluster(cluster)
        except BrokerFaultUnavailable as exc:
            reason = NOT_ON_TANSU if args.engine == "tansu" and not args.bootstrap else (
                f"not run: {exc}")
            self.not_run = dict.fromkeys(BROKER_FAULTS, reason)
        self.rng = random.Random(args.seed)
        self.t0 = time.time()
        self.apps: dict[str, AppRun] = {}
        self.timeline: list[dict[str, Any]] = []
        #: Workers a fault is handling: the monitor leaves them alone.
        self.held: set[str] = set()
        self.disk: Path | None = None
        self.disk_error: str | None = None
        self.disk_worker: str | None = None
        #: The apps' topics by role (``orders``, ``users``, ``counts_in``).
        self.topics: dict[str, str] = {}

    def now(self) -> float:
        return round(time.time() - self.t0, 1)

    def note(self, entry: dict[str, Any]) -> dict[str, Any]:
        entry = {"at_s": self.now(), **entry}
        self.timeline.append(entry)
        worker = f" {entry.get('worker', '')}" if entry.get("worker") else ""
        print(f"  {entry['at_s']:7.1f}s {entry.get('fault') or entry.get('event')}{worker}: "
              f"{entry.get('detail', '')}", flush=True)
        return entry

    # -- workers ------------------------------------------------------------------------------

    def app_of(self, worker: str) -> AppRun:
        return self.apps[worker.split("-w")[0]]

    def running_workers(self) -> list[str]:
        return sorted(name for run in self.apps.values() for name in run.pool.workers
                      if name not in self.held and not run.pool.exited(name))

    def start(self, worker: str) -> int:
        return self.app_of(worker).pool.start(worker)

    async def kill(self, worker: str) -> int:
        """SIGKILL and reap; returns the pid it had."""
        pool = self.app_of(worker).pool
        process = pool.workers[worker].process
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
        while process.poll() is None:
            await asyncio.sleep(0.05)
        pool.forget(worker)
        return process.pid

    async def restart_later(self, worker: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self.start(worker)

    def member_of(self, worker: str) -> dict[str, Any] | None:
        run = self.app_of(worker)
        pid = run.pool.pid(worker)
        return next((s for s in run.status.live() if s["pid"] == pid), None)

    def worker_by_pid(self, run: AppRun, pid: int) -> str | None:
        return next((n for n, w in run.pool.workers.items() if w.process.pid == pid), None)

    async def monitor(self) -> None:
        """Restart a worker that exited on its own (after noting why)."""
        while True:
            await asyncio.sleep(0.5)
            for run in self.apps.values():
                for name in list(run.pool.workers):
                    if name in self.held or not run.pool.exited(name):
                        continue
                    code = run.pool.forget(name)
                    exit_entry = {"at_s": self.now(), "worker": name, "code": code}
                    run.exits.append(exit_entry)
                    self.note({"event": "worker exited", "worker": name,
                               "detail": f"exit code {code}; restarted in 3 s"})
                    self.held.add(name)
                    await asyncio.sleep(3)
                    self.held.discard(name)
                    self.start(name)

    # -- faults -------------------------------------------------------------------------------

    def worker_named(self, name: str) -> str:
        """A scripted fault's worker: a worker's name, or ``wN`` of the first app."""
        if name in {w for run in self.apps.values() for w in run.pool.workers}:
            return name
        first = next(iter(self.apps))
        return f"{first}-{name}" if name.startswith("w") else name

    async def scripted(self, until: float) -> None:
        """``--script``'s faults in order, one per ``--fault-interval``."""
        low, high = self.args.fault_interval
        took = 0.0
        for fault in self.args.script:
            await asyncio.sleep(max(low / 4, self.rng.uniform(low, high) - took))
            if time.time() >= until:
                self.note({"fault": fault.kind, "status": "not reached",
                           "detail": "the input ended before its turn"})
                continue
            worker = self.worker_named(fault.worker)
            entry: dict[str, Any] = {"at_s": self.now(), "fault": fault.kind,
                                     "status": "applied", "worker": worker}
            started = time.time()
            try:
                if worker not in self.running_workers():
                    raise FaultFailed(f"{worker} is not running")
                if fault.kind == "kill":
                    await self.kill_for(worker, fault.seconds, entry)
                else:
                    await self.stop_for(worker, fault.seconds, entry)
            except FaultFailed as exc:
                entry.update(status="not triggered", detail=str(exc))
            except Exception as exc:
                entry.update(status="failed", detail=f"{type(exc).__name__}: {exc}")
            took = time.time() - started
            entry["end_s"] = self.now()
            self.note(entry)

    def schedule(self) -> list[str]:
        """The faults in order: each fault other than a plain kill, a kill after each
        (kills only once those are done). A fault that cannot run here is noted at once
        and takes no slot."""
        chosen = [f for f in self.args.faults if f in ALL_FAULTS]
        specials = [f for f in SPECIAL_ORDER if f in chosen and f not in self.not_run]
        for fault in SPECIAL_ORDER:
            if fault in chosen and fault in self.not_run:
                self.note({"fault": fault, "status": "not run",
                           "detail": self.not_run[fault]})
        if "kill" not in chosen:
            return specials
        plan: list[str] = []
        for special in specials:
            plan += [special, "kill"]
        return plan or ["kill"]

    async def faults(self, until: float) -> None:
        """A fault every ``--fault-interval`` seconds (start to start) until ``until``."""
        plan = self.schedule()
        if not plan:
            return
        low, high = self.args.fault_interval
        i = 0
        took = 0.0
        while True:
            await asyncio.sleep(max(low / 4, self.rng.uniform(low, high) - took))
            if time.time() >= until:
                break
            fault = plan[i] if i < len(plan) else ("kill" if "kill" in plan
                                                   else plan[i % len(plan)])
            i += 1
            entry: dict[str, Any] = {"at_s": self.now(), "fault": fault, "status": "applied"}
            started = time.time()
            try:
                await getattr(self, "fault_" + fault.replace("-", "_"))(entry)
            except FaultFailed as exc:
                entry.update(status="not triggered", detail=str(exc))
            except Exception as exc:
                entry.update(status="failed", detail=f"{type(exc).__name__}: {exc}")
            took = time.time() - started
            entry["end_s"] = self.now()
            self.note(entry)
        for fault in dict.fromkeys(plan[i:]):
            if fault not in {e.get("fault") for e in self.timeline}:
                self.note({"fault": fault, "status": "not reached",
                           "detail": "the input ended before its turn"})

    def pick(self, apps: tuple[str, ...] = APPS) -> str:
        candidates = [w for w in self.running_workers() if w.split("-w")[0] in apps]
        if not candidates:
            raise FaultFailed("no running worker to pick")
        return self.rng.choice(candidates)

    async def fault_kill(self, entry: dict[str, Any]) -> None:
        await self.kill_for(self.pick(), self.rng.uniform(1, 5), entry)

    async def kill_for(self, worker: str, delay: float, entry: dict[str, Any]) -> None:
        self.held.add(worker)
        try:
            pid = await self.kill(worker)
            await asyncio.sleep(delay)
            self.start(worker)
        finally:
            self.held.discard(worker)
        entry.update(worker=worker, seconds=round(delay, 1),
                     detail=f"SIGKILL pid {pid}, restarted {delay:.1f}s later")

    async def fault_stop(self, entry: dict[str, Any]) -> None:
        await self.stop_for(self.pick(), 1.5 * self.args.session_timeout_ms / 1000, entry)

    async def stop_for(self, worker: str, pause: float, entry: dict[str, Any]) -> None:
        self.held.add(worker)
        try:
            process = self.app_of(worker).pool.workers[worker].process
            process.send_signal(signal.SIGSTOP)
            await asyncio.sleep(pause)
            process.send_signal(signal.SIGCONT)
        finally:
            self.held.discard(worker)
        entry.update(worker=worker, seconds=round(pause, 1),
                     detail=f"SIGSTOP for {pause:.0f}s, then SIGCONT")

    async def wait_for_member(self, run: AppRun, want: str, timeout_s: float
                              ) -> tuple[dict[str, Any], str] | None:
        """The first live member with something in ``want`` (``restoring``, ``learners``)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for status in run.status.live():
                worker = self.worker_by_pid(run, status["pid"])
                if status.get(want) and worker is not None and worker not in self.held:
                    return status, worker
            await asyncio.sleep(0.1)
        return None

    async def fault_kill_restoring(self, entry: dict[str, Any]) -> None:
        lost = self.pick()
        run = self.app_of(lost)
        self.held.add(lost)
        try:
            await self.kill(lost)
            state = run.pool.state_dir(lost)
            subprocess.run(["rm", "-rf", str(state)], check=False)
            self.start(lost)
        finally:
            self.held.discard(lost)
        found = await self.wait_for_rebuilding(run, lost, 60)
        if found is None:
            raise FaultFailed(f"{lost} lost its state and restarted; no member was seen "
                              f"restoring within 60 s, so nothing was killed")
        status, worker = found
        self.held.add(worker)
        try:
            await self.kill(worker)
            await asyncio.sleep(self.rng.uniform(1, 3))
            self.start(worker)
        finally:
            self.held.discard(worker)
        copies = ", ".join(f"{k} {sorted(status[k])}" for k in ("restoring", "learners",
                                                                 "standbys", "active")
                           if status.get(k))
        entry.update(worker=worker, detail=(
            f"{lost} SIGKILLed, its state directory deleted, restarted; then {worker} "
            f"SIGKILLed while rebuilding state ({copies}), restarted"))

    async def wait_for_rebuilding(self, run: AppRun, lost: str, timeout_s: float
                                  ) -> tuple[dict[str, Any], str] | None:
        """A member restoring an active task; else the worker that lost its state, as soon
        as it holds any copy (every one of them is rebuilt from its changelog in full)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for status in run.status.live():
                worker = self.worker_by_pid(run, status["pid"])
                if worker is None or worker in self.held:
                    continue
                rebuilding = status.get("restoring") or (
                    worker == lost and (status.get("learners") or status.get("standbys")
                                        or status.get("active")))
                if rebuilding:
                    return status, worker
            await asyncio.sleep(0.1)
        return None

    async def fault_kill_handover(self, entry: dict[str, Any]) -> None:
        first = self.pick()
        run = self.app_of(first)
        self.held.add(first)
        try:
            await self.kill(first)
            await asyncio.sleep(self.rng.uniform(1, 3))
            self.start(first)
        finally:
            self.held.discard(first)
        found = await self.wait_for_member(run, "learners", 90)
        if found is None:
            raise FaultFailed(f"{first} SIGKILLed and restarted; no learner was seen within "
                              f"90 s, so nothing more was killed")
        status, learner = found
        tasks = sorted(status["learners"])
        victim, role = learner, "the learner"
        if self.rng.random() < 0.5:
            owner = next((s for s in run.status.live()
                          if set(s["active"]) & set(tasks) and s["pid"] != status["pid"]), None)
            owner_worker = owner and self.worker_by_pid(run, owner["pid"])
            if owner_worker and owner_worker not in self.held:
                victim, role = owner_worker, "the owner"
        self.held.add(victim)
        try:
            await self.kill(victim)
            await asyncio.sleep(self.rng.uniform(1, 3))
            self.start(victim)
        finally:
            self.held.discard(victim)
        entry.update(worker=victim, detail=(
            f"{first} SIGKILLed and restarted; then {victim} ({role} of learned "
            f"{tasks}) SIGKILLed during the hand-over, restarted"))

    async def fault_kill_leaving(self, entry: dict[str, Any]) -> None:
        worker = self.pick()
        run = self.app_of(worker)
        status = self.member_of(worker)
        if status is None:
            raise FaultFailed(f"{worker} publishes no status")
        instance = status["instance_id"]
        self.held.add(worker)
        try:
            await mark_leaving(self.bootstrap, run.app_id, instance)
            marked = time.time()
            deadline = marked + 30
            seen = ""
            while time.time() < deadline:
                mine = [s for s in run.status.live() if s["instance_id"] == instance]
                if run.pool.exited(worker):
                    seen = "it exited by itself first"
                    break
                if any(s.get("leaving") for s in mine) and any(
                        s.get("learners") for s in run.status.live()):
                    seen = "its tasks had learners"
                    break
                await asyncio.sleep(0.1)
            else:
                seen = "no hand-over seen within 30 s"
            await asyncio.sleep(self.rng.uniform(0, 2))
            if run.pool.exited(worker):
                code = run.pool.forget(worker)
                what = f"exited by itself (code {code}) before the kill"
            else:
                await self.kill(worker)
                what = f"SIGKILLed {time.time() - marked:.1f}s after the mark ({seen})"
            await asyncio.sleep(self.rng.uniform(1, 3))
            self.start(worker)
        finally:
            self.held.discard(worker)
        entry.update(worker=worker, detail=f"marked leaving ({instance}); {what}; restarted")

    async def _corrupt(self, entry: dict[str, Any], how: str) -> None:
        worker = self.pick()
        run = self.app_of(worker)
        self.held.add(worker)
        try:
            code = await run.pool.stop(worker, timeout_s=30)
            state = run.pool.state_dir(worker)
            target = corrupt_store(state, how, self.rng)
            self.start(worker)
        finally:
            self.held.discard(worker)
        if target is None:
            raise FaultFailed(f"{worker} stopped (exit code {code}) and restarted; no store "
                              f"with {'an SST file' if how == 'sst' else 'a CURRENT file'}")
        # The restarted worker should say it wiped the store and restores it in full.
        log = latest_log(run.pool.settings.run_dir, worker)
        warned = await wait_for_text(log, "wiping it and restoring", 45)
        entry.update(worker=worker, store=str(target.parent), detail=(
            f"stopped with SIGTERM (exit code {code}), {how} of "
            f"{target.relative_to(state)} corrupted, restarted; "
            + ("it warned and restored the store in full" if warned
               else "no warning about the store within 45 s (it opens the store only when "
                    "it gets that task or a copy of it again)")), warned=warned)

    def check_corrupt_stores_later(self) -> None:
        """A corrupted store the worker did not open at once: did it warn about it later in
        the run (when it got that task or a copy again)?"""
        for entry in self.timeline:
            if not entry.get("fault", "").startswith("corrupt") or entry.get("warned") is not False:
                continue
            store = entry["store"]
            logs = sorted(self.run_dir.glob(f"{entry['worker']}-*.log"))
            entry["warned_later"] = any(
                store in line and "cannot be opened" in line
                for log in logs for line in log.read_text(errors="replace").splitlines())

    async def fault_corrupt_sst(self, entry: dict[str, Any]) -> None:
        await self._corrupt(entry, "sst")

    async def fault_corrupt_current(self, entry: dict[str, Any]) -> None:
        await self._corrupt(entry, "current")

    # -- broker faults (benchmarks.faults_broker) ------------------------------------------------

    async def broker_roles(self) -> Roles:
        inputs = [t for name, t in self.topics.items() if name != "users"]
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            names = await admin.list_topics()
        finally:
            await admin.close()
        return await roles_now(self.bootstrap, inputs,
                               [run.app_id for run in self.apps.values()], names)

    async def fault_broker_kill(self, entry: dict[str, Any]) -> None:
        cluster = require_cluster(self.cluster)
        roles = await self.broker_roles()
        entry["struck_s"] = self.now()  # the kill is kill_leader's first step
        entry["detail"] = await kill_leader(cluster, self.bootstrap, roles,
                                            self.rng.uniform(10, 20))

    async def fault_broker_stop(self, entry: dict[str, Any]) -> None:
        cluster = require_cluster(self.cluster)
        node = self.rng.choice(cluster.nodes).node_id
        pause = 1.5 * max(BROKER_SESSION_S, self.args.session_timeout_ms / 1000)
        entry["detail"] = await stop_node(cluster, self.bootstrap, node, pause)

    async def fault_broker_rolling(self, entry: dict[str, Any]) -> None:
        entry["detail"] = await rolling_restart(require_cluster(self.cluster), self.bootstrap)

    async def fault_disk_full(self, entry: dict[str, Any]) -> None:
        if self.disk is None or self.disk_worker is None:
            raise FaultFailed(f"no small disk: {self.disk_error}")
        worker = self.disk_worker
        run = self.app_of(worker)
        ballast = self.disk / ".ballast"
        self.held.add(worker)
        try:
            exited = None
            fill(ballast)
            hold_s = 20.0
            filled = time.time()
            while time.time() < filled + hold_s:
                if exited is None and run.pool.exited(worker):
                    exited = (time.time() - filled, run.pool.forget(worker))
                    run.exits.append({"at_s": self.now(), "worker": worker,
                                      "code": exited[1]})
                await asyncio.sleep(0.2)
            ballast.unlink()
            if exited is None and run.pool.exited(worker):
                exited = (time.time() - filled, run.pool.forget(worker))
                run.exits.append({"at_s": self.now(), "worker": worker, "code": exited[1]})
            if exited is not None:
                self.start(worker)
        finally:
            with contextlib.suppress(FileNotFoundError):
                ballast.unlink()
            self.held.discard(worker)
        entry.update(worker=worker, detail=(
            f"its state directory full for {hold_s:.0f}s, then freed; "
            + (f"it exited {exited[0]:.1f}s in with code {exited[1]} and was restarted"
               if exited else "it kept running")))


# -- helpers on files ---------------------------------------------------------------------------


def corrupt_store(state_dir: Path, how: str, rng: random.Random) -> Path | None:
    """Truncate one SST file to half (``sst``) or write garbage into one ``CURRENT``."""
    pattern = "*.sst" if how == "sst" else "CURRENT"
    files = sorted(p for p in state_dir.rglob(pattern) if p.stat().st_size > 0)
    if not files:
        return None
    target = rng.choice(files)
    if how == "sst":
        with open(target, "r+b") as f:
            f.truncate(target.stat().st_size // 2)
    else:
        target.write_bytes(b"\x00garbage\xff" * 8)
    return target


def fill(path: Path) -> None:
    """Take every free byte of the file system ``path`` is on."""
    stat = os.statvfs(path.parent)
    free = stat.f_bavail * stat.f_frsize
    with open(path, "wb") as f:
        if free > 0:
            os.posix_fallocate(f.fileno(), 0, free)


def latest_log(run_dir: Path, worker: str) -> Path | None:
    logs = sorted(run_dir.glob(f"{worker}-*.log"), key=lambda p: p.stat().st_mtime)
    return logs[-1] if logs else None


async def wait_for_text(path: Path | None, text: str, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while path is not None and time.time() < deadline:
        with contextlib.suppress(OSError):
            if text in path.read_text(errors="replace"):
                return True
        await asyncio.sleep(0.5)
    return False


def mount_small_disk(path: Path, size_mb: int) -> str | None:
    """A tmpfs of ``size_mb`` at ``path``; returns why not when it cannot be mounted."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return "needs root to mount a small file system"
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs",
                           str(path)], capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else f"mount failed: {done.stderr.strip()}"


# -- the run ------------------------------------------------------------------------------------


def processing_guarantee_supported() -> bool:
    return any(f.name == "processing_guarantee" for f in dataclasses.fields(AppConfig))


async def create(bootstrap: str, topics: dict[str, int], compacted: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, [TopicSpec(t, n) for t, n in topics.items()]
                            + [TopicSpec(t, 1, COMPACTED) for t in compacted])
    finally:
        await admin.close()


async def topic_partitions(bootstrap: str, chosen: Callable[[str], bool],
                           ) -> list[TopicPartition]:
    """Every partition of the topics ``chosen`` picks. Asked of the broker: the consumer's
    ``topics()`` reads the cluster's metadata without keeping it, so its
    ``partitions_for_topic`` knew none of them on Apache Kafka (every figure read after a
    run there came out None)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if chosen(t)]
        counts = await existing_partition_counts(admin, names)
    finally:
        await admin.close()
    return [TopicPartition(t, p) for t, n in sorted(counts.items()) for p in range(n)]


async def count_records(bootstrap: str, topic: str) -> int | None:
    """Records in every partition of ``topic`` (None when it does not exist)."""
    tps = await topic_partitions(bootstrap, lambda t: t == topic)
    if not tps:
        return None
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        n = 0
        deadline = time.time() + 20
        while time.time() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            n += sum(len(r) for r in batches.values())
            done = True
            for tp in tps:
                high = consumer.highwater(tp)
                if high is None or await consumer.position(tp) < high:
                    done = False
            if done:
                break
        return n
    finally:
        await consumer.stop()


async def repartition_orders(bootstrap: str, app_id: str,
                             committed: bool = False) -> Counter[int]:
    """How many times each order is in the app's repartition topic. Written more than once
    (at-least-once: the first stage processed it again after a crash), every stateful result
    downstream counts it again; missing, the first stage lost it (no later stage can have
    it). Exactly-once runs read it as the next stage does (read_committed)."""
    return await order_ids_in(
        bootstrap, lambda t: t.startswith(f"{app_id}-") and "-repartition" in t, committed)


async def order_ids_in(bootstrap: str, topic_chosen: Callable[[str], bool],
                       committed: bool = False) -> Counter[int]:
    """How many times each order id is in the topics ``topic_chosen`` picks, read whole:
    the input topic (an order the broker acknowledged to the input's producer but never
    stored is missing from it) or the repartition topic."""
    tps = await topic_partitions(bootstrap, topic_chosen)
    if not tps:
        return Counter()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    if committed:
        read_committed_by_markers(consumer)
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen: Counter[int] = Counter()
        deadline = time.time() + 60
        while time.time() < deadline:
            batches = await consumer.getmany(timeout_ms=500, max_records=50_000)
            for records in batches.values():
                for record in records:
                    seen[msgpack.unpackb(record.value, raw=False)["id"]] += 1
            positions = [await consumer.position(tp) for tp in tps]
            if all(consumer.highwater(tp) is not None and pos >= consumer.highwater(tp)
                   for tp, pos in zip(tps, positions, strict=True)):
                break
        return seen
    finally:
        await consumer.stop()


def exactness(run: AppRun, produced: Produced) -> dict[str, Exactness]:
    latest = run.outputs.latest
    if run.name == "counts":
        return {"counts": compare_latest(produced.counts, latest["counts"])}
    return {
        "totals": compare_latest(produced.totals, latest["totals"]),
        "per_minute": compare_latest(produced.per_minute, latest["per_minute"]),
        "join": compare_occurrences(produced.orders, run.outputs.joined,
                                    wrong=run.outputs.joined_wrong),
    }


async def drain(bench: Bench, produced: Produced, timeout_s: float) -> float:
    """Wait until every output is exact, or nothing is under and nothing new came for 20 s,
    or ``timeout_s``; returns how long it took."""
    started = time.time()
    while time.time() < started + timeout_s:
        await asyncio.sleep(2)
        results = [e for run in bench.apps.values() for e in exactness(run, produced).values()]
        quiet = all(time.time() - run.outputs.last_record_at > 20
                    for run in bench.apps.values())
        if all(e.is_exact for e in results) or (quiet and not any(e.under for e in results)):
            break
    return time.time() - started


async def run(args: argparse.Namespace) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:6]
    run_dir = Path(args.run_dir or f"results/faults-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = start_broker(args.engine, args.kafka_nodes)
        bootstrap = broker.bootstrap_servers
    guarantee = args.processing_guarantee
    report: dict[str, Any] = {
        "settings": {k: (list(v) if isinstance(v, tuple) else v)
                     for k, v in vars(args).items() if k != "json"},
        "run_dir": str(run_dir), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                          time.gmtime()),
        "processing_guarantee": {
            "requested": guarantee,
            "supported_by_this_build": processing_guarantee_supported(),
            "effective": (guarantee if guarantee and processing_guarantee_supported()
                          else "at_least_once")},
        "load_average_start": os.getloadavg(), "error": None, "apps": {}, "timeline": []}
    # Exactly-once outputs count once committed: read as the app reads its own input, by
    # transaction markers (see streams.kafka.driver.read_committed_by_markers).
    committed = report["processing_guarantee"]["effective"] == "exactly_once"
    session_s = args.session_timeout_ms / 1000
    report["broker"] = describe(args.engine, args.kafka_nodes, args.bootstrap)
    # The rounds the workers' members take: static ones with --static.
    rounds = await measure_join_round(bootstrap, args.session_timeout_ms, static=args.static)
    report["join_round"] = rounds_dict(rounds)
    print(engine_label(report), flush=True)
    if rounds.median_s is not None:
        join_round_s = rounds.median_s
        note = (f"measured before the apps started: median of {len(rounds.samples_s)} rounds "
                f"of a probe group of {rounds.members}")
    else:  # Tansu's forming-group tick paces its rounds; a fallback only
        join_round_s = session_s / 2 + 3
        note = f"estimated as session/2 + 3 s: the probe failed ({rounds.error})"
    report["limits"] = {"session_timeout_s": session_s, "join_round_s": join_round_s,
                        "join_round_note": note,
                        "stall_limit_s": stall_limit_s(session_s, join_round_s,
                                                       args.script or [])}
    P = args.partitions
    topics = {"orders": f"faults-orders-{suffix}", "users": f"faults-users-{suffix}",
              "counts_in": f"faults-counts-in-{suffix}"}
    sinks = {"orders": {"totals": f"faults-totals-{suffix}",
                        "per_minute": f"faults-per-minute-{suffix}",
                        "named": f"faults-named-{suffix}"},
             "counts": {"counts": f"faults-counts-out-{suffix}"}}
    app_ids = {"orders": f"faults-orders-{suffix}", "counts": f"faults-counts-{suffix}"}
    bench_env = {"BENCH_ORDERS_APP_ID": app_ids["orders"],
                 "BENCH_COUNTS_APP_ID": app_ids["counts"],
                 "BENCH_ORDERS": topics["orders"], "BENCH_USERS": topics["users"],
                 "BENCH_COUNTS_IN": topics["counts_in"],
                 "BENCH_TOTALS": sinks["orders"]["totals"],
                 "BENCH_PER_MINUTE": sinks["orders"]["per_minute"],
                 "BENCH_NAMED": sinks["orders"]["named"],
                 "BENCH_COUNTS_OUT": sinks["counts"]["counts"]}
    relay_env = {"RELAY_BOOTSTRAP_SERVERS": bootstrap,
                 "RELAY_SESSION_TIMEOUT_MS": str(args.session_timeout_ms),
                 "RELAY_HEARTBEAT_INTERVAL_MS": "1000",
                 "RELAY_NUM_STANDBYS": str(args.standbys),
                 "RELAY_NUM_THREADS": str(args.threads),
                 "RELAY_DEFAULT_PARTITIONS": str(P),
                 # The repartition topic is read whole afterwards (repartition_duplicates):
                 # no purge deletes its records during a run.
                 "RELAY_REPARTITION_PURGE_INTERVAL_MS": str(3_600_000)}
    if guarantee:
        relay_env["RELAY_PROCESSING_GUARANTEE"] = guarantee
    if args.static:
        relay_env[STATIC_SETTING] = "1"
    bench = Bench(args, bootstrap, run_dir,
                  broker if isinstance(broker, KafkaCluster) else None)
    bench.topics = topics
    # The timeline's zero on the wall clock, to read the workers' logs against the faults.
    report["t0_epoch_s"] = round(bench.t0, 3)
    inp: Input | None = None
    warm: float | None = None
    background: list[asyncio.Task[Any]] = []
    try:
        await create(bootstrap, {**{t: P for t in topics.values()},
                                 **{t: P for s in sinks.values() for t in s.values()}},
                     # Made here with the app's counts: following them before the app
                     # made them would have the broker make them with its default.
                     [f(app_ids[a]) for a in args.apps
                      for f in (status_topic_name, control_topic_name)])
        for name in args.apps:
            settings = PoolSettings(bootstrap, app_ids[name], "", "",
                                    status_topic_name(app_ids[name]), P,
                                    args.session_timeout_ms, args.standbys, run_dir)
            pool = FaultPool(settings, name, bench_env, relay_env)
            outputs = Outputs(bootstrap, sinks[name], P, committed)
            subs = (0, 1) if name == "orders" else (0,)
            run_ = AppRun(name, app_ids[name], pool, StatusTail(bootstrap, app_ids[name]),
                          outputs, {f"{s}_{p}" for s in subs for p in range(P)})
            bench.apps[name] = run_
        if "disk-full" in args.faults and "orders" in bench.apps:
            bench.disk_worker = "orders-w1"
            bench.disk = bench.apps["orders"].pool.state_dir("orders-w1")
            bench.disk_error = mount_small_disk(bench.disk, args.disk_mb)
            if bench.disk_error is not None:
                bench.disk = None
        inp = Input(bootstrap, topics, tuple(bench.apps), args.rate, args.users, args.keys,
                    random.Random(args.seed + 1),
                    idempotent=not (args.engine == "tansu" and args.bootstrap is None))
        await inp.start()
        for run_ in bench.apps.values():
            run_.outputs.amounts = inp.produced.orders
            for i in range(1, args.workers + 1):
                run_.pool.start(f"{run_.name}-w{i}")
            await run_.status.start()
            await run_.outputs.start()
        bench.note({"event": "started", "detail": f"{len(bench.apps)} app(s) x "
                    f"{args.workers} workers x {args.threads} threads; input "
                    f"{args.rate}/s per app"})
        background.append(asyncio.create_task(bench.monitor()))
        # Warm-up: every task produced an output.
        deadline = time.time() + args.warmup_timeout
        while time.time() < deadline and not all(
                run_.expected_tasks <= set(run_.outputs.times) for run_ in bench.apps.values()):
            await asyncio.sleep(0.5)
        warm = time.time()
        bench.note({"event": "warm", "detail": "every task produced" if all(
            r.expected_tasks <= set(r.outputs.times) for r in bench.apps.values())
            else "warm-up timed out; faults start anyway"})
        input_end = warm + args.minutes * 60
        background.append(asyncio.create_task(
            bench.scripted(until=input_end) if args.script else bench.faults(until=input_end)))
        while time.time() < input_end and not background[-1].done():
            await asyncio.sleep(0.5)
        if time.time() < input_end:
            await asyncio.sleep(input_end - time.time())
        await inp.stop()
        bench.note({"event": "input stopped", "detail": f"{inp.failed_sends} sends failed"})
        # A fault still under way finishes (its worker restarts) before the drain.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(background[-1], 120)
        drained = await drain(bench, inp.produced, args.drain)
        bench.note({"event": "drained", "detail": f"after {drained:.1f}s"})
        report["drain_s"] = round(drained, 1)
        report["warm_at_s"] = round(warm - bench.t0, 1)
        report["input_s"] = round(inp.stopped_at - warm, 1)
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        bench.note({"event": "error", "detail": report["error"]})
    finally:
        for task in background:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        end = inp.stopped_at if inp is not None and inp.stopped_at else time.time()
        for run_ in bench.apps.values():
            report["apps"][run_.name] = await app_report(
                bench, run_, inp.produced if inp else Produced(), warm or bench.t0, end,
                report["limits"]["stall_limit_s"])
        for run_ in bench.apps.values():
            run_.pool.kill_all()
            await run_.status.stop()
            await run_.outputs.stop()
        if bench.disk is not None:
            subprocess.run(["umount", str(bench.disk)], check=False, capture_output=True)
        if broker is not None:
            broker.stop()
        with contextlib.suppress(OSError):
            bench.check_corrupt_stores_later()
        report["timeline"] = bench.timeline
        report["load_average_end"] = os.getloadavg()
    return report


async def app_report(bench: Bench, run: AppRun, produced: Produced, start: float,
                     end: float, limit: float) -> dict[str, Any]:
    times = {task: run.outputs.times.get(task, []) for task in run.expected_tasks}
    times.update(run.outputs.times)
    # Spans on the timeline's clock (seconds since the run started).
    offset = start - bench.t0
    stalls = {t: dataclasses.replace(s, from_s=round(s.from_s + offset, 1),
                                     to_s=round(s.to_s + offset, 1), gap_s=round(s.gap_s, 1))
              for t, s in longest_stalls(times, start, end).items()}
    worst = max(stalls.values(), key=lambda s: s.gap_s, default=None)
    session_s = bench.args.session_timeout_ms / 1000
    # The limit comes in with the broker's measured join round; each fault's own limit too.
    join_round_s = limit - stall_limit_s(session_s, 0.0, bench.args.script or [])
    every_gap = [dataclasses.replace(g, from_s=round(g.from_s + offset, 1),
                                     to_s=round(g.to_s + offset, 1), gap_s=round(g.gap_s, 1))
                 for g in gaps(times, start, end, at_least_s=GAP_REPORTED_S)]
    applied = applied_faults(bench.timeline, session_s, join_round_s)
    result = {
        "app_id": run.app_id,
        "sinks": {kind: topic for topic, kind in run.outputs.kind.items()},
        "outputs": {k: e.to_dict() for k, e in exactness(run, produced).items()},
        "input_records": (len(produced.orders) if run.name == "orders"
                          else sum(produced.counts.values())),
        "longest_stall": dataclasses.asdict(worst) if worst else None,
        "stalls_over_limit": sorted(
            ({**dataclasses.asdict(s), "faults_before": faults_before(bench, s)}
             for s in stalls.values() if s.gap_s > limit),
            key=lambda s: -s["gap_s"]),
        "stalls": {t: round(s.gap_s, 1) for t, s in sorted(stalls.items())},
        "stalls_per_fault": [
            {"at_s": f.at_s, "fault": f.fault, "limit_s": f.limit_s, "over": f.over,
             **({"task": f.stall.task, "gap_s": f.stall.gap_s, "from_s": f.stall.from_s,
                 "to_s": f.stall.to_s} if f.stall is not None else {})}
            for f in stalls_per_fault(every_gap, applied, round(end - bench.t0, 1))],
        "gaps": [dataclasses.asdict(g) for g in every_gap],
        "rebalances": rebalances(g for t, g in run.status.generations if t >= start),
        "rounds_s": round_figures([r for _key, r in run.status.rounds]),
        "generations_seen": sorted({g for _, g in run.status.generations}),
        "worker_exits": run.exits,
        "dead_letters": None,
    }
    with contextlib.suppress(Exception):
        result["dead_letters"] = await count_records(bench.bootstrap,
                                                     f"{run.app_id}-dead-letters")
    if run.name == "orders":
        result["repartition_duplicates"] = result["repartition_missing"] = None
        with contextlib.suppress(Exception):
            seen = await repartition_orders(bench.bootstrap, run.app_id,
                                            run.outputs.committed)
            result["repartition_duplicates"] = sum(n - 1 for n in seen.values())
            missing = sorted(set(produced.orders) - set(seen))
            result["repartition_missing"] = len(missing)
            result["repartition_missing_examples"] = missing[:10]
        result["input_missing"] = None
        with contextlib.suppress(Exception):
            orders_topic = bench.topics["orders"]
            stored = await order_ids_in(bench.bootstrap, lambda t: t == orders_topic)
            missing = sorted(set(produced.orders) - set(stored))
            result["input_missing"] = len(missing)
            result["input_missing_examples"] = missing[:10]
    outs = result["outputs"].values()
    result["verdict"] = {
        "nothing_under": all(o["under"] == 0 for o in outs),
        "all_exact": all(o["is_exact"] for o in outs),
        "no_stall_over_limit": not result["stalls_over_limit"]}
    return result


def round_figures(rounds: list[float]) -> dict[str, Any]:
    """The members' rounds as they measured them (join to assignment applied): how long the
    broker's rounds took in this run."""
    if not rounds:
        return {"count": 0}
    ordered = sorted(rounds)
    return {"count": len(ordered), "median": round(ordered[len(ordered) // 2], 1),
            "min": round(ordered[0], 1), "max": round(ordered[-1], 1)}


def faults_before(bench: Bench, stall: Any) -> list[str]:
    """The faults and exits under way in the 30 s before a stall began, or during it."""
    return [f"{e['at_s']:.0f}s {e.get('fault') or e.get('event')} {e.get('worker', '')}".strip()
            for e in bench.timeline
            if (e.get("fault") or e.get("event") == "worker exited")
            and e["at_s"] <= stall.to_s and e.get("end_s", e["at_s"]) >= stall.from_s - 30]


def table(report: dict[str, Any]) -> str:
    rows = ["| app | output | cases | exact | over (by) | under (by) | other | "
            "longest stall (task) | rebalances |", "|---|---|---|---|---|---|---|---|---|"]
    for name, app in report["apps"].items():
        stall = app["longest_stall"]
        stall_text = f"{stall['gap_s']:.1f} s ({stall['task']})" if stall else "-"
        for output, e in app["outputs"].items():
            other = []
            if e["unexpected"]:
                other.append(f"{e['unexpected']} unexpected")
            if e["wrong"]:
                other.append(f"{e['wrong']} wrong")
            rows.append(
                f"| {name} | {output} | {e['cases']:,} | {e['exact']:,} | "
                f"{e['over']:,} ({e['over_by']:,}) | {e['under']:,} ({e['under_by']:,}) | "
                f"{', '.join(other) or '-'} | {stall_text} | {app['rebalances']} |")
    return "\n".join(rows)


def timeline_text(report: dict[str, Any]) -> str:
    lines = []
    for e in report["timeline"]:
        what = e.get("fault") or e.get("event")
        status = f" [{e['status']}]" if e.get("status") and e["status"] != "applied" else ""
        worker = f" {e['worker']}" if e.get("worker") else ""
        struck = f" (struck at {e['struck_s']:.1f}s)" if "struck_s" in e else ""
        lines.append(f"  {e['at_s']:7.1f}s {what}{worker}{status}{struck}: "
                     f"{e.get('detail', '')}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.faults", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True, help="where to write the report")
    p.add_argument("--minutes", type=float, default=10.0,
                   help="how long input flows and faults hit after the warm-up")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--faults", nargs="+", default=list(ALL_FAULTS), choices=ALL_FAULTS)
    p.add_argument("--fault-interval", type=float, nargs=2, default=(30.0, 60.0),
                   metavar=("MIN_S", "MAX_S"))
    p.add_argument("--processing-guarantee", default=None,
                   help="passed to the workers (RELAY_PROCESSING_GUARANTEE) and reported")
    p.add_argument("--apps", nargs="+", default=list(APPS), choices=APPS)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--standbys", type=int, default=1)
    p.add_argument("--session-timeout-ms", type=int, default=10_000)
    p.add_argument("--rate", type=int, default=100, help="records/s into each app")
    p.add_argument("--users", type=int, default=200)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--warmup-timeout", type=float, default=120.0)
    p.add_argument("--drain", type=float, default=180.0)
    p.add_argument("--disk-mb", type=int, default=256)
    p.add_argument("--bootstrap", default=None, help="a running broker (default: a fresh "
                                                     "one of --engine)")
    add_engine_arguments(p, kafka_nodes=3)
    p.add_argument("--static", action="store_true",
                   help="static membership: each worker's name is its instance id")
    p.add_argument("--script", nargs="+", type=parse_script_entry, default=None,
                   metavar="KIND:WORKER:SECONDS",
                   help="these faults in order instead of random ones: kill:w2:5 "
                        "(restart 5 s later), stop:w3:25 (SIGSTOP for 25 s)")
    p.add_argument("--run-dir", default=None, help="worker logs and state (default under "
                                                   "results/)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    # The benchmark's own clients (input, tails, probes) retry through broker faults and
    # count what failed; their connection errors would bury the timeline. The workers'
    # logs keep their own.
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        report = asyncio.run(run(args))
    finally:
        quiet.setLevel(level)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    print()
    print(table(report))
    print()
    limits = report["limits"]
    print(engine_label(report))
    print(f"stall limit: session {limits['session_timeout_s']:.0f} s + one join round "
          f"{limits['join_round_s']:.2f} s (+ a restart within the session) = "
          f"{limits['stall_limit_s']:.1f} s; processing "
          f"guarantee: {report['processing_guarantee']['effective']}"
          + ("" if not report["processing_guarantee"]["requested"]
             or report["processing_guarantee"]["supported_by_this_build"]
             else f" ({report['processing_guarantee']['requested']} requested, not "
                  f"supported by this build)"))
    for name, app in report["apps"].items():
        dups = (f"; orders repeated in the repartition topic {app['repartition_duplicates']}"
                f", missing from it {app.get('repartition_missing')}"
                f" (acknowledged to the input's producer but missing from the input: "
                f"{app.get('input_missing')})"
                if "repartition_duplicates" in app else "")
        print(f"{name}: {app['verdict']}; dead letters {app['dead_letters']}{dups}; "
              f"worker exits {len(app['worker_exits'])}; stalls over the limit: "
              + (", ".join(f"{s['task']} {s['gap_s']:.1f}s at {s['from_s']:.0f}-"
                           f"{s['to_s']:.0f}s" for s in app["stalls_over_limit"][:6])
                 or "none"))
        rounds = app["rounds_s"]
        if rounds["count"]:
            print(f"  rounds as members measured them (join to assignment applied): "
                  f"{rounds['count']}, median {rounds['median']:.1f} s, "
                  f"{rounds['min']:.1f} to {rounds['max']:.1f} s")
        for f in app["stalls_per_fault"]:
            stall = (f"{f['gap_s']:.1f} s ({f['task']}, {f['from_s']:.0f}-{f['to_s']:.0f}s)"
                     if "gap_s" in f else "none")
            print(f"  {f['at_s']:7.1f}s {f['fault']}: longest stall {stall}, limit "
                  f"{f['limit_s']:.0f} s{' OVER' if f['over'] else ''}")
    print("timeline:")
    print(timeline_text(report))
    if report["error"]:
        print(f"error: {report['error']}")
    print(f"JSON: {args.json}; logs: {report['run_dir']}")
    return report


if __name__ == "__main__":
    main()
