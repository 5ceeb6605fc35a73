"""Several stream threads in one process on the real broker: they share tasks and standby
copies with another instance, and take every task over when it goes, with no thread failing
(the threads' stores live side by side in one state directory) and exact counts. The hand
over of a store between two threads is covered without a broker in test_stream_thread."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.broker.streams.harness import (
    Launched,
    counting_app,
    counting_topics,
    exact_counts,
    tasks_of,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


async def test_tasks_move_into_a_process_with_two_threads(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], launched: Launched
) -> None:
    app_id = unique("threads")
    source, sink, traffic = await counting_topics(bootstrap, app_id, 1000)
    launched.traffic_for(traffic)
    two = counting_app(app_id, bootstrap, tmp_path / "two", source, sink, num_threads=2,
                       num_standbys=1)
    one = counting_app(app_id, bootstrap, tmp_path / "one", source, sink, num_standbys=1)
    launched.app(two)
    launched.app(one)
    # Both 2:2 and 3:1 are balanced for instances of two threads and one (tasks per thread
    # 1 against 2, or 1.5 against 1): which one the group settles on depends on who joined
    # first. Settled means every task runs once, on either, with its standby on the other.

    def settled() -> bool:
        on_two, on_one = tasks_of(two), tasks_of(one)
        standbys_on_two = {s for t in two.threads for s in t.standbys}
        standbys_on_one = {s for t in one.threads for s in t.standbys}
        return (len(two.threads) == 2 and bool(on_one) and bool(on_two)
                and len(on_two | on_one) == 4 and not on_two & on_one
                and standbys_on_two == on_one and standbys_on_one == on_two)

    await wait_until(settled, timeout_s=150,
                     message="both instances to run tasks, each with its standby on the other")
    traffic.start()
    await launched.stop(one)
    await wait_until(lambda: len(tasks_of(two)) == 4, timeout_s=150,
                     message="the two threads to run every task")
    assert all(t.failure is None for t in two.threads)
    await traffic.stop()
    await exact_counts(bootstrap, sink, traffic.produced)
