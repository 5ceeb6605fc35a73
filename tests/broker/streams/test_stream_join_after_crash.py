"""A stream-stream left join through a crash: a worker killed (SIGKILL, exactly-once) once
it has joined the first records, and restarted on the same state directory, gives what an
uninterrupted run gives (the topology test driver's, on the same input): the join's times
come back with its state, so records that arrive late after the restart are still late.
Real broker."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streams.app import App
from streams.testing import TopologyTestDriver
from tests.broker.streams.apps.stream_join import build
from tests.broker.streams.harness import (
    BASE_MS,
    STATIC,
    create_topics,
    end_worker,
    produce,
    read_committed,
    spawn_app,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.broker

KEYS = 200
PARTITIONS = 2


def phase_one(side: str) -> list[tuple[str, str, int]]:
    """Every key clicked and viewed around 200 s past the base (recent: records near 1970 would
    leave the topics at the broker's next time-retention check): within one window, so each
    pair joins in any order of the two topics."""
    return [(f"k{i}", f"{side}{i}", BASE_MS + 200_000 + i % 10 + (side == "view"))
            for i in range(KEYS)]


def phase_two(side: str) -> list[tuple[str, str, int]]:
    """Records of new keys 200 s behind the join's time: late. A click comes out at once
    joined with None; its view is dropped, never joined with it."""
    return [(f"a{i}", f"{side}{i}", BASE_MS + i % 10 + 5 * (side == "view"))
            for i in range(KEYS)]


def by_key(records: list[tuple[Any, Any]]) -> dict[Any, list[Any]]:
    """Each key's values in order (tasks interleave on the output's one partition)."""
    out: dict[Any, list[Any]] = {}
    for key, value in records:
        out.setdefault(key, []).append(value)
    return out


def spawn(prefix: str, app_id: str, bootstrap: str, state_dir: Path) -> subprocess.Popen[bytes]:
    return spawn_app("tests.broker.streams.apps.stream_join:app", {"JOIN_PREFIX": prefix},
                     app_id, bootstrap, state_dir, **STATIC,
                     processing_guarantee="exactly_once", commit_interval_ms=300,
                     group_instance_id="worker")


@pytest.mark.timeout(300)
async def test_a_stream_stream_left_join_gives_the_uninterrupted_output_through_a_sigkill(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str],
) -> None:
    prefix = app_id = unique("sjoin")
    clicks, views, joined = f"{prefix}-clicks", f"{prefix}-views", f"{prefix}-joined"
    with TopologyTestDriver(build(App(app_id, bootstrap_servers="127.0.0.1:1"), prefix),
                            partitions={clicks: PARTITIONS, views: PARTITIONS}) as driver:
        for phase in (phase_one, phase_two):
            for topic, side in ((clicks, "click"), (views, "view")):
                for key, value, ts in phase(side):
                    driver.pipe(topic, key, value, timestamp_ms=ts)
        expected = by_key(driver.read_key_values(joined))
    # Worked out by hand: each first-phase pair joined; each late click alone, at once.
    assert expected == {**{f"k{i}": [f"click{i}+view{i}"] for i in range(KEYS)},
                        **{f"a{i}": [f"click{i}+None"] for i in range(KEYS)}}

    await create_topics(bootstrap, {clicks: PARTITIONS, views: PARTITIONS, joined: 1})
    for topic, side in ((clicks, "click"), (views, "view")):
        await produce(bootstrap, topic, phase_one(side))
    state_dir = tmp_path / "state"
    worker = spawn(prefix, app_id, bootstrap, state_dir)
    try:
        async def first_pairs() -> bool:
            return len(await read_committed(bootstrap, joined, 1)) >= KEYS

        # Committed with the state (exactly-once): the join's times are in its changelogs.
        await wait_until(first_pairs, timeout_s=120, message="the first phase's pairs")
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        for topic, side in ((clicks, "click"), (views, "view")):
            await produce(bootstrap, topic, phase_two(side))
        worker = spawn(prefix, app_id, bootstrap, state_dir)

        async def all_out() -> bool:
            return len(await read_committed(bootstrap, joined, 1)) >= 2 * KEYS

        await wait_until(all_out, timeout_s=120, message="the late clicks' results")
        got = by_key(await read_committed(bootstrap, joined, 1))
        assert got == expected
    finally:
        end_worker(worker)
