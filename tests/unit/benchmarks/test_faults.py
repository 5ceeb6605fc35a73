"""The fault benchmark: its checks are computed from what went in and came out (fast tests of
the pure part), and a tiny run with one kill reports every figure (a broker smoke test)."""

from __future__ import annotations

from collections import Counter

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
