"""Cooperative rebalancing against the real broker: while a member joins, the tasks that stay
where they are keep processing, and the ones that move change owner without a record being
lost or counted twice. The eager (stop-the-world) mode is the contrast: nothing is processed
while the group rebalances."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest

from streams.kafka.cooperative import CooperativeGroupCoordinator
from tests.broker.streams.harness import create_topics, latest, make_app, produce, read_all, running
from tests.conftest import wait_until

pytestmark = pytest.mark.broker

#: How long each member lingers in its join preparation here: a round on Apache Kafka is
#: over in milliseconds, too soon to tell whether the kept tasks went on processing in it.
JOIN_PREPARATION_S = 1.0


def counting(app_id: str, bootstrap: str, state_dir: Path, source: str, sink: str,
             protocol: str):
    app = make_app(app_id, bootstrap, state_dir, rebalance_protocol=protocol)
    app.stream(source).group_by_key().count(store="counts").to_stream().to(sink)
    return app


@pytest.mark.parametrize("protocol", ["cooperative", "eager"])
@pytest.mark.tansu
async def test_unaffected_tasks_process_during_a_rebalance(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], protocol: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prepare = CooperativeGroupCoordinator._on_join_prepare

    async def lingering(self: CooperativeGroupCoordinator, previous: object) -> None:
        # After the preparation: an eager member has given everything up by then, a
        # cooperative one keeps its tasks and goes on processing them.
        await prepare(self, previous)
        await asyncio.sleep(JOIN_PREPARATION_S)

    monkeypatch.setattr(CooperativeGroupCoordinator, "_on_join_prepare", lingering)
    app_id = unique(protocol)
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 4, sink: 1})
    produced: dict[str, int] = {}
    stop = asyncio.Event()

    async def keep_producing() -> None:
        n = 0
        while not stop.is_set():
            batch = [(f"k{(n + i) % 11}", n + i) for i in range(20)]
            for key, _ in batch:
                produced[key] = produced.get(key, 0) + 1
            await produce(bootstrap, source, batch)
            n += 20
            await asyncio.sleep(0.05)

    first = counting(app_id, bootstrap, tmp_path / "first", source, sink, protocol)
    second = counting(app_id, bootstrap, tmp_path / "second", source, sink, protocol)
    producer = asyncio.create_task(keep_producing())
    try:
        async with running(first):
            await wait_until(lambda: bool(first.threads) and len(first.threads[0].tasks) == 4,
                             timeout_s=90, message="the first member to run every task")
            thread = first.threads[0]
            during_before = thread.records_during_rebalance
            async with running(second):
                await wait_until(
                    lambda: bool(second.threads) and len(second.threads[0].tasks) == 2
                    and len(thread.tasks) == 2,
                    timeout_s=120, message="the two members to share the tasks",
                )
                stop.set()
                await producer

                async def exact() -> bool:
                    return latest(await read_all(bootstrap, sink, 1)) == produced

                await wait_until(exact, timeout_s=90, message="exact counts")
            during = thread.records_during_rebalance - during_before
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await producer
    if protocol == "cooperative":
        assert during > 0, "kept tasks should have processed records during the rebalance"
    else:
        assert during == 0
