"""The commit protocol, in one place: at-least-once.

1. every output and changelog record of the thread's running tasks is shipped and
   acknowledged by the broker;
2. then the tasks' input offsets are committed;
3. then each store writes its checkpoint (the changelog offset it reflects).

A crash between two steps loses nothing: uncommitted input is processed again, and the
stores' input position (written with the changelog records) keeps their state from counting
it twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka.structs import TopicPartition

from streams.driver import COMMIT_DEFERRED_ERRORS, GroupConsumer
from streams.record_collector import RecordCollector
from streams.task import StreamTask

log = logging.getLogger(__name__)

#: How long an offset commit may wait before it is left to the next one.
OFFSET_COMMIT_TIMEOUT_S = 15.0


class Committer:
    def __init__(self, collector: RecordCollector, consumer: GroupConsumer,
                 tasks: Callable[[], list[StreamTask]], name: str) -> None:
        self._collector = collector
        self._consumer = consumer
        self._tasks = tasks
        self._name = name

    async def commit(self, force: bool = False) -> None:
        """Acknowledgements, then input offsets, then checkpoints. ``force``: commit the
        offsets even while the group rebalances (from a rebalance callback, which the join
        waits for anyway)."""
        tasks = self._tasks()
        await self._collector.ship(tasks)
        await self._collector.wait_acknowledged()
        offsets: dict[TopicPartition, int] = {
            tp: offset for task in tasks for tp, offset in task.processed.items()
        }
        if offsets and self._consumer.rebalancing and not force:
            # A commit now would wait for the join to complete, while the join's callbacks
            # wait for this commit. The next commit carries these offsets.
            log.debug("%s: offset commit deferred during a rebalance", self._name)
        elif offsets:
            try:
                await asyncio.wait_for(self._consumer.commit(offsets), OFFSET_COMMIT_TIMEOUT_S)
            except COMMIT_DEFERRED_ERRORS as exc:
                # A rebalance is under way (cooperative members keep processing through it);
                # the next commit carries these offsets, and the stores' input position keeps
                # the state exact meanwhile.
                log.info("%s: offset commit deferred: %s", self._name, exc)
        for task in tasks:
            task.purge_expired_windows()
        await self._collector.send_changelogs(tasks)
        await self._collector.wait_acknowledged()
        for task in tasks:
            for store in task.stores.values():
                store.commit()
