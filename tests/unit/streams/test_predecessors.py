"""The members a crashed earlier run left in the group: which ones a restart removes (never the
static members it takes over), when (only from a formed group under the leader-wedge quirk),
how the member files tell a dead run from a live one, and, against the broker, a worker
killed and restarted on its state directory that removes its dead member at once instead of
waiting for the member's session to time out."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from streams.group.predecessors import (
    MEMBERS_DIRECTORY,
    MemberFiles,
    MemberRecord,
    StateDirectoryInUse,
    Step,
    eviction_step,
    possible_leaders,
    stale_members,
)
from tests.broker.streams.harness import ROOT
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


def test_a_second_live_run_of_the_app_on_one_state_directory_is_refused(
        tmp_path: Path) -> None:
    first = MemberFiles.claim(tmp_path, APP, 2)
    first.record(0, "m-0", None)
    # flock locks belong to an open file, so a second claim in this process stands for a
    # second process.
    with pytest.raises(StateDirectoryInUse, match=(
            rf"another live process \(pid {os.getpid()}\) runs application '{APP}' from "
            rf"state_dir '{tmp_path}': give each process on one host its own state_dir")):
        MemberFiles.claim(tmp_path, APP, 1)
    # Another app beside it is not in the way, and the refused claim kept nothing.
    MemberFiles.claim(tmp_path, "another-app", 1).release()
    first.release()
    again = MemberFiles.claim(tmp_path, APP, 3)
    assert again.predecessors == [MemberRecord("m-0", None, os.getpid())]
    again.release()


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
