"""The members a crashed earlier run left in the group: which ones a restart removes (never the
static members it takes over), when (only from a formed group under the leader-wedge quirk),
how the member files tell a dead run from a live one, and, against the broker, a worker
killed and restarted on its state directory that removes its dead member at once instead of
waiting for the member's session to time out."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka.client import AIOKafkaClient

from streams.group.predecessors import (
    MEMBERS_DIRECTORY,
    MemberFiles,
    MemberRecord,
    Step,
    eviction_step,
    possible_leaders,
    stale_members,
)
from streams.group.status_topic import read_status
from streams.kafka.membership import describe_group
from tests.broker.streams.harness import ROOT, Launched, counting_topics, spawn_worker
from tests.conftest import wait_until
from tests.unit.streams.fakes import SOURCE, assign, rig

APP = "app"


def test_a_restart_removes_its_dead_runs_members_but_not_the_static_members_it_takes_over(
) -> None:
    records = [MemberRecord("m-dyn", None, 10), MemberRecord("a-thread-0-x", "a-thread-0", 10),
               MemberRecord("old-thread-1-y", "old-thread-1", 10),
               MemberRecord("", None, 11), MemberRecord("m-dyn", None, 10)]
    assert stale_members(records, {"a-thread-0", "a-thread-1"}) == [
        ("m-dyn", None), ("old-thread-1-y", "old-thread-1")]


def test_members_are_removed_only_while_listed_and_a_leader_only_from_a_formed_group(
) -> None:
    stale = [("m1", None), ("m2", "s-thread-0")]
    assert eviction_step("Stable", ["m9"], stale, True, 0, 10) == (Step.DONE, [])
    assert eviction_step("Stable", ["m1", "m9"], stale, True, 0, 10, {"m1"}) == (
        Step.EVICT, [("m1", None)])
    # Under the leader-wedge quirk, mid-round, a member that may have led waits ...
    assert eviction_step("PreparingRebalance", ["m1", "m2"], stale, True, 2, 10, {"m2"}) == (
        Step.WAIT, stale)
    # ... up to the session timeout, when the broker has expired it anyway.
    assert eviction_step("PreparingRebalance", ["m1"], stale, True, 10, 10, {"m1"}) == (
        Step.DONE, [])
    # Followers go at once, even mid-round: the round waits for them otherwise.
    assert eviction_step("PreparingRebalance", ["m1", "m2"], stale, True, 0, 10) == (
        Step.EVICT, stale)
    # A broker without the quirk: at once.
    assert eviction_step("CompletingRebalance", ["m2"], stale, False, 0, 10, {"m2"}) == (
        Step.EVICT, [("m2", "s-thread-0")])


def test_a_member_may_have_led_if_its_last_status_says_so_or_it_left_none() -> None:
    stale = [("led", None), ("followed", None), ("silent", None)]
    statuses = [{"member_id": "led", "leader": True}, {"member_id": "followed", "leader": False},
                {"member_id": "other", "leader": True}, {"leader": True}]
    assert possible_leaders(stale, statuses) == {"led", "silent"}


def _run(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE)


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
    # A process started meanwhile on the same directory finds a live holder: nothing.
    probe = _run(f"""
        from streams.group.predecessors import MemberFiles
        files = MemberFiles.claim({str(tmp_path)!r}, {APP!r}, 1)
        print(len(files.predecessors))
    """)
    out, _ = probe.communicate(timeout=30)
    assert out.decode().strip() == "0"
    # Stopped cleanly: nothing left to remove.
    files.clear(0)
    files.release()
    assert MemberFiles.claim(tmp_path, APP, 1).predecessors == []


def test_an_unreadable_member_file_is_skipped(tmp_path: Path) -> None:
    directory = tmp_path / APP / MEMBERS_DIRECTORY
    directory.mkdir(parents=True)
    (directory / "thread-0.json").write_text("{not json")
    (directory / "thread-1.json").write_text(json.dumps({"member_id": 7}))
    (directory / "thread-2.json").write_text(
        json.dumps({"member_id": "m", "static_id": 3, "pid": 1}))
    (directory / "thread-3.json").write_text("[1, 2]")
    files = MemberFiles.claim(tmp_path, APP, 4)
    assert files.predecessors == []
    files.release()


def test_a_dead_run_under_this_very_pid_is_still_a_predecessor(tmp_path: Path) -> None:
    # A restarted container often runs its process under the same pid: the lock, not the
    # pid, tells a dead run.
    directory = tmp_path / APP / MEMBERS_DIRECTORY
    directory.mkdir(parents=True)
    (directory / "thread-0.json").write_text(
        json.dumps({"member_id": "m-0", "static_id": None, "pid": os.getpid()}))
    files = MemberFiles.claim(tmp_path, APP, 1)
    assert files.predecessors == [MemberRecord("m-0", None, os.getpid())]
    files.release()


@pytest.mark.asyncio
async def test_a_thread_records_its_member_id_once_assigned_and_clears_it_on_a_clean_stop(
    tmp_path: Path,
) -> None:
    files = MemberFiles.claim(tmp_path, "unit", 1)
    r = rig(tmp_path, member_files=files)
    path = tmp_path / "unit" / MEMBERS_DIRECTORY / "thread-0.json"
    run = asyncio.create_task(r.thread.run([SOURCE]))
    await assign(r, ("0_0",))
    assert json.loads(path.read_text()) == {"member_id": r.consumer.member_id,
                                            "static_id": None, "pid": os.getpid()}
    r.thread.stop()
    await asyncio.wait_for(run, 10)
    assert path.read_text() == ""
    files.release()


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
