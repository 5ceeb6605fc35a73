"""Static membership against the real broker: a member restarted within the session timeout
gets its tasks back with no rebalance of the others and no state movement."""

from __future__ import annotations

import asyncio
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streams.config import ConfigError
from streams.group.status_topic import read_status
from tests.broker.streams.harness import (
    Launched,
    counting_app,
    create_topics,
    latest,
    produce,
    published,
    read_all,
    spawn_app,
    spawn_worker,
    static_group,
)
from tests.conftest import broker_servers, on_tansu, session_broker, wait_until

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def bootstrap(broker_engine: str) -> Iterator[str]:
    """On Tansu, a broker of this module's own: its tests time a static member's rejoin
    against the broker's rounds, and no group another test left behind shares its
    coordinator (Tansu's coordinator serves every group in turn). Apache Kafka's
    coordinator runs each group on its own, so there the run's broker serves."""
    if broker_engine != "tansu":
        yield session_broker(broker_engine)
        return
    with broker_servers(broker_engine) as servers:
        yield servers


@pytest.mark.tansu
async def test_a_static_restart_moves_nothing(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], launched: Launched
) -> None:
    app_id = unique("static")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 4, sink: 1})
    await produce(bootstrap, source, [(f"k{i % 9}", i) for i in range(900)])

    dirs = {"node-a": tmp_path / "a", "node-b": tmp_path / "b"}
    apps = {name: counting_app(app_id, bootstrap, d, source, sink, name)
            for name, d in dirs.items()}
    for app in apps.values():
        launched.app(app)

    async def counted(total: int) -> bool:
        counts = latest(await read_all(bootstrap, sink, 1))
        return sum(counts.values()) == total and len(counts) == 9

    await wait_until(
        lambda: all(a.threads and len(a.threads[0].tasks) == 2 for a in apps.values()),
        timeout_s=150, message="both static members to run two tasks",
    )
    await wait_until(lambda: counted(900), timeout_s=90, message="first counts")
    # A restart moves nothing in a settled group: not while a round the start-up asked for
    # (a member that missed an assignment, say) is still to come.
    await wait_until(lambda: all(a.threads[0].settled for a in apps.values()), timeout_s=60,
                     message="the group to settle")
    # Restart a follower: a static *leader* that rejoins starts a rebalance by design
    # (KIP-345: the leader must see every member's metadata again).
    name = next(n for n, a in apps.items() if not a.threads[0].assignor.is_leader)
    other = next(a for n, a in apps.items() if n != name)
    tasks_before = sorted(apps[name].threads[0].tasks)
    generation = other.threads[0].status.generation
    rebalances = other.threads[0].status.rebalances
    await launched.stop(apps[name])  # static: no LeaveGroup, the group keeps its place

    await produce(bootstrap, source, [(f"k{i % 9}", i) for i in range(900, 1200)])
    again = apps[name] = counting_app(app_id, bootstrap, dirs[name], source, sink, name)
    launched.app(again)
    await wait_until(lambda: bool(again.threads) and len(again.threads[0].tasks) == 2,
                     timeout_s=60, message=f"{name} to run its tasks again")
    assert sorted(again.threads[0].tasks) == tasks_before
    await wait_until(lambda: counted(1200), timeout_s=60, message="counts after restart")
    # Nothing moved: the other member saw no rebalance; the restarted one replayed no
    # changelog (its checkpoints were current).
    assert other.threads[0].status.generation == generation
    assert other.threads[0].status.rebalances == rebalances
    assert again.threads[0].state_updater.restorer.stats.records == 0


async def test_duplicate_group_instance_id_fails_the_newcomer_fast(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], launched: Launched
) -> None:
    app_id = unique("dup")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 2, sink: 1})
    first = counting_app(app_id, bootstrap, tmp_path / "a", source, sink, "node-a")
    run_first = launched.app(first)
    await wait_until(lambda: bool(first.threads) and len(first.threads[0].tasks) == 2,
                     timeout_s=120, message="the first member to run both tasks")
    await published(bootstrap, app_id, {"node-a-thread-0": 2})
    second = counting_app(app_id, bootstrap, tmp_path / "b", source, sink, "node-a")
    with pytest.raises(ConfigError, match="duplicate group instance id node-a-thread-0"):
        await asyncio.wait_for(second.run_async(), 60)
    assert first.threads[0].tasks and not run_first.done()  # the first one runs on


async def test_the_broker_fences_a_frozen_duplicate_and_it_stops(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], launched: Launched
) -> None:
    """KIP-345: a static member frozen past the duplicate check (its status goes stale) is
    replaced by a newcomer with its instance id; the broker hands the newcomer the member's
    place and fences the old one, which on waking stops with an error saying so, rather
    than running the same tasks as a zombie."""
    if on_tansu(bootstrap):
        pytest.skip("Tansu does not fence a duplicate static member (the status check and the "
                    "leader's refusal stand in for it)")
    app_id = unique("fenced")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 2, sink: 1})
    await produce(bootstrap, source, [(f"k{i % 5}", i) for i in range(50)])
    log_file = tmp_path / "first.log"
    with open(log_file, "wb") as log:
        first = spawn_worker(app_id, bootstrap, tmp_path / "a", source, sink, log=log,
                             log_level="INFO", group_instance_id="node-a",
                             **static_group(bootstrap))
    launched.workers.append(first)
    await published(bootstrap, app_id, {"node-a-thread-0": 2})
    # Frozen with nothing left to count: it has no output a zombie could add to.
    await wait_until(lambda: counted_all(bootstrap, sink, 50), timeout_s=60,
                     message="the first member to count the input")
    first.send_signal(signal.SIGSTOP)
    try:
        second = counting_app(app_id, bootstrap, tmp_path / "b", source, sink, "node-a")
        launched.app(second)
        await wait_until(lambda: bool(second.threads) and len(second.threads[0].tasks) == 2,
                         timeout_s=60, message="the newcomer to take over node-a's tasks")
    finally:
        first.send_signal(signal.SIGCONT)
    code = await asyncio.to_thread(first.wait, 60)
    output = log_file.read_text(errors="replace")
    assert code != 0, output[-3000:]
    assert "the broker fenced static member node-a-thread-0" in output, output[-3000:]
    await produce(bootstrap, source, [(f"k{i % 5}", i) for i in range(50, 60)])
    await wait_until(lambda: counted_all(bootstrap, sink, 60), timeout_s=60,
                     message="the newcomer to count everything")


async def counted_all(bootstrap: str, sink: str, total: int) -> bool:
    return sum(latest(await read_all(bootstrap, sink, 1)).values()) == total


async def test_a_new_static_member_replacing_a_stopped_one_gets_its_work(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], launched: Launched
) -> None:
    """A static member stops (no LeaveGroup) and a new static member, with another id, starts
    at once. Tansu keeps the departed member as the leader of every round the newcomer joins;
    the newcomer removes it once it has been silent for a session timeout, and takes its
    tasks. No member restarts here, so the short session (12 s) that static membership cannot
    otherwise afford on Tansu is safe, and keeps the test short."""
    app_id = unique("replaced")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 2, sink: 1})
    await produce(bootstrap, source, [(f"k{i % 5}", i) for i in range(50)])
    short = {"session_timeout_ms": 12_000, "heartbeat_interval_ms": 1_000}
    first = counting_app(app_id, bootstrap, tmp_path / "a", source, sink, "s1", **short)
    launched.app(first)
    await wait_until(lambda: bool(first.threads) and len(first.threads[0].tasks) == 2,
                     timeout_s=60, message="s1 to run both tasks")
    await launched.stop(first)
    second = counting_app(app_id, bootstrap, tmp_path / "b", source, sink, "s2", **short)
    launched.app(second)
    await produce(bootstrap, source, [(f"k{i % 5}", i) for i in range(50, 60)])
    await wait_until(lambda: bool(second.threads) and len(second.threads[0].tasks) == 2,
                     timeout_s=75, message="s2 to take over s1's tasks")

    async def counted() -> bool:
        return sum(latest(await read_all(bootstrap, sink, 1)).values()) == 60

    await wait_until(counted, timeout_s=30, message="every record counted")



async def test_a_static_restart_without_its_state_hands_its_tasks_to_caught_up_standbys(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], launched: Launched,
) -> None:
    """A static member killed and restarted within its session with its state directory lost
    (a new disk) gets its task back and must restore it from its changelog. Its restore is
    slow, and the other instance holds a caught-up standby of it: the standby runs the task
    while the restarted member learns it back, and it takes the task back once caught up."""
    app_id = unique("lost-state")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 2, sink: 1})
    keys = 12_000
    await produce(bootstrap, source, [(f"k{i}", i) for i in range(keys)])
    settings = {**static_group(bootstrap), "num_standbys": 1, "acceptable_lag": 10}
    dirs = {"node-a": tmp_path / "a", "node-b": tmp_path / "b"}
    workers = {name: launched.worker(app_id, bootstrap, d, source, sink,
                                     group_instance_id=name, **settings)
               for name, d in dirs.items()}

    async def counted(total: int) -> bool:
        return len(latest(await read_all(bootstrap, sink, 1))) == total

    async def status() -> dict[str, dict[str, Any]]:
        return await read_status(bootstrap, app_id)

    def runs(record: dict[str, Any] | None) -> list[str]:
        return sorted((record or {}).get("active", []))

    await wait_until(lambda: counted(keys), timeout_s=120, message="every key counted")

    async def settled() -> bool:
        seen = await status()
        return all(len(runs(seen.get(f"{n}-thread-0"))) == 1 and all(
            lag <= 10 for lag in (seen.get(f"{n}-thread-0") or {}).get("standbys", {}).values())
            and len((seen.get(f"{n}-thread-0") or {}).get("standbys", {})) == 1
            for n in dirs)

    await wait_until(settled, timeout_s=60, message="one task and a caught-up standby each")
    lost = runs((await status())["node-a-thread-0"])
    workers["node-a"].send_signal(signal.SIGKILL)
    workers["node-a"].wait()
    shutil.rmtree(dirs["node-a"])
    launched.workers.append(spawn_app(
        "tests.broker.streams.apps.slow_restore:app",
        {"COUNTING_INPUT": source, "COUNTING_OUTPUT": sink}, app_id, bootstrap,
        dirs["node-a"], group_instance_id="node-a", **settings))

    async def b_runs_it() -> bool:
        return set(lost) <= set(runs((await status()).get("node-b-thread-0")))

    await wait_until(b_runs_it, timeout_s=60,
                     message="node-b's caught-up standby to run node-a's task")
    await produce(bootstrap, source, [(f"k{i}", i) for i in range(keys, keys + 100)])
    await wait_until(lambda: counted(keys + 100), timeout_s=60,
                     message="the new keys counted meanwhile")

    async def a_runs_it_again() -> bool:
        seen = await status()
        return (runs(seen.get("node-a-thread-0")) == lost
                and len(runs(seen.get("node-b-thread-0"))) == 1)

    await wait_until(a_runs_it_again, timeout_s=120,
                     message="node-a to learn its task back and run it again")
    counts = latest(await read_all(bootstrap, sink, 1))
    assert len(counts) == keys + 100 and set(counts.values()) == {1}
