"""``relay describe``'s task view from status records (no broker): tasks that no member runs
are listed, and its tables are printed whole however narrow the terminal."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from tools import cli
from tools.cli import leaderless, task_view, unowned_tasks


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


def test_a_table_wider_than_the_terminal_is_printed_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    narrow = Console(width=80, file=io.StringIO())
    monkeypatch.setattr(cli, "console", narrow)
    table = Table(title="members")
    for column in ("member", "instance", "generation", "active"):
        table.add_column(column)
    table.add_row("checkout-eu-west-1a-7f9c-thread-0", "checkout-eu-west-1a-7f9c", "17",
                  "0_0, 0_1, 1_0, 1_3, 2_2, 2_5")
    cli.print_whole(table)
    printed = narrow.file.getvalue()  # type: ignore[attr-defined]
    for whole in ("checkout-eu-west-1a-7f9c-thread-0", "generation",
                  "0_0, 0_1, 1_0, 1_3, 2_2, 2_5"):
        assert whole in printed
    assert "…" not in printed and narrow.width == 80


def test_a_group_nobody_led_since_a_static_restart_is_said_so() -> None:
    assert leaderless({}) is None
    assert leaderless({"a-thread-0": {"leader": True}, "b-thread-0": {"leader": False}}) is None
    note = leaderless({"a-thread-0": {"leader": False}, "b-thread-0": {}})
    assert note is not None and "static restart starts none" in note
