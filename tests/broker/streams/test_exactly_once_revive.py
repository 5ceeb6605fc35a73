"""Exactly-once on a broker: a transaction that fails without a fencing revives its task in
place. After a SIGKILL of the broker that coordinates the group, librdkafka sends the next
transactions' offsets to the old coordinator once it is back, which answers
``NOT_COORDINATOR``: every task's transaction fails at once, abortable. The failure is
injected here at ``send_offsets_to_transaction`` (a broker kill takes a JVM restart, too slow
for the suite), after the records were flushed into the open transaction and while the
consumer holds records fetched past the committed position. Every task then restores from
its changelog, fences its old producer (which aborts the open transaction) and resumes at its
committed position, without a rebalance; every count comes out once, in order."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from streams.runtime import factory
from streams.runtime.transactions import new_transactional_producer
from tests.broker.streams.harness import (
    counting_app,
    counting_topics,
    latest,
    read_committed,
    running,
)
from tests.broker.streams.test_exactly_once_broker import EXACTLY_ONCE, each_count_once
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


class CoordinatorMoved:
    """Once armed, the next ``send_offsets_to_transaction`` of each transactional id fails as
    it does when the group's old coordinator answers it."""

    def __init__(self) -> None:
        self.armed = False
        self.failed: set[str] = set()

    def producer(self, bootstrap: str, tid: str) -> Any:
        return _Producer(new_transactional_producer(bootstrap, tid), tid, self)


class _Producer:
    def __init__(self, inner: Any, tid: str, moved: CoordinatorMoved) -> None:
        self._inner, self._tid, self._moved = inner, tid, moved

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def send_offsets_to_transaction(self, *args: Any) -> Any:
        if self._moved.armed and self._tid not in self._moved.failed:
            self._moved.failed.add(self._tid)
            raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR, "Not coordinator",
                                            txn_requires_abort=True))
        return self._inner.send_offsets_to_transaction(*args)


@pytest.mark.timeout(120)
async def test_transactions_failed_by_a_moved_coordinator_revive_their_tasks_exactly_once(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    moved = CoordinatorMoved()
    monkeypatch.setattr(factory, "new_transactional_producer", moved.producer)
    app_id = unique("eos-revive")
    source, sink, traffic = await counting_topics(bootstrap, app_id, records=200,
                                                  partitions=2)
    # Two stages: a stateless first stage (only the group's offsets say where it was) and
    # a count (its state says it too), each with two tasks on one thread.
    app = counting_app(app_id, bootstrap, tmp_path, source, sink, stages=2,
                       repartition_purge_interval_ms=3_600_000, **EXACTLY_ONCE)
    async with running(app):
        await wait_until(lambda: len(app.threads) == 1 and len(app.threads[0].tasks) == 4,
                         timeout_s=60, message="the app running its four tasks")
        thread = app.threads[0]

        async def counted(produced: dict[str, int]) -> bool:
            return latest(await read_committed(bootstrap, sink, 1)) == produced

        await wait_until(lambda: counted(dict(traffic.produced)), timeout_s=60,
                         message="the first records counted")
        rebalances = thread.status.rebalances
        traffic.start()
        moved.armed = True
        await wait_until(lambda: len(moved.failed) == 4 and not thread.restoring,
                         timeout_s=30, message="every task's transaction failed and revived")
        await traffic.stop()
        await wait_until(lambda: counted(dict(traffic.produced)), timeout_s=60,
                         message="exact committed counts after the revivals")
        assert thread.committer.failures >= 4
        assert thread.status.rebalances == rebalances  # revived in place, no round
    outputs = await read_committed(bootstrap, sink, 1)
    assert each_count_once(outputs, traffic.produced) == {}
