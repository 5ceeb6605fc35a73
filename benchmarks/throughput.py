"""``python -m benchmarks.throughput --json PATH``: how fast one process counts records, Relay
against its Python peers and against the client libraries' ceilings.

The workload: ``--records`` records (default 1,000,000) prefilled over 4 partitions and
10,000 keys on a fresh broker of ``--engine`` (``tansu``, the default, or ``kafka``); per key
a count kept in a RocksDB store with a changelog and one output per input; one process, one
thread, commits every second. The report names the broker and its join round, measured on
it before the strategies (:mod:`benchmarks.broker_engine`). Each strategy runs once, as a
process of its own (so its CPU time and peak RSS are its own), in a fresh consumer group
with fresh output and internal topics, over the same input:

- ``relay-alo-100ms``, ``relay-alo-1s``, ``relay-eos-100ms``, ``relay-eos-1s``: Relay
  at-least-once and exactly-once (``processing_guarantee="exactly_once"``) with commit
  intervals of 100 ms and 1 s, built and configured only through its public API (``App``,
  the DSL, settings), so the figures are those of whichever runtime is installed;
- ``kafka-streams``, ``kafka-streams-eos``: Kafka Streams 4.4 running the same app in Java
  (``benchmarks/peers/kafka-streams``, built by Maven on first use): a count per key in its
  RocksDB store with a changelog, caching off so that every update goes out, one stream
  thread, commits every second, at-least-once and ``exactly_once_v2``, its JVM heap
  :data:`KAFKA_STREAMS_HEAP`; it connects to the broker the benchmark uses. It does not run
  on Tansu (its consumer never joins the group: Tansu drops its connections to the group
  coordinator), which its row says after ``BENCH_JOIN_TIMEOUT_S`` (120 s) rather than at the
  ``--timeout``; it is measured against Apache Kafka (``--bootstrap``);
- ``quix``: Quix Streams running the equivalent app (a stateful ``apply``);
- ceilings: ``aiokafka-consume`` and ``confluent-consume`` (consume and commit, nothing
  else), ``aiokafka-passthrough`` and ``confluent-passthrough`` (every record produced
  again unchanged, no state; the producer flushed before each commit).

Per strategy: records/s from process start to the last record done (and from the first
record done to the last, which leaves the group join out), records/s in the steady
state (between 20 % and 90 % of the input), the process's CPU time per record in the steady
state (every thread of it, read in the process itself) and over the whole run (from the
kernel's accounting when it exits), its peak RSS, the time from process start to its first
output (the first record done: its output handed to the producer, or for a consume-only
ceiling consumed), and whether the final counts are exact: the output topic is read back
(read-committed) and, for the stateful apps, the last count per key must equal the number of
input records with that key and there must be one output per input; for a passthrough every
key must have as many outputs as inputs; a consume-only ceiling must have consumed every
record. Then the ratios: Relay at-least-once over the best Python peer, over Kafka Streams
and over the fastest passthrough, exactly-once over at-least-once and over Kafka Streams
exactly-once.

A record is done when the app has handed its output to the client library's producer (the
ceilings' producers deliver in the background and flush before each commit and at the end,
the time of which the end-of-input figure leaves out), or, for a consume-only ceiling, when
it was consumed. On Tansu the first output comes after the group's first join, which took
about half the client's session timeout here (aiokafka's default of 10 s: 5 s; Relay's
and librdkafka's 45 s: 23 s; faust's 60 s: 31 s); every strategy runs with its own defaults,
so the start-up figures include that, and the steady ones do not.

A strategy that fails, exits early or passes ``--timeout`` is reported as failed with its
error and what it measured, and the run goes on; the JSON is rewritten after every
strategy, and a plot (steady records/s and CPU per record) is written beside it.

Quix Streams on Tansu: Quix (3.28) derives its changelog topics' configuration from the
input topic's, as DescribeConfigs reports it, and requires ``retention.ms`` there
(``KeyError: 'retention.ms'`` otherwise). Tansu reports only the settings a topic was created
with, so the input topic is created with ``retention.ms=-1`` (:data:`INPUT_CONFIG`), which is
also what Tansu does anyway (it deletes nothing); the other strategies do not read it. faust
needs no workaround here, since every run starts from empty tables (the scaling benchmark's
restart workaround for Tansu's short ListOffsets answer does not apply).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import msgpack
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from benchmarks.broker_engine import (
    add_engine_arguments,
    describe,
    engine_label,
    measure_join_round,
    rounds_dict,
    start_broker,
)
from benchmarks.input_fill import fill, true_counts
from benchmarks.peers import kafka_streams
from benchmarks.scaling_workers import REPO_ROOT, die_with_the_benchmark
from benchmarks.throughput_report import Sample, figures, plot, ratio_lines, ratios, table
from statestore.topics import TopicSpec, ensure_topics, partition_count


@dataclass(frozen=True)
class Strategy:
    name: str
    #: ``stateful`` (last output per key is the count), ``passthrough`` (one output per
    #: input, unchanged) or ``consume`` (no output).
    kind: str
    app: str
    commit_ms: int = 1000
    guarantee: str = "at_least_once"

    def command(self) -> list[str]:
        if self.app == "kafka-streams":
            # Built by Maven on first use; a missing Java or Maven fails this strategy alone.
            return kafka_streams.java_command("CountingApp", heap=KAFKA_STREAMS_HEAP)
        if self.app == "faust":
            return [sys.executable, "-m", "faust", "-A", "benchmarks.throughput_faust_app",
                    "worker", "--without-web", "--loglevel", "warn"]
        return [sys.executable, "-m", "benchmarks.throughput_apps", self.app]


STRATEGIES = (
    Strategy("relay-alo-100ms", "stateful", "relay", 100),
    Strategy("relay-alo-1s", "stateful", "relay", 1000),
    Strategy("relay-eos-100ms", "stateful", "relay", 100, "exactly_once"),
    Strategy("relay-eos-1s", "stateful", "relay", 1000, "exactly_once"),
    Strategy("kafka-streams", "stateful", "kafka-streams", 1000),
    Strategy("kafka-streams-eos", "stateful", "kafka-streams", 1000, "exactly_once"),
    Strategy("faust", "stateful", "faust"),
    Strategy("quix", "stateful", "quix"),
    Strategy("aiokafka-consume", "consume", "aiokafka-consume"),
    Strategy("aiokafka-passthrough", "passthrough", "aiokafka-passthrough"),
    Strategy("confluent-consume", "consume", "confluent-consume"),
    Strategy("confluent-passthrough", "passthrough", "confluent-passthrough"),
)
BY_NAME = {s.name: s for s in STRATEGIES}
#: The input topic's settings, stated so that the broker describes them (see above).
INPUT_CONFIG = {"retention.ms": "-1"}
PEERS = ("faust", "quix")
#: The Java peer, compared with Relay at-least-once and exactly-once at the same commit
#: interval.
JAVA_PEERS = {"at_least_once": "kafka-streams", "exactly_once": "kafka-streams-eos"}
#: The Kafka Streams app's JVM heap: its store lives in RocksDB, off the heap.
KAFKA_STREAMS_HEAP = "512m"
PASSTHROUGHS = ("aiokafka-passthrough", "confluent-passthrough")
#: How long a worker may take to flush, commit and exit after SIGTERM.
STOP_TIMEOUT_S = 60.0


@dataclass
class Result:
    strategy: str
    kind: str
    commit_interval_ms: int
    processing_guarantee: str
    records_per_s_total: float | None = None
    records_per_s_steady: float | None = None
    cpu_us_per_record_steady: float | None = None
    cpu_us_per_record_total: float | None = None
    peak_rss_mib: float | None = None
    first_output_s: float | None = None
    seconds_to_done: float | None = None
    records_per_s_after_first: float | None = None
    records_done: int = 0
    outputs: int | None = None
    keys_wrong: int | None = None
    #: ``exact``, ``not exact`` or ``not checked``.
    counts: str = "not checked"
    exit_code: int | None = None
    load_before: float = 0.0
    log: str = ""
    error: str | None = None
    samples: list[Sample] = field(default_factory=list)


class ProgressReader(threading.Thread):
    """Collects a worker's progress samples from its pipe."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.samples: list[Sample] = []

    def run(self) -> None:
        with os.fdopen(self.fd) as pipe:
            for line in pipe:
                with contextlib.suppress(ValueError):
                    count, wall, cpu = line.split()
                    self.samples.append((int(count), float(wall), float(cpu)))


def _wait(pid: int, timeout_s: float) -> tuple[int, Any] | None:
    """The exit status and resource usage of the child, or None if it still runs."""
    deadline = time.monotonic() + timeout_s
    while True:
        done_pid, status, usage = os.wait4(pid, os.WNOHANG)
        if done_pid:
            return os.waitstatus_to_exitcode(status), usage
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def _log_tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, [TopicSpec(topic, partitions)])
    finally:
        await admin.close()


async def read_outputs(bootstrap: str, topic: str, idle_s: float = 5.0) -> list[tuple[str, Any]]:
    """Every committed output (key, value) of ``topic``, partition by partition in order."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                isolation_level="read_committed")
    await consumer.start()
    outputs: list[tuple[str, Any]] = []
    try:
        partitions = [TopicPartition(topic, p)
                      for p in range(await partition_count(bootstrap, topic) or 0)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        last_progress = time.monotonic()
        # A transaction's marker may be the last offset: idle for a while also means done.
        while time.monotonic() - last_progress < idle_s:
            positions = [await consumer.position(tp) for tp in partitions]
            if all(pos >= ends[tp] for pos, tp in zip(positions, partitions, strict=True)):
                break
            batches = await consumer.getmany(timeout_ms=500, max_records=10_000)
            for records in batches.values():
                outputs.extend((msgpack.unpackb(r.key), msgpack.unpackb(r.value))
                               for r in records)
                last_progress = time.monotonic()
    finally:
        await consumer.stop()
    return outputs


def check_counts(kind: str, outputs: list[tuple[str, Any]], expected: dict[str, int],
                 records: int) -> tuple[int, bool]:
    """(keys whose final figure is wrong, whether everything is exact)."""
    if kind == "stateful":
        last: dict[str, Any] = {}
        for key, value in outputs:
            last[key] = value
        wrong = sum(last.get(key) != n for key, n in expected.items()) + len(
            set(last) - set(expected))
    else:
        seen = Counter(key for key, _ in outputs)
        wrong = sum(seen.get(key, 0) != n for key, n in expected.items()) + len(
            set(seen) - set(expected))
    return wrong, wrong == 0 and len(outputs) == records


async def run_strategy(strategy: Strategy, args: argparse.Namespace, bootstrap: str,
                       source: str, run_dir: Path, expected: dict[str, int]) -> Result:
    result = Result(strategy.name, strategy.kind, strategy.commit_ms, strategy.guarantee,
                    load_before=os.getloadavg()[0])
    group = f"tp-{strategy.name}-{uuid.uuid4().hex[:8]}"
    output = f"{group}-out"
    state_dir = run_dir / "state" / strategy.name
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / f"{strategy.name}.log"
    result.log = str(log_path)
    reader: ProgressReader | None = None
    process: subprocess.Popen[bytes] | None = None
    usage: Any = None
    started = time.time()
    write_fd = -1
    try:
        if strategy.kind != "consume":
            await create_topic(bootstrap, output, args.partitions)
        read_fd, write_fd = os.pipe()
        env = {**os.environ, "BENCH_BOOTSTRAP": bootstrap, "BENCH_INPUT": source,
               "BENCH_OUTPUT": output, "BENCH_GROUP": group, "BENCH_STATE_DIR": str(state_dir),
               "BENCH_COMMIT_MS": str(strategy.commit_ms), "BENCH_GUARANTEE": strategy.guarantee,
               "BENCH_PARTITIONS": str(args.partitions), "BENCH_PROGRESS_FD": str(write_fd),
               "PYTHONPATH": os.pathsep.join(
                   p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
        reader = ProgressReader(read_fd)
        reader.start()
        with open(log_path, "wb") as log:
            started = time.time()
            process = subprocess.Popen(
                strategy.command(), env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=REPO_ROOT, pass_fds=(write_fd,),
                preexec_fn=die_with_the_benchmark)
        # The worker holds the only writer now: the reader ends when the worker does.
        os.close(write_fd)
        write_fd = -1
        deadline = time.monotonic() + args.timeout
        exited = None
        while True:
            samples = reader.samples
            if samples and samples[-1][0] >= args.records:
                break
            exited = _wait(process.pid, 0.05)
            if exited is not None:
                break
            if time.monotonic() > deadline:
                done = samples[-1][0] if samples else 0
                raise TimeoutError(f"{done:,} of {args.records:,} records done after "
                                   f"{args.timeout:.0f}s")
            await asyncio.sleep(0.05)
        if exited is None:
            process.send_signal(signal.SIGTERM)
            exited = _wait(process.pid, STOP_TIMEOUT_S)
            if exited is None:
                process.kill()
                exited = _wait(process.pid, 10)
                result.error = f"did not exit within {STOP_TIMEOUT_S:.0f}s of SIGTERM"
        if exited is not None:
            result.exit_code, usage = exited
            process.returncode = result.exit_code
        if reader.samples and reader.samples[-1][0] < args.records:
            raise RuntimeError(f"the worker exited (code {result.exit_code}) after "
                               f"{reader.samples[-1][0]:,} records: {_log_tail(log_path)}")
        if not reader.samples:
            raise RuntimeError(f"the worker exited (code {result.exit_code}) without reporting "
                               f"progress: {_log_tail(log_path)}")
        if strategy.kind == "consume":
            result.counts = "exact" if reader.samples[-1][0] == args.records else "not exact"
        else:
            outputs = await read_outputs(bootstrap, output)
            result.outputs = len(outputs)
            result.keys_wrong, exact = check_counts(strategy.kind, outputs, expected,
                                                    args.records)
            result.counts = "exact" if exact else "not exact"
    except Exception as exc:
        traceback.print_exc()
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        if write_fd >= 0:
            os.close(write_fd)
        if process is not None and process.returncode is None:
            with contextlib.suppress(OSError):
                process.kill()
            exited = _wait(process.pid, 10)
            if exited is not None:
                result.exit_code, usage = exited
                process.returncode = result.exit_code
        if reader is not None:
            reader.join(timeout=5)
            result.samples = list(reader.samples)
        shutil.rmtree(state_dir, ignore_errors=True)
    if usage is not None:
        result.peak_rss_mib = usage.ru_maxrss / 1024
        result.cpu_us_per_record_total = ((usage.ru_utime + usage.ru_stime) * 1e6
                                          / args.records)
    if result.samples:
        result.records_done = result.samples[-1][0]
        for name, value in asdict(figures(result.samples, args.records, started)).items():
            setattr(result, name, value)
    return result


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("relay-streams", "aiokafka", "confluent-kafka", "faust-streaming",
                    "quixstreams", "rocksdict"):
        with contextlib.suppress(Exception):
            found[package] = version(package)
    with contextlib.suppress(Exception):
        import confluent_kafka

        found["librdkafka"] = confluent_kafka.libversion()[0]
    return found


def report(args: argparse.Namespace, results: list[Result], extra: dict[str, Any]) -> None:
    data = [asdict(r) for r in results]
    document = {
        "records": args.records, "keys": args.keys, "partitions": args.partitions,
        "strategies": args.strategies, "timeout_s": args.timeout,
        "window": [0.2, 0.9], **extra,
        "machine": {"cpus": os.cpu_count(), "load_now": os.getloadavg()},
        "versions": versions(),
        "plot": str(args.json.with_suffix(".png")),
        "ratios": ratios(data, PEERS, PASSTHROUGHS, JAVA_PEERS),
        "results": data,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2))


async def run_all(args: argparse.Namespace) -> tuple[list[Result], dict[str, Any]]:
    broker = None if args.bootstrap else start_broker(args.engine, args.kafka_nodes)
    bootstrap = args.bootstrap or broker.bootstrap_servers  # type: ignore[union-attr]
    run_dir = Path(tempfile.mkdtemp(prefix="throughput-run-"))
    extra: dict[str, Any] = {"run_dir": str(run_dir), "load_at_start": os.getloadavg(),
                             "broker": describe(args.engine, args.kafka_nodes, args.bootstrap)}
    results: list[Result] = []
    try:
        extra["join_round"] = rounds_dict(await measure_join_round(bootstrap))
        print(engine_label(extra), flush=True)
        source = f"throughput-in-{uuid.uuid4().hex[:8]}"
        print(f"filling {source}: {args.records:,} records over {args.keys:,} keys, "
              f"{args.partitions} partitions; worker logs in {run_dir}", flush=True)
        filled = time.perf_counter()
        await fill(bootstrap, source, args.records, args.keys, args.partitions,
                   INPUT_CONFIG)
        extra["fill_records_per_s"] = args.records / (time.perf_counter() - filled)
        expected = true_counts(args.records, args.keys)
        for name in args.strategies:
            result = await run_strategy(BY_NAME[name], args, bootstrap, source, run_dir,
                                        expected)
            results.append(result)
            shown = ("FAILED: " + result.error if result.error else
                     f"{result.records_per_s_steady or 0:,.0f} records/s steady, "
                     f"{result.cpu_us_per_record_steady or 0:.1f} us CPU/record, counts "
                     f"{result.counts}")
            print(f"{name}: {shown} (load {result.load_before:.1f})", flush=True)
            # After every strategy: a later crash or interruption keeps what was measured.
            report(args, results, extra)
    finally:
        if broker is not None:
            broker.stop()
    extra["load_at_end"] = os.getloadavg()
    return results, extra


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--strategies", nargs="+", default=[s.name for s in STRATEGIES],
                        choices=[s.name for s in STRATEGIES])
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds a strategy may take to get through the input")
    parser.add_argument("--bootstrap", default=None,
                        help="an existing broker (default: a fresh one of --engine)")
    add_engine_arguments(parser)
    parser.add_argument("--json", type=Path, default=Path("results/throughput.json"),
                        help="where to write the figures; the plot goes beside it (.png)")
    args = parser.parse_args(argv)
    if args.records < 10 or args.keys < 1 or args.partitions < 1:
        parser.error("need --records >= 10, --keys >= 1, --partitions >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    # SIGTERM ends a run like Ctrl-C: workers (tied to this process) and the broker stop.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.time()
    results, extra = asyncio.run(run_all(args))
    extra["wall_seconds"] = time.time() - started
    extra["benchmark_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report(args, results, extra)
    png = args.json.with_suffix(".png")
    try:  # the figures are in the JSON: a failing plot stops nothing
        plot([asdict(r) for r in results], png,
             f"{args.records:,} records, {args.keys:,} keys, {args.partitions} partitions")
    except Exception:
        traceback.print_exc()
    data = json.loads(args.json.read_text())
    print("\n".join(table(data["results"])))
    print()
    print("\n".join(ratio_lines(data["ratios"])))
    print(engine_label(data))
    print(f"\nload average at start {extra['load_at_start'][0]:.1f}, at end "
          f"{extra['load_at_end'][0]:.1f}; wrote {args.json} and {png} in "
          f"{extra['wall_seconds']:.0f}s")
    return data


if __name__ == "__main__":
    main()
