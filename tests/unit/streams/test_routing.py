"""The batch router: records grouped by the task of their partition."""

from __future__ import annotations

from streams.runtime.routing import route_by_task


def test_partitions_of_one_task_go_together_and_unrun_partitions_are_left_out() -> None:
    a, b = object(), object()
    owners = {("in", 0): a, ("other", 0): a, ("in", 1): b}
    batches = {("in", 1): [10, 11], ("in", 0): [1, 2], ("in", 2): [7],
               ("other", 0): [3], ("in", 3): []}
    routed = route_by_task(batches, owners.get)
    assert routed == [(b, [[10, 11]]), (a, [[1, 2], [3]])]


def test_nothing_fetched_routes_nothing() -> None:
    assert route_by_task({}, lambda tp: None) == []
    assert route_by_task({("in", 0): []}, lambda tp: object()) == []
