"""The commit protocol, in one place: at-least-once.

1. every output and changelog record of the thread's running tasks is shipped and
   acknowledged by the broker, the changelog records (which carry each task's input
   position) only once the outputs are (:meth:`RecordCollector.ship`);
2. then the tasks' input offsets are committed;
3. then each store writes its checkpoint (the changelog offset it reflects).

A crash between two steps loses nothing: uncommitted input is processed again, and the
stores' input position (written with the changelog records) keeps their state from counting
it twice.

A task some of whose records were not delivered (their ``message.timeout.ms`` ran out: a
broker failover longer than it) has its offsets left out of the commit and its stores
uncommitted, and is handed to ``replay``, which runs it again in place from its last commit
(see :mod:`streams.runtime.delivery_errors`); the thread's other tasks commit as usual.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiokafka.structs import TopicPartition

from streams.kafka.driver import COMMIT_DEFERRED_ERRORS, GroupConsumer
from streams.metrics import Metrics
from streams.runtime.record_collector import RecordCollector
from streams.runtime.repartition_purge import RepartitionPurger
from streams.runtime.task import StreamTask, task_counts

log = logging.getLogger(__name__)

#: How long an offset commit may wait before it is left to the next one.
OFFSET_COMMIT_TIMEOUT_S = 15.0


class Committer:
    def __init__(self, collector: RecordCollector, consumer: GroupConsumer,
                 tasks: Callable[[], list[StreamTask]], name: str,
                 metrics: Metrics | None = None, metrics_label: str = "",
                 purger: RepartitionPurger | None = None,
                 replay: Callable[[str, dict[TopicPartition, int]], object] | None = None,
                 ) -> None:
        self._collector = collector
        #: Revives a task whose records were not delivered (None: nothing does, and such a
        #: task is only left uncommitted).
        self._replay = replay
        self._consumer = consumer
        self._tasks = tasks
        self._name = name
        self._metrics = metrics
        self._label = metrics_label or name
        #: Deletes what the tasks committed on their repartition topics; None: nothing does.
        self.purger = purger
        #: The offsets this thread committed last, per partition.
        self.committed: dict[TopicPartition, int] = {}

    async def commit(self, force: bool = False) -> None:
        """Acknowledgements, then input offsets, then checkpoints. ``force``: commit the
        offsets even while the group rebalances (from a rebalance callback, which the join
        waits for anyway)."""
        started = time.perf_counter()
        tasks = self._tasks()
        running = [task.task_id for task in tasks]
        await self._collector.ship(tasks)
        replay = set(await self._collector.wait_acknowledged(running))
        offsets: dict[TopicPartition, int] = {
            tp: offset for task in tasks if task.task_id not in replay
            for tp, offset in task.processed.items()
        }
        if offsets and self._consumer.rebalancing and not force:
            # A commit now would wait for the join to complete, while the join's callbacks
            # wait for this commit. The next commit carries these offsets.
            log.debug("%s: offset commit deferred during a rebalance", self._name)
        elif offsets:
            try:
                await asyncio.wait_for(self._consumer.commit(offsets), OFFSET_COMMIT_TIMEOUT_S)
                self.committed.update(offsets)
            except COMMIT_DEFERRED_ERRORS as exc:
                # A rebalance is under way (cooperative members keep processing through it);
                # the next commit carries these offsets, and the stores' input position keeps
                # the state exact meanwhile.
                log.info("%s: offset commit deferred: %s", self._name, exc)
        kept = [task for task in tasks if task.task_id not in replay]
        for task in kept:
            task.purge_expired_windows()
        await self._collector.send_changelogs(kept)
        replay.update(await self._collector.wait_acknowledged(running))
        for task in tasks:
            if task.task_id not in replay:
                for store in task.stores.values():
                    store.commit()
        if replay:
            self._revive(sorted(replay))
        if self.purger is not None:
            self.purger.after_commit(tasks, self.committed)
        if self._metrics is not None:
            # The lag first: a scrape that sees a commit counted sees its figures.
            self._record_input_lag(tasks)
            self._metrics.record_task_counts(self._label, task_counts(tasks))
            if offsets:
                # As in Kafka Streams, only a commit of some input counts: the process loop
                # commits on its interval from its start, before its tasks have run or read
                # anything, and such a commit committed no record.
                self._metrics.observe_commit(self._label, time.perf_counter() - started)

    def _revive(self, task_ids: list[str]) -> None:
        log.warning("%s: records of %s were not delivered; run again from their last commit",
                    self._name, task_ids)
        if self._replay is not None:
            for task_id in task_ids:
                self._replay(task_id, dict(self.committed))

    async def close(self) -> None:
        if self.purger is not None:
            await self.purger.close()

    def _record_input_lag(self, tasks: list[StreamTask]) -> None:
        """Per task: its input's end (the fetch high watermark) minus its committed
        position, summed over its partitions; a partition not fetched yet has no known end
        and is left out, a task with no known end gets no figure."""
        assert self._metrics is not None
        for task in tasks:
            lag: int | None = None
            for tp in task.partitions:
                end = self._consumer.highwater(tp)
                position = self.committed.get(tp, task.processed.get(tp))
                if end is None or position is None:
                    continue
                lag = (lag or 0) + max(0, end - position)
            if lag is not None:
                self._metrics.set_input_lag(self._label, task.task_id, lag)
