"""Every DSL operation end to end on the real broker, in one app with several sub-topologies:
filter, map_values, branch, peek, merge, flat_map, repartitioning before count and reduce,
tumbling windows with a late record, a table and a stream-table join, a custom processor with
its own store, and output topics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streams.windows import TumblingWindows
from tests.conftest import wait_until
from tests.streams.harness import create_topics, latest, make_app, produce, read_all, running

pytestmark = pytest.mark.broker


class Deduplicate:
    """Forwards the first record of each (key, id) only; remembers ids in its store."""

    def init(self, context: Any) -> None:
        self.context = context
        self.seen = context.store("seen-ids")

    def process(self, key: Any, value: Any) -> None:
        if (key, value["id"]) in self.seen:
            return
        self.seen.put((key, value["id"]), True)
        self.context.forward(key, value["id"])


async def test_every_dsl_operation(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    app_id = unique("dsl")
    t = {name: f"{app_id}-{name}" for name in (
        "events", "ticks", "users", "values", "clicks", "counts", "kind-totals", "windows",
        "joined", "dedup",
    )}
    await create_topics(bootstrap, {t["events"]: 2, t["users"]: 2, t["ticks"]: 1} | {
        t[n]: 1 for n in ("values", "clicks", "counts", "kind-totals", "windows", "joined",
                          "dedup")
    })
    app = make_app(app_id, bootstrap, tmp_path)
    peeked: list[Any] = []

    events = app.stream(t["events"])
    valid = events.filter(lambda k, v: v["kind"] != "bad")
    valid.map_values(lambda v: v["n"]).to(t["values"])
    clicks, others = valid.branch(lambda k, v: v["kind"] == "click", lambda k, v: True)
    clicks.peek(lambda k, v: peeked.append(k)).to(t["clicks"])
    (
        clicks.merge(others)
        .flat_map(lambda k, v: [(k, v), (f"{k}-copy", v)])
        .group_by_key()
        .count(store="counts")
        .to_stream()
        .to(t["counts"])
    )
    (
        valid.map_values(lambda v: v["n"])
        .select_key(lambda k, v: f"kind-{k[0]}")
        .group_by_key()
        .reduce(lambda a, b: a + b, store="kind-totals")
        .to_stream()
        .to(t["kind-totals"])
    )
    (
        app.stream(t["ticks"])
        .group_by_key()
        .windowed_by(TumblingWindows(1000, grace_ms=500))
        .count(store="ticks")
        .map(lambda w, n: ([w.key, w.start], n))
        .to(t["windows"])
    )
    users = app.table(t["users"], store="users")
    valid.join(users, lambda v, u: f"{u}:{v['kind']}").to(t["joined"])
    events.filter(lambda k, v: "id" in v).process(Deduplicate, stores=["seen-ids"]).to(t["dedup"])

    await produce(bootstrap, t["users"], [("alice", "Alice"), ("bob", "Bob")])
    await produce(bootstrap, t["events"], [
        ("alice", {"kind": "click", "n": 1}),
        ("bob", {"kind": "view", "n": 2}),
        ("alice", {"kind": "bad", "n": 100}),
        ("carol", {"kind": "click", "n": 3}),
        ("alice", {"kind": "view", "n": 4}),
        ("dave", {"kind": "x", "n": 5, "id": 1}),
        ("dave", {"kind": "x", "n": 5, "id": 1}),
        ("dave", {"kind": "x", "n": 5, "id": 2}),
    ])
    await produce(bootstrap, t["ticks"], [
        ("clock", {"kind": "tick", "n": 0}, 1000),
        ("clock", {"kind": "tick", "n": 0}, 1200),
        ("clock", {"kind": "tick", "n": 0}, 2500),
        ("clock", {"kind": "tick", "n": 0}, 4000),
        ("clock", {"kind": "tick", "n": 0}, 1500),  # late: [1000, 2000) closed at 2500
        ("clock", {"kind": "tick", "n": 0}, 3600),  # in grace: [3000, 4000) open until 4500
    ])

    async with running(app):
        async def counts_done() -> bool:
            counts = latest(await read_all(bootstrap, t["counts"], 1))
            return counts.get("dave-copy") == 3

        await wait_until(counts_done, timeout_s=90, message="the counts to reach their totals")
        async def windows_done() -> bool:
            return len(latest(await read_all(bootstrap, t["windows"], 1))) == 4

        await wait_until(windows_done, timeout_s=30, message="four windows")
        await wait_until(
            lambda: sum(th.late_records_dropped for th in app.threads) == 1,
            timeout_s=30, message="the late record to be dropped",
        )

    values = await read_all(bootstrap, t["values"], 1)
    assert sorted(v for _, v in values) == [1, 2, 3, 4, 5, 5, 5]
    assert sorted(k for k, _ in await read_all(bootstrap, t["clicks"], 1)) == ["alice", "carol"]
    assert sorted(peeked) == ["alice", "carol"]
    counts = latest(await read_all(bootstrap, t["counts"], 1))
    assert counts == {
        "alice": 2, "alice-copy": 2, "bob": 1, "bob-copy": 1, "carol": 1, "carol-copy": 1,
        "dave": 3, "dave-copy": 3,
    }
    totals = latest(await read_all(bootstrap, t["kind-totals"], 1))
    assert totals == {"kind-a": 5, "kind-b": 2, "kind-c": 3, "kind-d": 15}
    windows = latest(await read_all(bootstrap, t["windows"], 1))
    assert windows == {("clock", 1000): 2, ("clock", 2000): 1, ("clock", 3000): 1,
                       ("clock", 4000): 1}
    joined = sorted(v for _, v in await read_all(bootstrap, t["joined"], 1))
    assert joined == ["Alice:click", "Alice:view", "Bob:view"]
    assert sorted(v for _, v in await read_all(bootstrap, t["dedup"], 1)) == [1, 2]
