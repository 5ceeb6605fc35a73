"""Session windows with final results, a table-table join and a foreign-key join through a
crash: a worker
killed (SIGKILL) while it works through its input and restarted on the same state directory
gives, with exactly-once, the very outputs the topology test driver gives for the same input
(the worker is a process of its own). And a global table, restored from its topic at start
and followed while the app runs. Real broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streams.app import App
from streams.group.status_topic import read_status
from streams.testing import TopologyTestDriver
from tests.broker.streams.apps.dsl_ops import build
from tests.broker.streams.harness import (
    BASE_MS,
    FAST_GROUP,
    ROOT,
    STATIC,
    create_topics,
    latest,
    make_app,
    produce,
    read_all,
    read_committed,
    running,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.broker

USERS = 300


def clicks(rounds: range) -> list[tuple[str, dict[str, int], int]]:
    """Clicks of every user per round, 700 ms apart, with a 3 s pause every fifth round (a
    new session) and some disorder within a round; from a recent base (records near 1970
    would leave the topics at the broker's next time-retention check)."""
    return [(f"u{i % USERS}", {"n": i}, BASE_MS + r * 700 + (r // 5) * 3000 + (i % 7) * 100)
            for r in rounds for i in range(r * USERS, (r + 1) * USERS)]


def rows(side: str, phase: int) -> list[tuple[str, Any]]:
    if phase == 1:
        keys = range(200) if side == "left" else range(50, 200)
        return [(f"k{k}", f"{side}{k}") for k in keys]
    # Updates of some rows, deletes of others, on both sides.
    keys = range(0, 200, 3) if side == "left" else range(60, 200, 4)
    return [(f"k{k}", None if k % 2 else f"{side}{k}-v2") for k in keys]


def orders(phase: int) -> list[tuple[str, Any]]:
    """Orders naming right rows by foreign key; in phase 2 some move, some go."""
    if phase == 1:
        return [(f"o{i}", {"ref": f"k{(i * 2) % 200}", "n": i}) for i in range(100)]
    return [(f"o{i}", None if i % 10 == 0 else {"ref": f"k{(i * 3) % 200}", "n": i})
            for i in range(0, 100, 5)]


def spawn(prefix: str, app_id: str, bootstrap: str, state_dir: Path) -> subprocess.Popen[bytes]:
    python_path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    settings = {**FAST_GROUP, **STATIC, "processing_guarantee": "exactly_once",
                "commit_interval_ms": 300, "group_instance_id": "worker"}
    env = {**os.environ, "PYTHONPATH": python_path, "DSL_PREFIX": prefix,
           "RELAY_APPLICATION_ID": app_id, "RELAY_BOOTSTRAP_SERVERS": bootstrap,
           "RELAY_STATE_DIR": str(state_dir),
           **{f"RELAY_{k.upper()}": str(v) for k, v in settings.items()}}
    state_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "streams", "run", "tests.broker.streams.apps.dsl_ops:app",
         "--log-level", os.environ.get("TEST_WORKER_LOG_LEVEL", "WARNING")],
        cwd=state_dir.parent, env=env)


def by_key(records: list[tuple[Any, Any]]) -> dict[Any, list[Any]]:
    """Each key's values in order (windowed keys as tuples)."""
    out: dict[Any, list[Any]] = {}
    for key, value in records:
        key = tuple(key) if isinstance(key, list) else key
        out.setdefault(key, []).append(value)
    return out


@pytest.mark.timeout(300)
async def test_sessions_final_results_and_table_joins_are_exact_through_a_sigkill(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str],
) -> None:
    prefix = unique("dslops")
    app_id = prefix
    first, second = clicks(range(0, 12)), clicks(range(12, 20))
    closer = [("closer", {"n": -1}, BASE_MS + 10_000_000)]
    with TopologyTestDriver(build(App(app_id, bootstrap_servers="127.0.0.1:1"), prefix),
                            partitions={f"{prefix}-left": 2, f"{prefix}-right": 2,
                                        f"{prefix}-orders": 3}) as driver:
        for key, value, ts in [*first, *second, *closer]:
            driver.pipe(f"{prefix}-clicks", key, value, timestamp_ms=ts)
        for phase in (1, 2):
            for side in ("left", "right"):
                for key, value in rows(side, phase):
                    driver.pipe(f"{prefix}-{side}", key, value)
            for key, value in orders(phase):
                driver.pipe(f"{prefix}-orders", key, value)
        expected_sessions = driver.read_key_values(f"{prefix}-sessions")
        expected_joined = by_key(driver.read_key_values(f"{prefix}-joined"))
        expected_enriched = latest(driver.read_key_values(f"{prefix}-enriched"))
    assert len(expected_sessions) > 4 * USERS   # several sessions per user

    await create_topics(bootstrap, {f"{prefix}-clicks": 1, f"{prefix}-left": 2,
                                    f"{prefix}-right": 2, f"{prefix}-orders": 3,
                                    f"{prefix}-sessions": 1, f"{prefix}-joined": 1,
                                    f"{prefix}-enriched": 1})
    await produce(bootstrap, f"{prefix}-clicks", first)
    for side in ("left", "right"):
        await produce(bootstrap, f"{prefix}-{side}", rows(side, 1))
    await produce(bootstrap, f"{prefix}-orders", orders(1))
    state_dir = tmp_path / "state"
    worker = spawn(prefix, app_id, bootstrap, state_dir)
    try:
        async def processing() -> bool:
            status = (await read_status(bootstrap, app_id)).get("worker-thread-0", {})
            return status.get("pid") == worker.pid and status.get("processed", 0) > 500

        await wait_until(processing, timeout_s=120, message="the worker to process records")
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        await produce(bootstrap, f"{prefix}-clicks", [*second, *closer])
        for side in ("left", "right"):
            await produce(bootstrap, f"{prefix}-{side}", rows(side, 2))
        await produce(bootstrap, f"{prefix}-orders", orders(2))
        worker = spawn(prefix, app_id, bootstrap, state_dir)

        async def sessions_done() -> bool:
            got = await read_committed(bootstrap, f"{prefix}-sessions", 1)
            return len(got) >= len(expected_sessions)

        await wait_until(sessions_done, timeout_s=180, message="the final sessions")

        async def joined_done() -> bool:
            got = by_key(await read_committed(bootstrap, f"{prefix}-joined", 1))
            return got == expected_joined

        await wait_until(joined_done, timeout_s=60, message="the joined table's updates")

        # Answers of the two sides interleave by partition: the final rows must agree.
        async def enriched_done() -> bool:
            got = latest(await read_committed(bootstrap, f"{prefix}-enriched", 1))
            return got == expected_enriched

        await wait_until(enriched_done, timeout_s=60, message="the foreign-key join's rows")
        sessions = await read_committed(bootstrap, f"{prefix}-sessions", 1)
        assert [(tuple(k), v) for k, v in sessions] == [
            (tuple(k), v) for k, v in expected_sessions]
    finally:
        if worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


async def test_a_global_table_is_restored_from_its_topic_and_followed_while_running(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str],
) -> None:
    prefix = unique("global")
    products, orders, out = f"{prefix}-products", f"{prefix}-orders", f"{prefix}-out"
    await create_topics(bootstrap, {products: 2, orders: 1, out: 1})
    await produce(bootstrap, products, [(f"s{i}", f"product-{i}") for i in range(50)])
    app = make_app(prefix, bootstrap, tmp_path)
    table = app.global_table(products, store="products")
    app.stream(orders).join(table, lambda _id, o: o["sku"],
                            lambda o, p: f"{o['n']}x{p}").to(out)
    async with running(app):
        await produce(bootstrap, orders, [(1, {"sku": "s7", "n": 2}),
                                          (2, {"sku": "s99", "n": 1})])

        async def joined(expected: list[tuple[Any, Any]]) -> bool:
            return await read_all(bootstrap, out, 1) == expected

        await wait_until(lambda: joined([(1, "2xproduct-7")]), timeout_s=90,
                         message="the order joined with the restored table")
        await produce(bootstrap, products, [("s99", "product-99")])
        await wait_until(lambda: table.opened is not None
                         and table.get("s99") == "product-99", timeout_s=30,
                         message="the new product in the global table")
        # Queried as any store, once committed (every second): this process holds it all.
        await wait_until(lambda: app.store("products").get("s99") == "product-99",
                         timeout_s=30, message="the global table's store answering a query")
        await produce(bootstrap, orders, [(3, {"sku": "s99", "n": 4})])
        await wait_until(lambda: joined([(1, "2xproduct-7"), (3, "4xproduct-99")]),
                         timeout_s=30, message="the order joined with the new product")
