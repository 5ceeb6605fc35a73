"""What a stream thread records and publishes about itself, with fake clients (no broker):
the status fields the web view reads, the Prometheus figures recorded at the runtime's hooks,
and the leader's count of moved tasks by cause."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiokafka.structs import ConsumerRecord, TopicPartition

from assignor import LeaderMemory, Member, MemberAssignment
from streams.group.control import LeavingMark, LeavingState
from streams.group.partition_assignor import hold_deadlines, moves_by_cause
from streams.runtime import state_updater
from tests.conftest import wait_until
from tests.unit.streams.fakes import SOURCE, assign, record, rig

LABEL = "unit-instance-thread-0"


def value(r, name: str, **labels: str) -> float | None:  # type: ignore[no-untyped-def]
    return r.thread.metrics.registry.get_sample_value(name, {"thread": LABEL, **labels})


@pytest.mark.asyncio
async def test_the_status_record_carries_what_the_web_view_reads(tmp_path: Path) -> None:
    leaving = LeavingState()
    r = rig(tmp_path, scale_down_timeout_ms=5_000, leaving=leaving)
    try:
        # 0_0 and 0_1 restore; 0_1's changelog end is not known yet; learners follow 0_1.
        r.restorer.lags = {"0": 42, "1": None}
        await assign(r, ("0_0", "0_1"), standbys=("0_2",), being_learned=("0_1",),
                     restore=False)
        status = r.thread.reporter.status_record()
        assert status["stateful_tasks"] == ["0_0", "0_1", "0_2", "0_3"]
        assert status["restoring"] == ["0_0", "0_1"]
        assert status["restoring_lag"] == {"0_0": 42}
        assert status["being_learned"] == ["0_1"]
        assert status["leaving_deadline_ms"] is None

        leaving.mark = LeavingMark(1_000, None)
        # The app's timeout, then the mark's own.
        assert r.thread.reporter.status_record()["leaving_deadline_ms"] == 6_000
        leaving.mark = LeavingMark(1_000, 200)
        assert r.thread.reporter.status_record()["leaving_deadline_ms"] == 1_200

        r.restorer.lags = {}  # both restored
        await r.thread.state_updater.restore_pending()
        await assign(r, ("0_0", "0_1"))
        status = r.thread.reporter.status_record()
        assert status["restoring_lag"] == {} and status["being_learned"] == []
    finally:
        r.thread.task_manager.close_all()


@pytest.mark.asyncio
async def test_the_status_gives_the_shortest_of_the_last_rounds(tmp_path: Path) -> None:
    """What a newcomer plans its warm-up's end on (streams.group.warm_up): a round that waited for
    a crashed member's session says nothing of how long a join takes, nor does the thread's
    first, which waited for the group to form."""
    r = rig(tmp_path)
    try:
        assert r.thread.reporter.status_record()["round_s"] is None  # no round yet
        r.consumer.round_started = time.monotonic() - 2.0  # the group forming
        await assign(r, ("0_0",))
        record = r.thread.reporter.status_record()
        assert record["round_s"] is None and record["last_round_s"] is None
        # Each round's figure is its time from join to applied, at least what it was given;
        # the status gives the shortest of the last few, whatever the machine's load added.
        lasts: list[float] = []
        for took in (12.0, 3.0, 9.0):
            r.consumer.round_started = time.monotonic() - took
            await assign(r, ("0_0",))
            record = r.thread.reporter.status_record()
            assert record["last_round_s"] >= took
            lasts.append(record["last_round_s"])
            assert record["round_s"] == min(lasts)
        assert record["round_s"] == lasts[1]  # the 3 s round, not the later 9 s one
        for _ in range(5):  # only the last few count
            r.consumer.round_started = time.monotonic() - 6.0
            await assign(r, ("0_0",))
            lasts.append(r.thread.reporter.status_record()["last_round_s"])
        assert r.thread.reporter.status_record()["round_s"] == min(lasts[-5:]) >= 6.0
    finally:
        r.thread.task_manager.close_all()


@pytest.mark.asyncio
async def test_the_thread_records_its_figures_at_the_runtime_hooks(tmp_path: Path) -> None:
    r = rig(tmp_path, commit_interval_ms=60_000)
    run = asyncio.create_task(r.thread.run([SOURCE]))
    try:
        await assign(r, ("0_0", "0_1"), learners=("0_3",))
        assert value(r, "relay_rebalances_total") == 1
        assert value(r, "relay_assigned_tasks", role="active") == 2
        assert value(r, "relay_assigned_tasks", role="learner") == 1
        assert value(r, "relay_assigned_tasks", role="standby") == 0
        assert value(r, "relay_restorations_total", task="0_0") == 1

        tp0, tp1 = TopicPartition(SOURCE, 0), TopicPartition(SOURCE, 1)
        bad = ConsumerRecord(SOURCE, 1, 2, 1_000, 0, b"\xc1", b"\xc1", None, 1, 1, [])
        r.consumer.feed({tp0: [record(0, i, "a") for i in range(5)],
                         tp1: [record(1, 0, "b"), record(1, 1, "c"), bad]})
        await wait_until(lambda: value(r, "relay_records_processed_total", task="0_1") == 2,
                         timeout_s=5, message="the batch processed")
        assert value(r, "relay_records_processed_total", task="0_0") == 5
        assert value(r, "relay_dead_letter_records_total", task="0_1") == 1
        assert value(r, "relay_process_loop_seconds_count") >= 1

        r.consumer.highwaters = {tp0: 9, tp1: 3}
        await r.thread.committer.commit()
        assert value(r, "relay_commits_total") == 1
        assert value(r, "relay_commit_seconds_count") == 1
        assert value(r, "relay_task_input_lag_records", task="0_0") == 4  # 9 - 5
        assert value(r, "relay_task_input_lag_records", task="0_1") == 0  # 3 - 3

        # 0_1 goes: its lag series goes with it.
        await assign(r, ("0_0",))
        assert value(r, "relay_rebalances_total") == 2
        assert value(r, "relay_assigned_tasks", role="active") == 1
        assert value(r, "relay_task_input_lag_records", task="0_1") is None
    finally:
        r.thread.stop()
        await asyncio.wait_for(run, 15)


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
@pytest.mark.asyncio
async def test_only_a_commit_of_some_input_is_counted(tmp_path: Path, guarantee: str) -> None:
    """The process loop commits on its interval from its start, while its tasks restore
    and before they read anything: counted, such a commit told a scrape that records were
    committed before any was, with no input lag to go with it."""
    r = rig(tmp_path, processing_guarantee=guarantee)
    try:
        await r.thread.committer.commit()
        await assign(r, ("0_0",), restore=False)  # restoring: not running yet
        await r.thread.committer.commit()
        await r.thread.state_updater.restore_pending()
        assert sorted(r.thread.tasks) == ["0_0"]
        await r.thread.committer.commit()  # running, nothing read yet
        assert value(r, "relay_commits_total") is None
        assert value(r, "relay_commit_seconds_count") is None

        tp0 = TopicPartition(SOURCE, 0)
        await r.thread.process({tp0: [record(0, i, "a") for i in range(3)]})
        r.consumer.highwaters = {tp0: 3}
        await r.thread.committer.commit()
        assert value(r, "relay_commits_total") == 1
        assert value(r, "relay_commit_seconds_count") == 1
        if guarantee == "at_least_once":  # the transactional committer records no lag
            assert value(r, "relay_task_input_lag_records", task="0_0") == 0
    finally:
        r.thread.task_manager.close_all()


@pytest.mark.asyncio
async def test_copies_record_their_lag_and_their_catching_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The copies' figures are sampled every second of the state updater's clock: here it moves
    # 10 ms each time it is read, so a second passes without waiting for one.
    ticks = itertools.count()
    monkeypatch.setattr(state_updater, "time",
                        SimpleNamespace(monotonic=lambda: next(ticks) * 0.01, time=time.time))
    r = rig(tmp_path)
    run = asyncio.create_task(r.thread.run([SOURCE]))
    try:
        r.follower.lags = {"3": 120, "2": 0}
        await assign(r, ("0_0",), learners=("0_3",), standbys=("0_2",))
        await wait_until(
            lambda: value(r, "relay_copy_changelog_lag_records", task="0_3",
                          role="learner") == 120, timeout_s=10, message="the learner's lag")
        assert value(r, "relay_copy_changelog_lag_records", task="0_2", role="standby") == 0
        # The standby was at its end at once; the learner is still catching up.
        assert value(r, "relay_restorations_total", task="0_2") == 1
        assert value(r, "relay_restorations_total", task="0_3") is None
        await wait_until(
            lambda: value(r, "relay_copy_restore_rate_records_per_second", task="0_3",
                          role="learner") is not None, timeout_s=10, message="a rate")

        r.follower.lags["3"] = 0
        await wait_until(lambda: value(r, "relay_restorations_total", task="0_3") == 1,
                         timeout_s=10, message="the learner's catching up recorded")
        # Promoted: the copy's series go.
        await assign(r, ("0_0", "0_3"))
        assert value(r, "relay_copy_changelog_lag_records", task="0_3", role="learner") is None
        assert value(r, "relay_assigned_tasks", role="learner") == 0
    finally:
        r.thread.stop()
        await asyncio.wait_for(run, 15)


def member(member_id: str, instance: str, active: tuple[str, ...] = (),
           learners: dict[str, int] | None = None, leaving: bool = False) -> Member:
    return Member(member_id, instance, 0, frozenset(active), {}, learners or {}, leaving)


def test_the_leader_counts_moved_tasks_by_cause() -> None:
    members = [
        member("m-a", "a", ("0_0",), learners={"0_1": 5, "0_2": 0, "0_3": 50_000}),
        member("m-b", "b", ("0_1", "0_2", "0_5"), leaving=True),
        member("m-c", "c", ("0_4",), learners={"0_6": 0}),
        member("m-d", "d", ("0_6",)),
    ]
    previous = {"0_0": ("a", 0), "0_1": ("b", 0), "0_2": ("b", 0), "0_3": ("gone", 0),
                "0_4": ("c", 0), "0_5": ("b", 0), "0_6": ("d", 0), "0_7": ("d", 0)}
    assignments = {
        "m-a": MemberAssignment(active=("0_0", "0_1", "0_3")),
        "m-b": MemberAssignment(active=()),  # 0_2 and 0_5: revoked, placed next round
        "m-c": MemberAssignment(active=("0_4", "0_6", "0_7")),
        "m-d": MemberAssignment(active=()),
    }
    assert moves_by_cause(previous, members, assignments, acceptable_lag=10) == {
        "leaving": 1,          # 0_1: its owner leaves and a ready learner takes it
        "lost": 1,             # 0_3: its owner is gone
        "learner_ready": 1,    # 0_6: a learner caught up
        "balance": 1,          # 0_7: moved without a ready copy
    }
    # A leaving owner whose task goes to a member that is not ready: the deadline passed.
    assert moves_by_cause({"0_3": ("b", 0)}, members, {"m-a": assignments["m-a"]}, 10) == {
        "scale_down_timeout": 1}
    # A stateless task needs no learner: it moves as its owner leaves, not for the deadline.
    assert moves_by_cause({"0_3": ("b", 0)}, members, {"m-a": assignments["m-a"]}, 10,
                          stateless={"0_3"}) == {"leaving": 1}


def test_a_move_is_counted_in_the_round_that_revokes_it_when_its_cause_is_known() -> None:
    members = [
        member("m-a", "a", ("0_0",), learners={"0_1": 0, "0_2": 50_000}),
        member("m-b", "b", ("0_1", "0_2"), leaving=True),
    ]
    previous = {"0_0": ("a", 0), "0_1": ("b", 0), "0_2": ("b", 0)}
    # The leaving member revokes both (and shuts down): 0_1 for a ready learner, 0_2 because
    # its deadline passed.
    revoking = {"m-a": MemberAssignment(active=("0_0",)), "m-b": MemberAssignment()}
    moving = {"0_1": ("a", 0), "0_2": ("a", 0)}
    assert moves_by_cause(previous, members, revoking, 10, {}, moving) == {
        "leaving": 1, "scale_down_timeout": 1}
    # The next round runs them where they were going, without the leaving member: counted
    # already. Under way for more than one round, a move is not counted again either.
    after = [member("m-a", "a", ("0_0",), learners={"0_1": 0, "0_2": 40_000})]
    assigned = {"m-a": MemberAssignment(active=("0_0", "0_1", "0_2"))}
    assert moves_by_cause(previous, after, assigned, 10, moving, {}) == {}
    assert moves_by_cause(previous, members, revoking, 10, moving, moving) == {}


def test_hold_deadlines_are_when_lost_tasks_are_placed_elsewhere() -> None:
    memory = LeaderMemory(lost={"0_1": (("a", 0), 10_000), "0_2": (("a", 1), 12_000)})
    assert hold_deadlines(memory, 30_000) == {"0_1": 40_000, "0_2": 42_000}
    assert hold_deadlines(None, 30_000) == {}
