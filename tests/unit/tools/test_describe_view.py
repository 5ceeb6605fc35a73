"""``relay describe``'s task view from status records (no broker): tasks that no member runs
are listed."""

from __future__ import annotations

from tools.cli import task_view, unowned_tasks


def member(active: list[str], restoring: list[str] | None = None,
           standbys: dict[str, int] | None = None) -> dict[str, object]:
    return {"active": active, "restoring": restoring or [], "standbys": standbys or {},
            "learners": {}, "acceptable_lag": 10, "app_tasks": ["0_0", "0_1", "0_2", "0_3"]}


def test_tasks_no_member_runs_are_shown() -> None:
    tasks = task_view({"a-thread-0": member(["0_0"], standbys={"0_3": 4}),
                       "b-thread-0": member([], restoring=["0_1"])})
    assert list(tasks) == ["0_0", "0_1", "0_2", "0_3"]
    assert unowned_tasks(tasks) == ["0_2", "0_3"]
    assert tasks["0_3"]["standbys"] == [{"member": "a-thread-0", "lag": 4, "isReady": True}]


def test_records_without_the_app_tasks_still_describe() -> None:
    old = member(["0_0"])
    del old["app_tasks"]
    assert unowned_tasks(task_view({"a-thread-0": old})) == []
