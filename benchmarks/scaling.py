"""``python -m benchmarks.scaling``: what scaling a stateful app costs, per strategy.

The same stateful app (per key a running count and the last payload; one output per record)
runs as worker processes on a broker (``--engine``: the embedded Tansu, the default, or
Apache Kafka) while a producer writes at a steady rate, and the group changes: scale out by
one instance, scale in by one (SIGTERM), scale out again, hand an instance's work over
before it leaves (``relay mark-leaving``), and a rolling restart of every instance; and, not
by default, ``lost-state-restart``: an instance killed and started again at once without its
state directory.
Strategies:

- ``relay-learner``: Relay with learners and cooperative rebalancing;
- ``relay-learner-static``: the same with static members (``group_instance_id``, as the
  Kafka Streams strategies have): a restart within the session moves nothing, and an
  instance stopped without a leaving mark keeps its tasks until its session ends;
- ``relay-learner-standby``: the same with one standby copy per task (``num_standbys=1``): a
  standby is promoted where one exists, without a learner phase;
- ``relay-learner-static-standby`` (not by default): static members with one standby per
  task, as ``kafka-streams-standby`` runs;
- ``relay-stop-the-world``: Relay with ``rebalance_protocol=eager`` (every rebalance stops and
  closes every task; a moved task restores before it runs);
- ``faust``: faust-streaming running the equivalent app (:mod:`benchmarks.scaling_faust_app`).
  It has no leaving mark, so its hand-over is its graceful shutdown on SIGTERM, as its
  scale-in is;
- ``kafka-streams-warmup``: Kafka Streams (``relay.peers.ScalingApp``, Java) with its
  HighAvailabilityTaskAssignor: warm-up replicas (``max.warmup.replicas`` = ``--max-learners``,
  ``acceptable.recovery.lag`` = ``--acceptable-lag``, a probing rebalance every 60 s, its
  minimum), no standbys, static membership, Relay's commit interval and one stream thread;
- ``kafka-streams-standby``: the same with ``num.standby.replicas`` 1.
  Kafka Streams has no leaving mark: its hand-over closes the instance with
  ``CloseOptions.groupMembershipOperation(LEAVE_GROUP)``, so it leaves the group at once and
  its tasks move in the next rebalance (to a standby if there is one). Its scale-in
  (SIGTERM: ``close()``) leaves a static member in the group, so its tasks wait for the
  session timeout, as a static Relay member's do. Kafka Streams cannot join a group on the
  embedded Tansu broker: on ``--engine tansu`` these strategies are reported as failed with
  that reason, and the others keep their figures.

The whole run is repeated for each state size (``--state-mb``, changelog bytes per task).
Each strategy gets a fresh broker on which every task's changelog is prefilled in that
framework's own format (:mod:`benchmarks.scaling_prefill`): every strategy starts by
restoring the same state, the way a moved task restores it, rather than by processing a
backlog. Before the strategies, a probe group measures the broker's join round
(:mod:`benchmarks.scaling_rounds`), and every gap is reported in seconds and in join rounds.

For each change the benchmark reports the longest processing gap of a task that moved and of
tasks that did not, the time until the group is balanced again, the rebalances, the changelog
records restored and the input records processed twice; it writes JSON, a plot of throughput
over time with the changes marked, and a plot of the moved task's gap against state size.
A strategy that fails (a worker dies, a deadline passes) is reported as failed with the phases
it completed and the error; the run goes on with the next one.

Everything is measured from the app's outputs (each names its task, process and time) and
from the members' status records (generation, tasks, records restored), which every app
publishes (the faust and Kafka Streams apps publish their own), so the strategies are
measured the same way. The group counts as balanced when, over the last
``--balance-window`` seconds, every task's outputs came from exactly one process, those are
exactly the running workers with loads within one task, and the members' status agrees and
shows nothing still moving (no learner or warm-up, no restoring active, no leaving mark).
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

from benchmarks.broker_engine import (
    add_engine_arguments,
    describe,
    engine_label,
    start_broker,
)
from benchmarks.peers import kafka_streams
from benchmarks.scaling_analysis import (
    Phase,
    in_rounds,
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
    kafka_streams_status,
    relay_status,
)
from benchmarks.scaling_plot import plot_gaps_by_state, plot_throughput
from benchmarks.scaling_prefill import (
    changelog_topic,
    faust_encoder,
    input_key,
    kafka_streams_encoder,
    prefill_changelog,
    relay_encoder,
    relay_position,
)
from benchmarks.scaling_rounds import JoinRounds, measure_join_rounds
from benchmarks.scaling_workers import (
    FaustPool,
    KafkaStreamsPool,
    PoolSettings,
    RelayPool,
    WorkerPool,
)
from statestore.topics import COMPACTED, TopicSpec, ensure_topics
from streams.group.control import LeavingMark, control_topic_name, encode_mark
from streams.group.member_id import instance_of
from streams.group.status_topic import status_topic_name

KAFKA_STREAMS = ("kafka-streams-warmup", "kafka-streams-standby")
STRATEGIES = ("relay-learner", "relay-learner-static", "relay-learner-standby",
              "relay-learner-static-standby", "relay-stop-the-world", "faust", *KAFKA_STREAMS)
DEFAULT_STRATEGIES = tuple(s for s in STRATEGIES if s != "relay-learner-static-standby")
#: Relay strategies whose workers are static members (``group_instance_id`` = the worker's
#: name), as the Kafka Streams strategies are.
STATIC = {"relay-learner-static", "relay-learner-static-standby"}
#: Standby copies per task of each strategy.
STANDBYS = {"relay-learner-standby": 1, "relay-learner-static-standby": 1,
            "kafka-streams-standby": 1}
#: Kafka Streams' probing rebalance interval: its minimum, so warm-ups move tasks soonest.
PROBING_REBALANCE_MS = 60_000
TANSU_WITHOUT_KAFKA_STREAMS = (
    "Kafka Streams cannot join a group on the embedded Tansu broker (its stream thread's "
    "consumer is disconnected at every ApiVersions to the group coordinator, so no task is "
    "ever assigned): run the Kafka Streams strategies with --engine kafka")
PHASES = ("scale-out", "scale-in", "hand-over", "rolling-restart", "lost-state-restart")
DEFAULT_PHASES = ("scale-out", "scale-in", "scale-out", "hand-over", "rolling-restart")
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
    #: Changelog bytes per task at the start (the state a moved task restores), in MB.
    state_mb: float
    value_bytes: int
    rate: int

    @property
    def records_per_task(self) -> int:
        return max(1, round(self.state_mb * 1_000_000 / self.value_bytes))


class StrategyFailed(RuntimeError):
    """A strategy could not go on (a worker died, the group never balanced at start)."""


# -- input --------------------------------------------------------------------------------

def _record(seq: int, keys: int, blob: str) -> tuple[bytes, bytes]:
    return input_key(seq % keys), msgpack.packb({"blob": blob, "seq": seq})


@dataclass
class Written:
    """Input records written so far."""

    count: int = 0


async def steady_traffic(bootstrap: str, topic: str, sizes: Sizes, stop: asyncio.Event,
                         written: Written) -> int:
    """Write ``sizes.rate`` records/s (the keys of the prefilled state, the same payload size)
    until ``stop``; returns how many were written."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5,
                                max_request_size=8 * 1024 * 1024)
    await producer.start()
    blob = "x" * sizes.value_bytes
    seq = 0
    tick = 0.05
    started = time.monotonic()
    try:
        while not stop.is_set():
            # Catch up to the schedule rather than sleep a fixed tick: a busy machine slows
            # the loop, not the rate.
            due = int((time.monotonic() - started) * sizes.rate)
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
    return seq


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
    #: Workers started by scale-outs, newest last: scale-ins and hand-overs remove the newest.
    added: list[str] = field(default_factory=list)
    #: Workers started so far (names are never reused: a new instance starts empty).
    started_workers: int = 0
    #: When the current change must be over (``--phase-timeout`` after it began): every
    #: wait inside a change shares it, so a group that never balances costs one timeout.
    deadline: float = 0.0

    def remaining(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

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
                last = last_line(Path(worker.log.name))
                raise StrategyFailed(f"worker {name} (pid {worker.process.pid}) exited with "
                                     f"code {code}; see its log in {self.pool.settings.run_dir}"
                                     + (f"; its last line: {last}" if last else ""))

    def start_worker(self) -> str:
        self.started_workers += 1
        name = f"w{self.started_workers}"
        self.pool.start(name)
        return name

    async def phase(self, phase: Phase, action: Callable[[Phase], Awaitable[None]]) -> None:
        """Run one change and wait for balance. The phase is already in the run's list: if
        the change fails, what it did so far stays reported with the error."""
        self.deadline = time.monotonic() + self.args.phase_timeout
        try:
            await action(phase)
            if not phase.ended:
                await self.settle(phase)
        except BaseException as exc:
            phase.ended = phase.ended or time.time()
            phase.notes.append(f"failed: {type(exc).__name__}: {exc}")
            raise
        if phase.balanced:
            phase.seconds_to_balance = phase.ended - phase.started
        phase.completed = True
        shown = "-" if phase.seconds_to_balance is None else f"{phase.seconds_to_balance:.1f}s"
        print(f"  {self.name}: {phase.name}: balanced={phase.balanced} after {shown}",
              flush=True)

    async def settle(self, phase: Phase) -> None:
        phase.balanced, balanced_at, problem = await self.wait_balanced(
            phase.started, self.remaining())
        phase.ended = balanced_at
        if not phase.balanced:
            phase.notes.append(f"not balanced within {self.args.phase_timeout:.0f}s: {problem}")

    def newest_added(self, what: str) -> str:
        if not self.added:
            raise StrategyFailed(f"{what}: no instance was added by a scale-out before")
        return self.added.pop()

    async def scale_out(self, phase: Phase) -> None:
        name = self.start_worker()
        self.added.append(name)
        phase.notes.append(f"{name} started with an empty state directory")

    async def scale_in(self, phase: Phase) -> None:
        """Stop the newest instance with SIGTERM (the graceful shutdown of every framework);
        its tasks move once the group notices (a static member, Relay's or Kafka Streams':
        the session timeout)."""
        name = self.newest_added("scale in")
        code = await self.pool.stop(name, timeout_s=self.remaining())
        phase.notes.append(f"{name} stopped with SIGTERM (exit code {code})")

    async def hand_over(self, phase: Phase) -> None:
        """Mark the newest instance leaving (``relay mark-leaving``): it hands its tasks over
        (learners catch up first) and exits by itself. faust has no leaving mark: SIGTERM.
        Kafka Streams has none either: the instance closes with LEAVE_GROUP."""
        if isinstance(self.pool, FaustPool):
            phase.notes.append("faust has no leaving mark: its hand-over is SIGTERM")
            await self.scale_in(phase)
            return
        if isinstance(self.pool, KafkaStreamsPool):
            name = self.newest_added("hand over")
            code = await self.pool.stop(name, timeout_s=self.remaining(),
                                        sig=KafkaStreamsPool.LEAVE_SIGNAL)
            phase.notes.append(
                f"Kafka Streams has no leaving mark: {name} closed with "
                f"CloseOptions.groupMembershipOperation(LEAVE_GROUP) (exit code {code}); its "
                "tasks move in the rebalance its LeaveGroup starts")
            return
        name = self.newest_added("hand over")
        pid = self.pool.pid(name)
        instance = next((instance_of(m.key) for m in self.status.live()
                         if m.pid == pid), None)
        if instance is None:
            raise StrategyFailed(f"worker {name} (pid {pid}) publishes no status")
        await mark_leaving(self.bootstrap, self.app_id, instance)
        self.pool.workers[name].may_exit = True
        self.leaving.add(pid)
        await self.settle(phase)
        # It exits once it handed everything over; a group that did not balance gets a
        # little time for that rather than none.
        deadline = time.monotonic() + max(10.0, self.deadline - time.monotonic())
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
            code = await self.pool.stop(name, timeout_s=self.remaining())
            stopped_after = time.monotonic() - stop_started
            self.pool.start(name)
            balanced, _, problem = await self.wait_balanced(phase.started, self.remaining())
            phase.notes.append(
                f"{name}: stopped in {stopped_after:.1f}s (exit code {code}), restarted, "
                + ("balanced again" if balanced else f"not balanced: {problem}"))

    async def lost_state_restart(self, phase: Phase) -> None:
        """SIGKILL the first instance, delete its state directory (a new disk, a wiped
        volume) and start it again under the same name at once: a static member comes back
        within its session as the same instance, with nothing to restore from locally."""
        name = sorted(self.pool.workers)[0]
        code = await self.pool.stop(name, timeout_s=self.remaining(), sig=signal.SIGKILL)
        shutil.rmtree(self.pool.state_dir(name), ignore_errors=True)
        self.pool.start(name)
        phase.notes.append(f"{name} killed (exit code {code}), its state directory deleted, "
                           "started again at once")

    def mark(self, phase: Phase, label: str) -> dict[str, Any]:
        return {"label": label, "at_s": phase.started - self.started,
                "balanced_at_s": (phase.ended - self.started) if phase.balanced else None}


def last_line(log: Path) -> str:
    """The last non-empty line of a worker's log ("" when there is none)."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


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


PHASE_TITLES = {"scale-out": ("scale out by one instance", "scale out"),
                "scale-in": ("scale in by one instance (SIGTERM)", "scale in"),
                "hand-over": ("hand over and leave (Relay: leaving mark; others: see the notes)",
                              "hand over"),
                "rolling-restart": ("rolling restart of every instance", "rolling restart"),
                "lost-state-restart": ("SIGKILL an instance, delete its state directory and "
                                       "start it again at once", "lost state")}


async def create_topics(bootstrap: str, specs: list[TopicSpec]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, specs)
    finally:
        await admin.close()


async def run_strategy(name: str, args: argparse.Namespace, sizes: Sizes, bootstrap: str,
                       run_dir: Path) -> dict[str, Any]:
    """Run one strategy at one size. Never raises for the strategy's own failure: the result
    says what it did and why it stopped."""
    app_id = f"scaling-{name}-{uuid.uuid4().hex[:8]}"
    source, sink = f"{app_id}-in", f"{app_id}-out"
    faust = name == "faust"
    java = name in KAFKA_STREAMS
    relay = not (faust or java)
    status_topic = (f"{app_id}-faust-status" if faust else f"{app_id}-ks-status" if java
                    else status_topic_name(app_id))
    settings = PoolSettings(bootstrap, app_id, source, sink, status_topic, sizes.partitions,
                            args.session_timeout_ms, STANDBYS.get(name, 0),
                            run_dir / f"{name}-{sizes.state_mb:g}MB")
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "strategy": name, "state_mb": sizes.state_mb,
        "records_per_task": sizes.records_per_task, "app_id": app_id, "error": None,
        "phases_completed": 0, "phases": [], "marks": [], "throughput": [],
        "logs": str(settings.run_dir)}
    phases: list[Phase] = []
    stop_traffic = asyncio.Event()
    traffic: asyncio.Task[int] | None = None
    pool: WorkerPool | None = None
    outputs = OutputFollower(bootstrap, sink)
    status = StatusFollower(bootstrap, status_topic, faust_status if faust
                            else kafka_streams_status if java else relay_status)
    following = False
    run: Run | None = None
    try:
        if java:
            if args.engine == "tansu" and not args.bootstrap:
                raise StrategyFailed(TANSU_WITHOUT_KAFKA_STREAMS)
            kafka_streams.build()  # before the prefill: a failed build costs nothing more
        specs = [TopicSpec(source, sizes.partitions), TopicSpec(sink, 1),
                 TopicSpec(status_topic, 1, COMPACTED),
                 TopicSpec(changelog_topic(app_id), sizes.partitions, COMPACTED)]
        if relay:
            specs.append(TopicSpec(control_topic_name(app_id), 1, COMPACTED))
        await create_topics(bootstrap, specs)
        rate = await prefill_changelog(
            bootstrap, changelog_topic(app_id), sizes.partitions, sizes.keys,
            sizes.records_per_task, sizes.value_bytes,
            faust_encoder() if faust else kafka_streams_encoder() if java else relay_encoder(),
            relay_position(source) if relay else None)
        print(f"  {name}: prefilled {sizes.records_per_task:,} changelog records of "
              f"{sizes.value_bytes} B per task ({rate:,.0f}/s)", flush=True)
        if faust:
            pool = FaustPool(settings)
        elif java:
            pool = KafkaStreamsPool(settings, args.acceptable_lag, args.max_learners,
                                    PROBING_REBALANCE_MS, args.start_timeout)
        else:
            pool = RelayPool(
                settings, "eager" if name == "relay-stop-the-world" else "cooperative",
                args.acceptable_lag, args.max_learners, args.worker_log_level,
                static=name in STATIC)
        run = Run(name, pool, outputs, status, sizes, args, bootstrap, app_id)
        await outputs.start()
        await status.start()
        following = True
        run.started = time.time()
        written = Written()
        traffic = asyncio.create_task(
            steady_traffic(bootstrap, source, sizes, stop_traffic, written))
        start = Phase(f"start {sizes.instances} instances, restore and catch up", run.started,
                      kind="start")
        result["start"] = start
        for _ in range(sizes.instances):
            run.start_worker()
        # The steady state begins once every task restored its state and processed the input
        # that arrived meanwhile: at most two seconds of input outstanding.
        deadline = time.monotonic() + args.start_timeout

        def caught_up() -> bool:
            return len(outputs.processed) >= written.count - 2 * sizes.rate

        while not caught_up() and time.monotonic() < deadline:
            run.check_workers()
            await asyncio.sleep(0.5)
        if not caught_up():
            raise StrategyFailed(f"the state was not restored and the input not caught up "
                                 f"within {args.start_timeout:.0f}s of the start")
        caught_up_at = time.time() - OUTPUT_DELAY_S
        start.balanced, balanced_at, problem = await run.wait_balanced(
            run.started, max(1.0, deadline - time.monotonic()))
        start.ended = max(balanced_at, caught_up_at)
        if not start.balanced:
            raise StrategyFailed(f"not balanced within {args.start_timeout:.0f}s of the start: "
                                 f"{problem}")
        start.seconds_to_balance = start.ended - start.started
        start.completed = True
        print(f"  {name}: started and balanced after {start.seconds_to_balance:.1f}s",
              flush=True)
        actions: dict[str, Callable[[Phase], Awaitable[None]]] = {
            "scale-out": run.scale_out, "scale-in": run.scale_in,
            "hand-over": run.hand_over, "rolling-restart": run.rolling_restart,
            "lost-state-restart": run.lost_state_restart}
        for kind in args.phases:
            await asyncio.sleep(args.settle)  # a deliberate steady-state observation window
            title, label = PHASE_TITLES[kind]
            phase = Phase(title, time.time(), kind=kind)
            phases.append(phase)
            result["marks"].append({"label": label})
            await run.phase(phase, actions[kind])
            result["marks"][-1] = run.mark(phase, label)
            result["phases_completed"] += 1
        await asyncio.sleep(args.settle)
    except Exception as exc:
        traceback.print_exc()
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"  {name}: FAILED after {result['phases_completed']} phases: {result['error']}",
              flush=True)
    finally:
        stop_traffic.set()
        if traffic is not None:
            with contextlib.suppress(Exception):
                result["produced"] = await traffic
        if pool is not None:
            try:
                await pool.stop_all()
            finally:
                pool.kill_all()
        # The workers' stores are big and of no use after the run; their logs stay.
        shutil.rmtree(settings.run_dir / "state", ignore_errors=True)
        if following:
            with contextlib.suppress(Exception):
                await outputs.caught_up()
                await status.caught_up()
            await outputs.stop()
            await status.stop()
    if run is not None and result["marks"] and "at_s" not in result["marks"][-1]:
        result["marks"][-1] = run.mark(phases[-1], result["marks"][-1]["label"])
    summarize_phases(result, phases, outputs, status, sizes)
    if args.save_outputs:
        # Every output, for questions the figures do not answer (who processed what, when).
        path = args.json.with_name(
            f"{args.json.stem}-{name}-{sizes.state_mb:g}MB-outputs.csv.gz")
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as out:
            out.write("task,pid,t,seq\n")
            out.writelines(f"{o.task},{o.pid},{o.t:.4f},{o.seq}\n" for o in outputs.outputs)
        result["outputs_file"] = str(path)
    started = run.started if run is not None and run.started else time.time()
    result["member_status"] = [
        {**asdict(m), "tasks": sorted(m.tasks)} for m in status.history]
    result["throughput"] = throughput(outputs.outputs, started)
    result["throughput_by_task"] = {
        f"0_{p}": throughput(outputs.outputs, started, f"0_{p}")
        for p in range(sizes.partitions)}
    return result


def summarize_phases(result: dict[str, Any], phases: list[Phase], outputs: OutputFollower,
                     status: StatusFollower, sizes: Sizes) -> None:
    """The figures of every phase that began, completed or not."""
    processing_gaps(phases, outputs.outputs)
    # Work a change causes may go on after the group is balanced (a last status record, a
    # follow-up rebalance): counters run until the next change starts.
    ends = [p.started for p in phases[1:]] + ([time.time()] if phases else [])
    reprocessed_records(phases, outputs.outputs, ends)
    for phase, counted_until in zip(phases, ends, strict=True):
        member_counters(phase, status.history, counted_until)
    start = result.get("start")
    if isinstance(start, Phase):
        member_counters(start, status.history, phases[0].started if phases else time.time())
        if not start.ended:
            start.ended = time.time()
        result["start"] = asdict(start)
    result["phases"] = [asdict(p) for p in phases]
    result["outputs"] = len(outputs.outputs)


# -- the run ------------------------------------------------------------------------------

async def probe_join_rounds(args: argparse.Namespace) -> JoinRounds:
    """The broker's join round, on a broker like the strategies' (or the given one)."""
    broker = None if args.bootstrap else start_broker(args.engine, args.kafka_nodes)
    try:
        bootstrap = args.bootstrap or broker.bootstrap_servers  # type: ignore[union-attr]
        return await measure_join_rounds(bootstrap, args.join_rounds, args.session_timeout_ms)
    finally:
        if broker is not None:
            broker.stop()


async def run_all(args: argparse.Namespace, sizes: list[Sizes],
                  report: Callable[[JoinRounds, list[dict[str, Any]]], None]
                  ) -> tuple[JoinRounds, list[dict[str, Any]]]:
    run_dir = Path(tempfile.mkdtemp(prefix="scaling-run-"))
    print(f"worker logs and state under {run_dir}", flush=True)
    rounds = await probe_join_rounds(args)
    shown = "-" if rounds.median_s is None else f"{rounds.median_s:.2f}s"
    print(f"join round: median {shown} over {len(rounds.samples_s)} rounds"
          + (f" (probe error: {rounds.error})" if rounds.error else ""), flush=True)
    results: list[dict[str, Any]] = []
    for size in sizes:
        for name in args.strategies:
            print(f"strategy {name}, {size.state_mb:g} MB of changelog per task", flush=True)
            broker = None
            try:
                broker = (None if args.bootstrap
                          else start_broker(args.engine, args.kafka_nodes))
                bootstrap = args.bootstrap or broker.bootstrap_servers  # type: ignore[union-attr]
                results.append(await run_strategy(name, args, size, bootstrap, run_dir))
            except Exception as exc:  # the broker itself: the run goes on without it
                traceback.print_exc()
                results.append({"strategy": name, "state_mb": size.state_mb,
                                "error": f"{type(exc).__name__}: {exc}",
                                "phases_completed": 0, "phases": [], "marks": []})
            finally:
                if broker is not None:
                    broker.stop()
            add_rounds(results[-1], rounds.median_s)
            report(rounds, results)
    return rounds, results


def add_rounds(result: dict[str, Any], round_s: float | None) -> None:
    """Every gap and balance time also in join rounds."""
    for phase in result["phases"]:
        for key in ("longest_gap_moved_s", "longest_gap_unmoved_s", "seconds_to_balance"):
            phase[key.removesuffix("_s").removeprefix("seconds_") + "_rounds"] = in_rounds(
                phase.get(key), round_s)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _with_rounds(seconds: float | None, rounds: float | None) -> str:
    if seconds is None:
        return "-"
    return _seconds(seconds) + ("" if rounds is None else f" ({rounds:.1f} r)")


def summary_table(rounds: JoinRounds, results: list[dict[str, Any]]) -> list[str]:
    """A Markdown table of every phase; gaps and balance times also in join rounds (r)."""
    median = "-" if rounds.median_s is None else f"{rounds.median_s:.2f} s"
    lines = [f"join round: median {median} "
             f"(samples {', '.join(f'{s:.2f}' for s in rounds.samples_s) or 'none'})",
             "",
             "| state/task | change | strategy | gap, moved task | gap, unmoved tasks "
             "| balanced after | rebalances | records restored | processed twice |",
             "|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        for p in result["phases"]:
            moved = _with_rounds(p["longest_gap_moved_s"], p.get("longest_gap_moved_rounds"))
            if p["moved_tasks"]:
                moved += f" ({len(p['moved_tasks'])} moved)"
            balanced = (_with_rounds(p["seconds_to_balance"], p.get("to_balance_rounds"))
                        if p["balanced"] else ("not balanced" if p["completed"]
                                               else "failed"))
            lines.append(
                f"| {result['state_mb']:g} MB | {p['kind']} | {result['strategy']} | {moved} | "
                f"{_with_rounds(p['longest_gap_unmoved_s'], p.get('longest_gap_unmoved_rounds'))}"
                f" | {balanced} | {p['rebalances']} | {p['restored_records']:,} | "
                f"{p['reprocessed_records']:,} |")
    failed = [r for r in results if r["error"]]
    if failed:
        lines.append("")
    for result in failed:
        lines.append(f"{result['strategy']} at {result['state_mb']:g} MB FAILED after "
                     f"{result['phases_completed']} phases: {result['error']}")
    return lines


def summary_lines(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for result in results:
        lines.append(f"\n{result['strategy']}, {result['state_mb']:g} MB/task "
                     f"({result.get('outputs', 0):,} outputs)"
                     + (f" FAILED: {result['error']}" if result["error"] else ""))
        start = result.get("start")
        if isinstance(start, dict):
            lines.append(f"  start: balanced in {_seconds(start['seconds_to_balance'])}, "
                         f"restored {start['restored_records']:,}")
        for p in result["phases"]:
            lines.append(
                f"  {p['name']}: balanced in {_seconds(p['seconds_to_balance'])}, longest gap "
                f"moved {_seconds(p['longest_gap_moved_s'])} ({len(p['moved_tasks'])} tasks), "
                f"unmoved {_seconds(p['longest_gap_unmoved_s'])}, rebalances {p['rebalances']}, "
                f"restored {p['restored_records']:,}, reprocessed {p['reprocessed_records']:,}")
            lines.extend(f"    note: {note}" for note in p["notes"])
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_argument_group("sizes")
    size.add_argument("--instances", type=int, default=2, help="instances before scaling out")
    size.add_argument("--partitions", type=int, default=4, help="input partitions (tasks)")
    size.add_argument("--keys", type=int, default=40_000)
    size.add_argument("--state-mb", type=float, nargs="+", default=[100.0, 800.0],
                      help="changelog per task at the start, in MB (one run of every "
                           "strategy per size)")
    size.add_argument("--value-bytes", type=int, default=8000,
                      help="payload per record (the state's and the input's)")
    size.add_argument("--rate", type=int, default=400, help="steady input records/s")
    timing = parser.add_argument_group("timing")
    timing.add_argument("--settle", type=float, default=8.0,
                        help="seconds of steady state observed before each change and at end")
    timing.add_argument("--start-timeout", type=float, default=1200.0,
                        help="deadline for the first balance (restoring the prefilled state)")
    timing.add_argument("--phase-timeout", type=float, default=600.0,
                        help="deadline for a change to end with the group balanced (every "
                             "wait inside the change included)")
    timing.add_argument("--balance-window", type=float, default=1.5,
                        help="seconds the balanced condition must hold")
    timing.add_argument("--session-timeout-ms", type=int, default=6000)
    timing.add_argument("--join-rounds", type=int, default=5,
                        help="join rounds the probe group measures (the median is the unit)")
    relay = parser.add_argument_group("relay (and Kafka Streams)")
    relay.add_argument("--acceptable-lag", type=int, default=1000,
                       help="Relay's acceptable_lag, and Kafka Streams' "
                            "acceptable.recovery.lag")
    relay.add_argument("--max-learners", type=int, default=2,
                       help="Relay's max_learners, and Kafka Streams' max.warmup.replicas")
    relay.add_argument("--worker-log-level", default="INFO",
                       help="log level of the Relay workers (their logs stay in the run "
                            "directory: rebalances and who asked for them)")
    parser.add_argument("--strategies", nargs="+", default=list(DEFAULT_STRATEGIES),
                        choices=STRATEGIES)
    parser.add_argument("--phases", nargs="+", default=list(DEFAULT_PHASES), choices=PHASES,
                        help="the changes, in order (scale-in and hand-over remove the "
                             "newest instance a scale-out added)")
    parser.add_argument("--save-outputs", action="store_true",
                        help="also write every output (task, pid, time, input sequence "
                             "number) beside the JSON, one gzipped CSV per strategy and size")
    parser.add_argument("--bootstrap", default=None,
                        help="an existing broker (default: a fresh one of --engine per "
                             "strategy)")
    add_engine_arguments(parser)
    parser.add_argument("--json", type=Path, default=Path("results/scaling.json"),
                        help="where to write the figures; the plots go beside it (.png, "
                             "-gaps.png)")
    args = parser.parse_args(argv)
    phases = list(args.phases)
    added = 0
    for kind in phases:
        added += {"scale-out": 1, "scale-in": -1, "hand-over": -1}.get(kind, 0)
        if added < 0:
            parser.error(f"--phases {' '.join(phases)}: a {kind} needs a scale-out before it")
    return args


def write_json(args: argparse.Namespace, sizes: list[Sizes], rounds: JoinRounds | None,
               results: list[dict[str, Any]], started: float) -> None:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "sizes": [{**asdict(s), "records_per_task": s.records_per_task} for s in sizes],
        "broker": describe(args.engine, args.kafka_nodes, args.bootstrap),
        "join_round": None if rounds is None else {**asdict(rounds),
                                                    "median_s": rounds.median_s},
        "wall_seconds": time.time() - started, "plot": str(args.json.with_suffix(".png")),
        "gap_plot": str(gap_plot_path(args.json)), "results": results}, indent=2))


def gap_plot_path(json_path: Path) -> Path:
    return json_path.with_name(f"{json_path.stem}-gaps.png")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # SIGTERM ends a run like Ctrl-C does: workers and brokers are stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sizes = [Sizes(args.instances, args.partitions, args.keys, state_mb, args.value_bytes,
                   args.rate) for state_mb in args.state_mb]
    started = time.time()

    def report(rounds: JoinRounds, results: list[dict[str, Any]]) -> None:
        # After every strategy: a later crash or interruption keeps what was measured.
        write_json(args, sizes, rounds, results, started)

    rounds, results = asyncio.run(run_all(args, sizes, report))
    write_json(args, sizes, rounds, results, started)
    png = args.json.with_suffix(".png")
    # A plot is a convenience (the figures are in the JSON): a failing one stops nothing.
    try:
        plot_throughput(results, args.rate, png)
    except Exception:
        traceback.print_exc()
    try:
        plot_gaps_by_state(results, rounds.median_s, gap_plot_path(args.json))
    except Exception:
        traceback.print_exc()
    print("\n".join(summary_lines(results)))
    print()
    print(engine_label({"broker": describe(args.engine, args.kafka_nodes, args.bootstrap),
                        "join_round": {"median_s": rounds.median_s}}))
    print("\n".join(summary_table(rounds, results)))
    print(f"\nwrote {args.json}, {png} and {gap_plot_path(args.json)} in "
          f"{time.time() - started:.0f}s")


if __name__ == "__main__":
    main()
