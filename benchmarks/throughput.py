"""``python -m benchmarks.throughput --records N --repeat R [--profile PATH]``: the at-least-once
process loop's throughput, CPU time per record, peak RSS and time to the first output.

Fills an input topic once (the counting app's input of :mod:`benchmarks.observability_overhead`:
msgpack keys ``k<i % keys>`` and values), then runs the counting app (count per key into a
changelogged store, one output per input, one thread, metrics and query servers off) over it
from the start, each run as a new group in a child process of its own, so that the peak RSS
and the CPU time are the app's alone (the broker and the filler are other processes). The
throughput and CPU time are taken between 20 % and 90 % of the input processed; the time to
the first output is from the app's start to its first processed record. ``--profile`` writes
a cProfile of the child's whole run (to read with ``pstats``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.observability_overhead import WINDOW, fill, processed
from streams.app import App
from streams.embedded_broker import EmbeddedBroker


async def app_run(bootstrap: str, topic: str, records: int, timeout_s: float) -> dict[str, Any]:
    """One run of the counting app over ``topic``, in this process."""
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="relay-throughput-") as state_dir:
        app_id = f"throughput-{uuid.uuid4().hex[:10]}"
        app = App(app_id, bootstrap_servers=bootstrap, state_dir=state_dir,
                  session_timeout_ms=6000, heartbeat_interval_ms=1000)
        app.stream(topic).group_by_key().count(store="counts").to_stream().to(f"{app_id}-out")
        begun = time.perf_counter()
        running = asyncio.create_task(app.run_async())
        try:
            low, high = (int(records * share) for share in WINDOW)
            deadline = time.monotonic() + timeout_s
            started: float | None = None
            while True:
                if running.done():
                    running.result()
                    raise RuntimeError("the app stopped before processing its input")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{processed(app):,} of {records:,} records processed")
                done = processed(app)
                if done and "first_output_s" not in result:
                    result["first_output_s"] = time.perf_counter() - begun
                if started is None and done >= low:
                    started, cpu_at_start, at_start = time.perf_counter(), time.process_time(), done
                if started is not None and done >= high:
                    seconds = time.perf_counter() - started
                    result["records_per_s"] = (done - at_start) / seconds
                    result["cpu_us_per_record"] = ((time.process_time() - cpu_at_start) * 1e6
                                                   / (done - at_start))
                    break
                await asyncio.sleep(0.005)
        finally:
            app.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(running, 60)
    # Linux reports kilobytes.
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def child(args: argparse.Namespace) -> None:
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    result = asyncio.run(app_run(args.bootstrap, args.topic, args.records, args.timeout))
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    print(json.dumps(result), flush=True)


def parent(args: argparse.Namespace) -> dict[str, Any]:
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = EmbeddedBroker().start()
        bootstrap = broker.bootstrap_servers
    runs: list[dict[str, Any]] = []
    try:
        topic = f"throughput-in-{uuid.uuid4().hex[:10]}"
        asyncio.run(fill(bootstrap, topic, args.records, args.keys, args.partitions))
        for index in range(args.repeat):
            command = [sys.executable, "-m", "benchmarks.throughput", "--child",
                       "--bootstrap", bootstrap, "--topic", topic,
                       "--records", str(args.records), "--timeout", str(args.timeout)]
            if args.profile:
                command += ["--profile", str(args.profile)]
            out = subprocess.run(command, capture_output=True, text=True, check=False)
            lines = out.stdout.strip().splitlines()
            run = json.loads(lines[-1]) if out.returncode == 0 and lines else {
                "error": out.stderr[-2000:]}
            runs.append(run)
            print(f"run {index}: {json.dumps(run)}", flush=True)
    finally:
        if broker is not None:
            broker.stop()
    summary = {name: statistics.median(r[name] for r in runs if name in r)
               for name in ("records_per_s", "cpu_us_per_record", "peak_rss_mb",
                            "first_output_s") if any(name in r for r in runs)}
    print(f"median: {json.dumps(summary)}")
    return {"records": args.records, "keys": args.keys, "partitions": args.partitions,
            "median": summary, "runs": runs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return
    result = parent(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
