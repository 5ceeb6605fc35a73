"""Static membership against the real broker: a member restarted within the session timeout
gets its tasks back with no rebalance of the others and no state movement."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.streams.harness import create_topics, latest, make_app, produce, read_all, running

pytestmark = pytest.mark.broker
STATIC = {"session_timeout_ms": 30_000, "heartbeat_interval_ms": 2_000}


def counting(app_id: str, bootstrap: str, state_dir: Path, instance: str, source: str,
             sink: str):
    app = make_app(app_id, bootstrap, state_dir, group_instance_id=instance, **STATIC)
    app.stream(source).group_by_key().count(store="counts").to_stream().to(sink)
    return app


async def test_a_static_restart_moves_nothing(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    app_id = unique("static")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 4, sink: 1})
    await produce(bootstrap, source, [(f"k{i % 9}", i) for i in range(900)])

    other = counting(app_id, bootstrap, tmp_path / "b", "node-b", source, sink)
    first = counting(app_id, bootstrap, tmp_path / "a", "node-a", source, sink)
    async with running(other):
        async with running(first):
            await wait_until(
                lambda: bool(first.threads and other.threads)
                and len(first.threads[0].tasks) == 2 and len(other.threads[0].tasks) == 2,
                timeout_s=150, message="both static members to run two tasks",
            )

            async def counted(total: int) -> bool:
                counts = latest(await read_all(bootstrap, sink, 1))
                return sum(counts.values()) == total and len(counts) == 9

            await wait_until(lambda: counted(900), timeout_s=90, message="first counts")
            tasks_before = sorted(first.threads[0].tasks)
            generation = other.threads[0].status.generation
            rebalances = other.threads[0].status.rebalances
        # node-a stopped without leaving the group; it comes back within the session timeout.
        await produce(bootstrap, source, [(f"k{i % 9}", i) for i in range(900, 1200)])
        again = counting(app_id, bootstrap, tmp_path / "a", "node-a", source, sink)
        async with running(again):
            await wait_until(lambda: bool(again.threads) and len(again.threads[0].tasks) == 2,
                             timeout_s=60, message="node-a to run its tasks again")
            assert sorted(again.threads[0].tasks) == tasks_before
            await wait_until(lambda: counted(1200), timeout_s=60, message="counts after restart")
            # Nothing moved: node-b saw no rebalance, node-a replayed no changelog.
            assert other.threads[0].status.generation == generation
            assert other.threads[0].status.rebalances == rebalances
            assert again.threads[0].restorer.stats.records == 0
