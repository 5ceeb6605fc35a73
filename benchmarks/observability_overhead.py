"""``python -m benchmarks.observability_overhead --records N --repeat R --json PATH``: what
serving metrics and interactive queries costs the process loop.

Fills an input topic once, then runs the counting app (count per key into a store) over it
from the start, each run as a new group, alternately with the observability servers off and
on (``metrics_port`` and ``query_port`` set, the status topic followed for routing, and a
client in a process of its own scraping ``/metrics`` once a second and querying a key over
HTTP five times a second). A run's figures are taken in its steady state, between 20 % and
90 % of the input processed (the join and the tail left out): the throughput, records over
the time that took (when a small input crosses that window between two samples, from the
sample before), and the process's CPU time per record (every thread of the process, the
metrics server's included; the broker and the observing client are other processes). The
CPU time is the steadier figure on a shared machine, where other work takes turns on the
cores and moves the throughput by tens of percent between runs. The runs alternate so that
that noise falls on both modes alike; the medians and the median of the pairwise ratios are
reported. A run that fails is recorded with its error and the other figures are kept.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from benchmarks.input_fill import fill
from streams.app import App
from streams.testing.broker import EmbeddedBroker

MODES = ("off", "on")
#: The steady state: from this share of the input processed to that one.
WINDOW = (0.2, 0.9)
#: The observer: scrapes the metrics once a second and queries a key 5 times a second.
CLIENT = """
import sys, time, urllib.request, urllib.error
metrics, query = sys.argv[1], sys.argv[2]
scrapes = queries = failures = 0
next_scrape = time.monotonic()
while True:
    now = time.monotonic()
    try:
        if now >= next_scrape:
            urllib.request.urlopen(metrics, timeout=5).read()
            scrapes += 1
            next_scrape = now + 1.0
        urllib.request.urlopen(query, timeout=5).read()
        queries += 1
    except urllib.error.HTTPError as error:
        queries += 1
        failures += error.code not in (404, 503)
    except OSError:
        failures += 1
    print(scrapes, queries, failures, flush=True)
    time.sleep(0.2)
"""


@dataclass
class Run:
    mode: str
    index: int
    records_per_s: float | None = None
    seconds: float | None = None
    cpu_us_per_record: float | None = None
    scrapes: int = 0
    queries: int = 0
    client_failures: int = 0
    load_before: float = 0.0
    error: str | None = None


def processed(app: App) -> int:
    return sum(task.records_processed for thread in app.threads
               for task in thread.tasks.values())


async def one_run(bootstrap: str, topic: str, records: int, mode: str, index: int,
                  timeout_s: float) -> Run:
    run = Run(mode, index, load_before=os.getloadavg()[0])
    on = mode == "on"
    settings: dict[str, Any] = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
    if on:
        settings.update(metrics_port=0, metrics_host="127.0.0.1", query_port=0,
                        query_host="127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="relay-overhead-") as state_dir:
        app_id = f"overhead-{uuid.uuid4().hex[:10]}"
        app = App(app_id, bootstrap_servers=bootstrap, state_dir=state_dir, **settings)
        app.stream(topic).group_by_key().count(store="counts").to_stream().to(f"{app_id}-out")
        running = asyncio.create_task(app.run_async())
        client: subprocess.Popen[str] | None = None
        try:
            low, high = (int(records * share) for share in WINDOW)
            deadline = time.monotonic() + timeout_s
            started: float | None = None
            last = (time.perf_counter(), time.process_time(), 0)
            while True:
                if running.done():
                    running.result()
                    raise RuntimeError("the app stopped before processing its input")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{processed(app):,} of {records:,} records processed "
                                       f"after {timeout_s:.0f}s")
                if on and client is None and app.metrics_server is not None \
                        and app.query_server is not None and app.query_server.url:
                    client = subprocess.Popen(
                        [sys.executable, "-c", CLIENT, app.metrics_server.url,
                         f"{app.query_server.url}/stores/counts/k1"],
                        stdout=subprocess.PIPE, text=True)
                done = processed(app)
                sample = (time.perf_counter(), time.process_time(), done)
                if started is None and done >= low:
                    # Crossed whole between two samples (the loop held the event loop for
                    # several passes): the window starts at the sample before.
                    started, cpu_at_start, at_start = sample if done < high else last
                last = sample
                if started is not None and done >= high:
                    run.seconds = time.perf_counter() - started
                    run.records_per_s = (done - at_start) / run.seconds
                    run.cpu_us_per_record = ((time.process_time() - cpu_at_start) * 1e6
                                             / (done - at_start))
                    break
                await asyncio.sleep(0.01)
        except Exception as exc:
            run.error = f"{type(exc).__name__}: {exc}"
        finally:
            if client is not None:
                client.terminate()
                out, _ = client.communicate(timeout=10)
                lines = out.split()
                if len(lines) >= 3:
                    run.scrapes, run.queries, run.client_failures = map(int, lines[-3:])
            app.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(running, 60)
    return run


def compare(runs: list[Run], figure: str) -> dict[str, Any]:
    """One figure's medians per mode, the ratio on/off of the medians, and the ratios of
    the runs paired in the order they ran."""
    values = {mode: [getattr(r, figure) for r in runs
                     if r.mode == mode and getattr(r, figure)] for mode in MODES}
    by_mode = {mode: [r for r in runs if r.mode == mode] for mode in MODES}
    ratios = [getattr(on, figure) / getattr(off, figure)
              for off, on in zip(by_mode["off"], by_mode["on"], strict=False)
              if getattr(off, figure) and getattr(on, figure)]
    medians = {mode: statistics.median(v) if v else None for mode, v in values.items()}
    return {
        "median": medians,
        "runs": {mode: len(v) for mode, v in values.items()},
        "on_over_off_of_medians": (medians["on"] / medians["off"]
                                   if medians["on"] and medians["off"] else None),
        "on_over_off_pairwise": ratios,
        "on_over_off_median_pairwise": statistics.median(ratios) if ratios else None,
    }


def summarize(runs: list[Run]) -> dict[str, Any]:
    return {"throughput_records_per_s": compare(runs, "records_per_s"),
            "cpu_us_per_record": compare(runs, "cpu_us_per_record")}


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = EmbeddedBroker().start()
        bootstrap = broker.bootstrap_servers
    runs: list[Run] = []
    try:
        topic = f"overhead-in-{uuid.uuid4().hex[:10]}"
        print(f"filling {topic}: {args.records:,} records over {args.keys} keys, "
              f"{args.partitions} partitions", flush=True)
        await fill(bootstrap, topic, args.records, args.keys, args.partitions)
        for index in range(args.repeat):
            # Alternate which mode goes first, so that neither always runs on a warmer machine.
            order = MODES if index % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                run = await one_run(bootstrap, topic, args.records, mode, index,
                                    args.timeout)
                runs.append(run)
                figure = (f"{run.records_per_s:,.0f} records/s, "
                          f"{run.cpu_us_per_record:.1f} us CPU/record"
                          if run.records_per_s and run.cpu_us_per_record
                          else f"failed: {run.error}")
                extra = (f" ({run.scrapes} scrapes, {run.queries} queries, "
                         f"{run.client_failures} client failures)" if mode == "on" else "")
                print(f"run {index} {mode:>3}: {figure}{extra}; load {run.load_before:.1f}",
                      flush=True)
    finally:
        if broker is not None:
            broker.stop()
    summary = summarize(runs)
    for name, unit in (("throughput_records_per_s", "records/s"),
                       ("cpu_us_per_record", "us CPU/record")):
        data = summary[name]
        medians = data["median"]
        line = f"{name}: median off {medians['off'] or 0:,.1f}, on {medians['on'] or 0:,.1f} {unit}"
        for key in ("on_over_off_of_medians", "on_over_off_median_pairwise"):
            value = data[key]
            line += f"; {key} " + ("n/a" if value is None else
                                   f"{value:.3f} ({(value - 1) * 100:+.1f} %)")
        print(line)
    return {
        "records": args.records, "keys": args.keys, "partitions": args.partitions,
        "repeat": args.repeat, "window": WINDOW, **summary,
        "runs": [asdict(r) for r in runs],
        "machine": {"cpus": os.cpu_count(), "load_after": os.getloadavg()[0]},
        "versions": {"python": platform.python_version(), "aiokafka": version("aiokafka"),
                     "aiohttp": version("aiohttp"),
                     "prometheus_client": version("prometheus_client")},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5, help="runs per mode, interleaved")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.records < 10 or args.keys < 2 or args.partitions < 1 or args.repeat < 1:
        parser.error("need --records >= 10, --keys >= 2, --partitions >= 1, --repeat >= 1")
    result = asyncio.run(run_all(args))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
