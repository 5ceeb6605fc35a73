"""The fault benchmark: its checks are computed from what went in and came out (fast tests of
the pure part), and a tiny run with one kill reports every figure (a broker smoke test)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from benchmarks import faults
from benchmarks.faults_broker import Roles, describe_roles, pick_leader
from benchmarks.faults_check import (
    compare_latest,
    compare_occurrences,
    longest_stalls,
    rebalances,
)


def test_latest_values_are_compared_key_by_key() -> None:
    result = compare_latest({"a": 3, "b": 2, "c": 1, "d": 4}, {"a": 3, "b": 5, "c": 0, "x": 1})
    assert (result.cases, result.exact, result.over, result.under) == (4, 1, 1, 2)
    assert (result.over_by, result.under_by, result.unexpected) == (3, 5, 1)
    assert not result.is_exact
    assert compare_latest({"a": 1}, {"a": 1}).is_exact


def test_each_input_record_must_come_out_once() -> None:
    result = compare_occurrences([1, 2, 3, 4], Counter({1: 1, 2: 3, 5: 1}), wrong=1)
    assert (result.exact, result.over, result.over_by, result.under) == (1, 1, 2, 2)
    assert result.unexpected == 1 and result.wrong == 1 and not result.is_exact


def test_a_stall_counts_from_the_start_and_until_the_end() -> None:
    stalls = longest_stalls({"0_0": [101, 102, 130, 131], "0_1": [], "0_2": [105, 170]},
                            start=100, end=140)
    assert (stalls["0_0"].gap_s, stalls["0_0"].from_s, stalls["0_0"].to_s) == (28, 2, 30)
    assert stalls["0_1"].gap_s == 40
    assert stalls["0_2"].gap_s == 35 and stalls["0_2"].to_s == 40
    assert rebalances([3, 3, 4, 6, 6]) == 2


def test_the_broker_to_kill_coordinates_the_most_groups_then_leads_the_most() -> None:
    roles = Roles(leads={1: ["input a-0", "input a-1", "changelog c-0"],
                         2: ["input a-2"], 3: ["changelog c-1", "input a-3"]},
                  coordinators={"orders": 2, "counts": 3})
    # One group each for 2 and 3: the one leading more partitions, though 1 leads most.
    assert pick_leader(roles) == 3
    assert describe_roles(roles, 2) == "coordinator of orders; leader of 1 input partitions"
    roles.coordinators["counts"] = 2
    assert pick_leader(roles) == 2
    assert "coordinator of counts, orders" in describe_roles(roles, 2)
    # No group known: the leader of most partitions, the lowest id on a tie.
    assert pick_leader(Roles(leads={3: ["input a-0"], 1: ["input a-1"]})) == 1


def test_a_fault_counts_from_when_it_struck() -> None:
    """A broker kill first asks who leads what (1.4 s in a loaded exactly-once run): its
    stalls count from the SIGKILL, not from when the fault began."""
    from benchmarks.faults_check import applied_faults

    timeline = [
        {"at_s": 50.0, "fault": "kill", "worker": "w2", "seconds": 5.0, "status": "applied"},
        {"at_s": 84.4, "struck_s": 85.8, "fault": "broker-kill", "status": "applied"},
        {"at_s": 90.0, "fault": "disk-full", "status": "not triggered"},
        {"at_s": 95.0, "event": "warm"},
    ]
    assert applied_faults(timeline, 10, 0.1) == [(50.0, "kill w2", 15.1),
                                                 (85.8, "broker-kill", 10.1)]


def test_broker_faults_are_not_run_without_a_cluster(tmp_path: Path) -> None:
    args = faults.parse_args(["--json", str(tmp_path / "f.json")])
    bench = faults.Bench(args, "127.0.0.1:1", tmp_path)
    assert set(bench.not_run) == set(faults.BROKER_FAULTS)
    assert "needs --engine kafka" in bench.not_run["broker-kill"]


def test_each_fault_gets_the_longest_stall_that_ended_before_the_next_one() -> None:
    from benchmarks.faults_check import fault_limit_s, gaps, stalls_per_fault

    times = {"0_0": [100, 110, 135, 150, 170], "1_0": [100, 112, 120, 160, 175]}
    found = gaps(times, 100, 180, at_least_s=9.5)
    assert [(s.task, s.gap_s, s.from_s, s.to_s) for s in found] == [
        ("0_0", 10, 0, 10), ("1_0", 12, 0, 12), ("0_0", 25, 10, 35), ("1_0", 40, 20, 60),
        ("0_0", 15, 35, 50), ("0_0", 20, 50, 70), ("1_0", 15, 60, 75), ("0_0", 10, 70, 80)]
    per_fault = stalls_per_fault(found, [(5, "kill w2", 18), (40, "stop w3", 18)], 80)
    assert [(f.fault, f.stall.task, f.stall.gap_s, f.over) for f in per_fault
            if f.stall is not None] == [("kill w2", "0_0", 25, True), ("stop w3", "1_0", 40, True)]
    # A kill back within its session waits for its worker; one back later does not.
    assert fault_limit_s("kill", 5, 10, 8) == 23
    assert fault_limit_s("kill", 20, 10, 8) == 18
    assert fault_limit_s("stop", 25, 10, 8) == 18
    # A run that failed before its first fault still reports.
    assert stalls_per_fault(found, [], 80) == []
