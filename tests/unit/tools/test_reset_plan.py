"""``relay reset``'s decisions without a broker: the internal topics come from the published
topology (never from a name's prefix), and a running app is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams import App
from streams.group.predecessors import MemberFiles
from tools.reset import ResetRefused, plan_reset, refuse_live


def test_the_plan_deletes_what_the_topology_names_and_nothing_of_another_app(
        tmp_path: Path) -> None:
    app = App("orders")
    source = app.topic("orders-in", partitions=2)
    app.stream(source).group_by(lambda _k, v: v).count(store="counts").to_stream().to("out")
    (tmp_path / "a" / "orders").mkdir(parents=True)
    existing = {"orders-in", "out", "orders-counts-changelog",
                "orders-group-by-0001-repartition", "orders-eu-counts-changelog",
                "orders-status", "orders-control"}
    description = app.describe()
    [repartition] = description.repartition_topics
    plan = plan_reset("orders", description, existing | {repartition},
                      [tmp_path / "a", tmp_path / "b"])
    assert plan.topics == tuple(sorted({"orders-counts-changelog", repartition}))
    assert plan.sources == ("orders-in",)
    assert plan.state_dirs == (tmp_path / "a" / "orders",)
    assert plan.lines()[0].startswith("consumer group orders: deleted")


def test_a_running_app_or_a_state_directory_in_use_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ResetRefused, match=r"orders is running \(node-1-thread-0 published"):
        refuse_live("orders", ["node-1-thread-0"], {})
    held = MemberFiles.claim(tmp_path, "orders", 1)
    try:
        holder = MemberFiles.live_holder(tmp_path, "orders")
        assert holder is not None and holder.startswith("a live process")
        with pytest.raises(ResetRefused, match="runs orders from state directory"):
            refuse_live("orders", [], {tmp_path: holder})
    finally:
        held.release()
    assert MemberFiles.live_holder(tmp_path, "orders") is None
    refuse_live("orders", [], {tmp_path: None})
