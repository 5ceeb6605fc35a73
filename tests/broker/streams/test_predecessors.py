"""A restarted worker's predecessors, with real processes: member files of a dead run and a live
one, and a worker killed and restarted on the broker removing its dead member."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka.client import AIOKafkaClient

from streams.group.predecessors import (
    MEMBERS_DIRECTORY,
    MemberFiles,
    MemberRecord,
)
from streams.group.status_topic import read_status
from streams.kafka.membership import describe_group
from tests.broker.streams.harness import Launched, counting_topics, spawn_worker
from tests.conftest import wait_until
from tests.unit.streams.test_predecessors import APP, _run


def test_member_files_tell_a_dead_run_from_a_live_one(tmp_path: Path) -> None:
    # A run with two threads records its members and dies without a word.
    dead = _run(f"""
        import os, signal
        from streams.group.predecessors import MemberFiles
        files = MemberFiles.claim({str(tmp_path)!r}, {APP!r}, 2)
        files.record(0, "dead-0", None)
        files.record(1, "dead-1", "i-thread-1")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    dead.wait(30)
    # The next run has one thread: it reads both files and removes the second one.
    files = MemberFiles.claim(tmp_path, APP, 1)
    assert files.predecessors == [MemberRecord("dead-0", None, dead.pid),
                                          MemberRecord("dead-1", "i-thread-1", dead.pid)]
    directory = tmp_path / APP / MEMBERS_DIRECTORY
    assert sorted(p.name for p in directory.iterdir()) == ["thread-0.json"]
    files.record(0, "me-0", None)
    assert json.loads((directory / "thread-0.json").read_text())["member_id"] == "me-0"
    # A process started meanwhile on the same directory finds a live holder: refused.
    probe = _run(f"""
        from streams.group.predecessors import MemberFiles, StateDirectoryInUse
        try:
            MemberFiles.claim({str(tmp_path)!r}, {APP!r}, 1)
        except StateDirectoryInUse as exc:
            print(type(exc).__name__, exc)
    """)
    out, _ = probe.communicate(timeout=30)
    assert out.decode().startswith(f"StateDirectoryInUse another live process (pid "
                                   f"{os.getpid()}) runs application {APP!r}")
    # Stopped cleanly: nothing left to remove.
    files.clear(0)
    files.release()
    assert MemberFiles.claim(tmp_path, APP, 1).predecessors == []


@pytest.mark.timeout(180)
async def test_a_worker_killed_and_restarted_removes_its_dead_member_before_the_session_ends(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], launched: Launched,
) -> None:
    app_id = unique("predecessor")
    source, sink, traffic = await counting_topics(bootstrap, app_id)
    launched.traffic_for(traffic)
    # A session long enough that only the restart's removal can end the dead member in time.
    settings = {"session_timeout_ms": 20_000, "heartbeat_interval_ms": 1_000}
    state = tmp_path / "w"
    first = launched.worker(app_id, bootstrap, state, source, sink, **settings)
    traffic.start()

    async def running(pid: int) -> bool:
        status = (await read_status(bootstrap, app_id)).values()
        return any(s.get("pid") == pid and s.get("active") and s.get("processed", 0) > 0
                   for s in status)

    await wait_until(lambda: running(first.pid), timeout_s=90, message="the first run")
    member_file = state / app_id / MEMBERS_DIRECTORY / "thread-0.json"
    dead_member = json.loads(member_file.read_text())["member_id"]
    first.send_signal(signal.SIGKILL)
    first.wait()
    log = tmp_path / "restart.log"
    with log.open("wb") as sink_log:
        second = spawn_worker(app_id, bootstrap, state, source, sink, log=sink_log,
                              log_level="WARNING", **settings)
    launched.workers.append(second)
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        async def removed() -> bool:
            return "removed 1 member(s) a crashed earlier run" in log.read_text()

        await wait_until(removed, timeout_s=60, message="the restart removing its dead member")
        members = {m.member_id for m in (await describe_group(client, app_id)).members}
        assert dead_member not in members
        assert dead_member in log.read_text()
    finally:
        await client.close()
    await wait_until(lambda: running(second.pid), timeout_s=90, message="the restart running")
