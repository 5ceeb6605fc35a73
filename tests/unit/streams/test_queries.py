"""Interactive queries of local stores, without a broker: the key's task is the one the
runtime's partitioner sends it to, a read sees committed state only, and only a running
active answers unless the caller allows a copy (whose lag the answer carries)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from streams.app import App
from streams.group.partition_assignor import TaskLayout
from streams.queries.store_layout import StoreKeyError, StoreLayout, store_layouts
from streams.queries.store_query import (
    Holding,
    LocalStores,
    StoreQuery,
    StoreUnavailable,
    UnknownStoreError,
    choose_copy,
)
from streams.runtime.state_updater import UNKNOWN_LAG
from streams.runtime.tasks import Tasks
from streams.runtime.thread import ThreadState
from streams.runtime.transitions import Role
from streams.testing import TopologyTestDriver


def word_count_app() -> App:
    app = App("queries-test", bootstrap_servers="127.0.0.1:1")
    (app.stream("lines").flat_map_values(str.split).group_by(lambda _k, w: w)
        .count(store="word-counts").to_stream().to("counts"))
    return app


class FakeThread:
    """What the query layer reads of a stream thread: its registry, state and copies' lag."""

    def __init__(self, name: str, layout: TaskLayout, lags: dict[str, int] | None = None
                 ) -> None:
        self.status_key = name.encode()
        self.layout = layout
        self.registry = Tasks()
        self.state = ThreadState.RUNNING
        lags = lags or {}
        self.state_updater = SimpleNamespace(copy_lag=lambda t: lags.get(t, UNKNOWN_LAG))


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[TopologyTestDriver]:
    with TopologyTestDriver(word_count_app(), partitions=4, state_dir=tmp_path) as d:
        for n, line in enumerate(["apple pear fig", "kiwi plum lime", "date grape melon",
                                  "apple fig fig", "ümlaut", "x"]):
            d.pipe("lines", f"line-{n}", line)
        yield d


def counts_store(driver: TopologyTestDriver) -> dict[str, Any]:
    return {task_id: task.stores["word-counts"] for task_id, task in driver.tasks.items()
            if "word-counts" in task.stores}


def test_a_keys_task_is_the_one_the_runtime_partitions_it_to(
        driver: TopologyTestDriver) -> None:
    layout = store_layouts(driver.subs)["word-counts"]
    assert layout.partitions == 4 and not layout.windowed
    held = {word: task for task, store in counts_store(driver).items()
            for word, _ in store.items()}
    assert len(held) == 11 and len(set(held.values())) > 1
    for word, task in held.items():
        assert layout.task_of(word) == task


def test_a_read_sees_committed_state_only(driver: TopologyTestDriver) -> None:
    layout = TaskLayout(tuple(driver.subs))
    thread = FakeThread("w-thread-0", layout)
    for task in driver.tasks.values():
        thread.registry.add_running(task)
    query = StoreQuery("word-counts", LocalStores(lambda: [thread]))  # type: ignore[list-item]
    # Processed but not committed: the changelog might not have it yet.
    assert not query.read("fig").found
    driver.commit()
    reading = query.read("fig")
    assert (reading.value, reading.found, reading.role, reading.lag) == (3, True, "active", 0)
    assert reading.task == query.task_of("fig") and reading.thread == "w-thread-0"
    driver.pipe("lines", "more", "fig")
    assert query.get("fig") == 3  # the new count is not committed yet
    driver.commit()
    assert query.get("fig") == 4
    assert query.get("missing", "none") == "none"
    assert not query.read("missing").found


def test_range_merges_the_local_tasks_in_key_order(driver: TopologyTestDriver) -> None:
    driver.commit()
    thread = FakeThread("w-thread-0", TaskLayout(tuple(driver.subs)))
    tasks = sorted(counts_store(driver))
    for task_id in tasks[:-1]:  # one task is not held here
        thread.registry.add_running(driver.tasks[task_id])
    query = StoreQuery("word-counts", LocalStores(lambda: [thread]))  # type: ignore[list-item]
    reading = query.range("b", "m")
    missing_task = tasks[-1]
    counts = {"date": 1, "fig": 3, "grape": 1, "kiwi": 1, "lime": 1}
    expected = sorted((w, n) for w, n in counts.items() if query.task_of(w) != missing_task)
    assert reading.entries == expected
    assert reading.unavailable == {missing_task: "not_local"}
    assert set(reading.tasks) == set(tasks[:-1])
    limited = query.range(limit=2)
    assert len(limited.entries) == 2 and limited.truncated
    assert [k for k, _ in limited.entries] == sorted(k for k, _ in query.range().entries)[:2]


def test_a_copy_answers_only_when_allowed_and_says_its_lag(
        driver: TopologyTestDriver) -> None:
    driver.commit()
    layout = TaskLayout(tuple(driver.subs))
    fig_task = store_layouts(driver.subs)["word-counts"].task_of("fig")
    thread = FakeThread("w-thread-0", layout, lags={fig_task: 7})
    thread.registry.add_copy(fig_task, Role.STANDBY, driver.tasks[fig_task].stores)
    query = StoreQuery("word-counts", LocalStores(lambda: [thread]))  # type: ignore[list-item]
    with pytest.raises(StoreUnavailable) as refused:
        query.get("fig")
    assert refused.value.reason == "standby_only" and "allow_standby" in str(refused.value)
    reading = query.read("fig", allow_standby=True)
    assert (reading.value, reading.role, reading.lag) == (3, "standby", 7)
    with pytest.raises(StoreUnavailable) as behind:
        query.read("fig", allow_standby=True, max_lag=5)
    assert behind.value.reason == "too_far_behind"


def test_restoring_moving_and_absent_tasks_are_refused_with_a_reason() -> None:
    active = Holding("0_1", "a", "active")
    stopping = Holding("0_1", "a", "active", 0, serving=False)
    restoring = Holding("0_1", "b", "restoring", None, serving=False)
    standby = Holding("0_1", "b", "standby", 12)
    learner = Holding("0_1", "c", "learner", 3)
    unknown_lag = Holding("0_1", "c", "standby", None)
    assert choose_copy("s", "0_1", [standby, active], allow_standby=True) is active
    assert choose_copy("s", "0_1", [standby, learner], allow_standby=True) is learner

    def reason(holdings: list[Holding], allow: bool = False) -> str:
        with pytest.raises(StoreUnavailable) as refused:
            choose_copy("s", "0_1", holdings, allow)
        assert refused.value.retry_after_s > 0 and refused.value.task == "0_1"
        return refused.value.reason

    assert reason([]) == "not_local"
    assert reason([Holding("0_2", "a", "active")]) == "not_local"
    assert reason([restoring, standby], allow=True) == "restoring"
    assert reason([stopping]) == "moving"
    assert reason([standby]) == "standby_only"
    assert reason([unknown_lag], allow=True) == "restoring"


def test_a_stopping_threads_active_is_not_read(driver: TopologyTestDriver) -> None:
    driver.commit()
    thread = FakeThread("w-thread-0", TaskLayout(tuple(driver.subs)))
    for task in driver.tasks.values():
        thread.registry.add_running(task)
    thread.state = ThreadState.PENDING_SHUTDOWN
    query = StoreQuery("word-counts", LocalStores(lambda: [thread]))  # type: ignore[list-item]
    with pytest.raises(StoreUnavailable) as refused:
        query.get("fig")
    assert refused.value.reason == "moving"


def test_unknown_stores_keys_that_cannot_be_encoded_and_an_app_not_running() -> None:
    app = word_count_app()
    with pytest.raises(UnknownStoreError, match="word-counts"):
        app.store("nope")
    with pytest.raises(StoreUnavailable) as refused:
        app.store("word-counts").get("fig")
    assert refused.value.reason == "not_running"
    layout = StoreLayout("s", 0, 4, word_count_app().topology.sources[0].key_serde)
    with pytest.raises(StoreKeyError, match="cannot encode"):
        layout.task_of(object())
    with pytest.raises(StoreKeyError):
        layout.task_of(None)


def test_windowed_stores_are_partitioned_by_the_records_key(tmp_path: Path) -> None:
    from streams.dsl.windows import HoppingWindows

    app = App("windowed-queries", bootstrap_servers="127.0.0.1:1")
    (app.stream("clicks").group_by_key().windowed_by(HoppingWindows(size_ms=1000, advance_ms=1000))
        .count(store="clicks-per-second"))
    with TopologyTestDriver(app, partitions=3, state_dir=tmp_path) as d:
        for n, user in enumerate(["ann", "bob", "cy", "dee", "ann"]):
            d.pipe("clicks", user, n, timestamp_ms=100 * n)
        d.commit()
        layout = store_layouts(d.subs)["clicks-per-second"]
        assert layout.windowed
        thread = FakeThread("t", TaskLayout(tuple(d.subs)))
        for task in d.tasks.values():
            thread.registry.add_running(task)
        query = StoreQuery("clicks-per-second",
                           LocalStores(lambda: [thread]))  # type: ignore[list-item]
        assert query.get(["ann", 0]) == 2 and query.get(("bob", 0)) == 1
        with pytest.raises(StoreKeyError, match="window_start"):
            query.get("ann")


def test_session_and_sliding_stores_are_partitioned_by_the_records_key(
    tmp_path: Path,
) -> None:
    from streams.dsl.sessions import SessionWindows
    from streams.dsl.sliding import SlidingWindows

    app = App("session-queries", bootstrap_servers="127.0.0.1:1")
    grouped = app.stream("clicks").group_by_key()
    grouped.windowed_by(SessionWindows(inactivity_gap_ms=100)).count(store="visits")
    grouped.windowed_by(SlidingWindows(time_difference_ms=100)).count(store="bursts")
    with TopologyTestDriver(app, partitions=3, state_dir=tmp_path) as d:
        for n, user in enumerate(["ann", "bob", "ann"]):
            d.pipe("clicks", user, n, timestamp_ms=10 * n)
        d.commit()
        layouts = store_layouts(d.subs)
        visits, bursts = layouts["visits"], layouts["bursts"]
        assert visits.sessions and not visits.windowed and bursts.windowed
        thread = FakeThread("t", TaskLayout(tuple(d.subs)))
        for task in d.tasks.values():
            thread.registry.add_running(task)
        query = StoreQuery("visits", LocalStores(lambda: [thread]))  # type: ignore[list-item]
        assert query.get(["ann", 20, 0]) == 2 and query.get(("bob", 10, 10)) == 1
        with pytest.raises(StoreKeyError, match="session_end_ms, session_start_ms"):
            query.get("ann")
        assert visits.task_of(["ann", 20, 0]) == bursts.task_of(["ann", 0])
        back = StoreLayout.from_status("visits", visits.to_status())
        assert back.sessions and back.task_of(["ann", 20, 0]) == visits.task_of(["ann", 20, 0])


def test_a_layout_travels_through_the_status_record(driver: TopologyTestDriver) -> None:
    layout = store_layouts(driver.subs)["word-counts"]
    assert layout.to_status()["key_serde"] == "msgpack"
    back = StoreLayout.from_status("word-counts", layout.to_status())
    assert back.task_of("fig") == layout.task_of("fig")

    class Custom:
        name = "msgpack"  # claims a known name but is not that serde

        def dumps(self, value: Any) -> bytes:
            return repr(value).encode()

        def loads(self, data: bytes) -> Any:
            return data.decode()

    custom = StoreLayout("s", 0, 2, Custom())  # type: ignore[arg-type]
    assert custom.to_status()["key_serde"] is None
    with pytest.raises(ValueError, match="query a worker"):
        StoreLayout.from_status("s", custom.to_status())
    with pytest.raises(ValueError, match="malformed"):
        StoreLayout.from_status("s", {"key_serde": "msgpack", "partitions": 0,
                                      "sub_topology": 0})


class Seen:
    """A process() step keeping events by their own id, not by the record's key."""

    def init(self, context: Any) -> None:
        self.context = context

    def process(self, key: Any, value: Any) -> None:
        self.context.store("seen").put(value["id"], key)


def test_a_process_steps_store_is_known_as_one_and_its_404_says_why() -> None:
    from streams.queries.server import not_found_hint

    app = App("enrich", bootstrap_servers="127.0.0.1:1")
    events = app.stream(app.topic("events", key_serde="str", partitions=2))
    events.process(Seen, stores=("seen",))
    events.group_by_key().count(store="per-user").to_stream().to("out")
    with TopologyTestDriver(app) as driver:
        layouts = store_layouts(driver.subs)
    assert (layouts["seen"].processor, layouts["per-user"].processor) == (True, False)
    published = StoreLayout.from_status("seen", layouts["seen"].to_status())
    assert published.processor
    hint = not_found_hint("0_1", 1, processor=True)
    assert "belongs to a process() step" in hint and "app.store(name)" in hint
    assert "partitioner" not in hint and "partitioner" in not_found_hint("0_1", 1)
    windowed = not_found_hint("0_1", 1, windowed=True)
    assert "leaves its store once its size and grace have passed" in windowed
    assert "retention_ms=" in windowed
