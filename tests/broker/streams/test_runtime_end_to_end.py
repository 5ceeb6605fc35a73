"""The runtime end to end on the real broker: exact results across a restart, two workers
sharing tasks and one of them dying, standby copies used on failover, bad input going to the
dead-letter topic (or stopping the app), a duplicate group instance id failing fast, and a
cancelled run that leaves nothing running."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from streams.runtime.thread import FatalThreadError
from tests.broker.streams.harness import (
    Launched,
    counting_app,
    create_topics,
    latest,
    make_app,
    produce,
    read_all,
    running,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


def keyed(n: int, keys: int, start: int = 0) -> list[tuple[str, int]]:
    return [(f"k{i % keys}", i) for i in range(start, start + n)]


def expected_counts(total: int, keys: int) -> dict[str, int]:
    return {f"k{k}": len(range(k, total, keys)) for k in range(keys)}


async def test_restart_gives_exact_results_and_replays_only_the_tail(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    app_id = unique("restart")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 2, sink: 1})
    await produce(bootstrap, source, keyed(600, 7))

    first = counting_app(app_id, bootstrap, tmp_path, source, sink)
    async with running(first):
        async def first_done() -> bool:
            return latest(await read_all(bootstrap, sink, 1)) == expected_counts(600, 7)

        await wait_until(first_done, timeout_s=90, message="the first run's counts")

    await produce(bootstrap, source, keyed(400, 7, start=600))
    second = counting_app(app_id, bootstrap, tmp_path, source, sink)
    async with running(second):
        async def second_done() -> bool:
            return latest(await read_all(bootstrap, sink, 1)) == expected_counts(1000, 7)

        await wait_until(second_done, timeout_s=90, message="counts after the restart")
        restored = sum(t.state_updater.restorer.stats.records for t in second.threads)
    # Everything was checkpointed at the clean stop: nothing to replay from the changelog.
    assert restored == 0
    final = latest(await read_all(bootstrap, sink, 1))
    assert final == expected_counts(1000, 7)


async def test_two_workers_share_tasks_and_a_standby_takes_over_when_one_dies(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], launched: Launched
) -> None:
    app_id = unique("failover")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 4, sink: 1})
    await produce(bootstrap, source, keyed(2000, 13))

    here = counting_app(app_id, bootstrap, tmp_path / "here", source, sink, num_standbys=1)
    worker = launched.worker(app_id, bootstrap, tmp_path / "there", source, sink,
                             num_standbys=1)
    async with running(here):
        def shared() -> bool:
            thread = here.threads[0] if here.threads else None
            return bool(thread and 0 < len(thread.tasks) < 4 and thread.standbys)

        await wait_until(shared, timeout_s=120, message="the two workers to share tasks")

        async def counted() -> bool:
            return latest(await read_all(bootstrap, sink, 1)) == expected_counts(2000, 13)

        await wait_until(counted, timeout_s=90, message="counts of the first batch")
        thread = here.threads[0]
        await wait_until(
            lambda: thread.standbys and all(lag == 0 for lag in thread.standbys.values()),
            timeout_s=60, message="the standby copies to catch up",
        )
        standby_tasks = set(thread.standbys)

        worker.send_signal(signal.SIGKILL)  # dies: no commit, no leave
        worker.wait()
        await produce(bootstrap, source, keyed(1000, 13, start=2000))
        await wait_until(lambda: len(thread.tasks) == 4, timeout_s=120,
                         message="the survivor to take every task")

        async def all_counted() -> bool:
            return latest(await read_all(bootstrap, sink, 1)) == expected_counts(3000, 13)

        await wait_until(all_counted, timeout_s=90, message="exact counts after failover")
        # The tasks it held standbys for restored from its own copies: no full replay.
        assert standby_tasks <= set(thread.tasks)
        assert thread.state_updater.restorer.stats.records < 300
        # Standby copies follow the changelog in bulk-load mode; running tasks, the
        # promoted ones included, read their stores with the default memtable.
        assert not any(store.bulk_loading for task in thread.tasks.values()
                       for store in task.stores.values())


async def test_bad_records_go_to_the_dead_letter_topic(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    app_id = unique("dlq")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 1, sink: 1})
    app = make_app(app_id, bootstrap, tmp_path)
    app.stream(source).map_values(lambda v: 10 // v).to(sink)

    await produce(bootstrap, source, [(b"\x91\x01", b"\x05")], raw=True)  # ok: 10 // 5
    await produce(bootstrap, source, [(b"\xa1k", b"\xc1not msgpack")], raw=True)
    await produce(bootstrap, source, [("z", 0)])  # ZeroDivisionError in the processor
    await produce(bootstrap, source, [("y", 2)])
    async with running(app):
        async def outputs() -> bool:
            return len(await read_all(bootstrap, sink, 1)) == 2

        await wait_until(outputs, timeout_s=90, message="the good records' outputs")
        await wait_until(lambda: app.threads[0].collector.dead_lettered == 2, timeout_s=30,
                         message="two dead letters")
    assert [v for _, v in await read_all(bootstrap, sink, 1)] == [2, 5]
    letters = await read_all(bootstrap, f"{app_id}-dead-letters", 1, raw=True)
    assert [(k, v) for k, v, _ in letters] == [(b"\xa1k", b"\xc1not msgpack"),
                                               (b"\xa1z", b"\x00")]
    first, second = (h for _, _, h in letters)
    stage = {k if isinstance(k, str) else k.decode(): v for k, v in first.items()}
    assert stage["relay.stage"] == b"deserialize" and stage["relay.offset"] == b"1"
    assert stage["relay.topic"] == source.encode()
    other = {k if isinstance(k, str) else k.decode(): v for k, v in second.items()}
    assert other["relay.stage"] == b"process" and b"ZeroDivisionError" in other["relay.error"]


async def test_on_error_stop_stops_the_app_without_committing_the_record(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    app_id = unique("stop")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 1, sink: 1})
    await produce(bootstrap, source, [("a", 1), ("b", 0), ("c", 3)])
    app = make_app(app_id, bootstrap, tmp_path, on_error="stop")
    app.stream(source).map_values(lambda v: 10 // v).to(sink)
    with pytest.raises(FatalThreadError, match=r"process failed for .*\[0\]@1"):
        await asyncio.wait_for(app.run_async(), 90)
    # A fixed app resumes at the bad record: it was not skipped.
    fixed = make_app(app_id, bootstrap, tmp_path)
    fixed.stream(source).map_values(lambda v: 10 // v if v else None).to(sink)
    async with running(fixed):
        async def resumed() -> bool:
            return len(await read_all(bootstrap, sink, 1)) >= 3

        await wait_until(resumed, timeout_s=90, message="the fixed app's outputs")
    assert [v for _, v in await read_all(bootstrap, sink, 1)] == [10, None, 3]


async def test_a_cancelled_run_stops_its_threads_and_leaves_nothing_running(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    """A run cancelled rather than stopped (a caller's timeout) still stops its threads and
    helpers before it ends: nothing of the app runs on in the event loop (which then could
    not close)."""
    app_id = unique("cancelled")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 4, sink: 1})
    app = counting_app(app_id, bootstrap, tmp_path / "a", source, sink, "node-a")
    run = asyncio.create_task(app.run_async())
    await wait_until(lambda: bool(app.threads) and len(app.threads[0].tasks) == 4,
                     timeout_s=60, message="the app running its tasks")
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert [t.get_coro() for t in left] == []
