"""The record collector: ships a thread's output, dead-letter and changelog records through
its data producer (:mod:`streams.runtime.delivery`) and tracks their acknowledgements.

Outputs are handed after every batch, without a per-record await; the handing waits only
while the producer's queue is full. Changelog records wait in their stores, coalesced to the
latest write per key, until the commit or until the thread's stores hold more than
``changelog_buffer_bytes`` of them: a key counted a thousand times between two commits costs
one changelog record, not a thousand. Cancelled while the queue is full (a thread stopping),
the records not handed over yet stay queued (outputs in the task, changelog records in their
store), so the final commit ships them instead of dropping them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from statestore.record_size import truncated_payload
from statestore.store import KeyValueStore
from streams.metrics import Metrics
from streams.runtime.dead_letter_log import (
    DeadLetterLog,
)
from streams.runtime.delivery import FLUSH_TIMEOUT_S, Deliveries
from streams.runtime.task import RecordError, StreamTask, drop_reason

log = logging.getLogger(__name__)


def changelogs_due(tasks: Iterable[StreamTask], buffer_bytes: int) -> bool:
    """Whether the changelog records the stores of ``tasks`` hold have outgrown the buffer."""
    queued = 0
    for task in tasks:
        for store in task.stores.values():
            queued += store.changelog_bytes
    return queued > buffer_bytes


class RecordCollector:
    def __init__(self, producer: Any, dead_letter_topic: str, metrics: Metrics | None = None,
                 metrics_label: str = "", changelog_buffer_bytes: int = 0,
                 flush_timeout_s: float = FLUSH_TIMEOUT_S,
                 new_producer: Callable[[], Any] | None = None) -> None:
        self.changelog_buffer_bytes = changelog_buffer_bytes
        #: ``new_producer`` makes the producer that replaces one that can send nothing more.
        self.deliveries = Deliveries(producer, flush_timeout_s, new_producer)
        self._metrics = metrics
        self._label = metrics_label
        self._dead_letter_topic = dead_letter_topic
        self._dead_letter_log = DeadLetterLog()
        self.dead_lettered = 0

    @property
    def producer(self) -> Any:
        """The data producer now (a new one replaces one that can send nothing more)."""
        return self.deliveries.producer

    async def ship_outputs(self, tasks: Iterable[StreamTask]) -> None:
        """After a batch: hand the queued outputs of ``tasks`` to the producer, and their
        changelog records too once they outgrew ``changelog_buffer_bytes``."""
        tasks = list(tasks)
        await self.ship(tasks, changelogs=changelogs_due(tasks, self.changelog_buffer_bytes))

    async def ship(self, tasks: Iterable[StreamTask], changelogs: bool = True) -> None:
        """Hand every queued output and (``changelogs``) changelog record of ``tasks`` to the
        producer, with each task's input position written into its stores first.

        The changelog records go only once every output handed so far is acknowledged: they
        carry the input position, and a task restored from them after a crash skips the
        input it covers. Handed together, a crash could land after the changelog's batch was
        acknowledged and before the outputs' (the producer orders nothing across
        partitions), and those outputs were never written. A task whose outputs were not
        delivered ships no position: it runs again from its last commit."""
        tasks = list(tasks)
        deliveries = self.deliveries
        for task in tasks:
            outputs = task.take_outputs()
            handed = 0
            try:
                handed = deliveries.hand(outputs, 0, task_id=task.task_id)
                while handed < len(outputs):
                    await deliveries.room()
                    handed = deliveries.hand(outputs, handed, task_id=task.task_id)
            finally:
                task.context.outputs[:0] = outputs[handed:]
        with_stores = [task for task in tasks if changelogs and task.stores]
        if with_stores:
            undelivered = await deliveries.wait_reported()
            for task in with_stores:
                if undelivered is None or task.task_id in undelivered:
                    continue  # its changelog waits for the next commit
                task.record_input_position()
                await self._send_pending(task.task_id, task.stores.values())
        deliveries.serve()

    async def _send_pending(self, task_id: str, stores: Iterable[KeyValueStore]) -> None:
        deliveries = self.deliveries
        for store in stores:
            topic = store.changelog_topic
            if topic is None:
                continue
            records = store.drain_changelog()
            if not records:
                continue
            tracked = deliveries.for_store(store, task_id)
            handed = 0
            try:
                handed = deliveries.hand(records, 0, topic, store.partition, tracked)
                while handed < len(records):
                    await deliveries.room()
                    handed = deliveries.hand(records, handed, topic, store.partition, tracked)
            finally:
                # Cancelled while the queue was full (a thread stopping), the records not yet
                # handed over must stay queued, or the input offsets committed next would
                # cover state the changelog never got.
                store.requeue_changelog(records[handed:])

    async def send_changelogs(self, tasks: Iterable[StreamTask]) -> None:
        for task in tasks:
            await self._send_pending(task.task_id, task.stores.values())

    async def dead_letter(self, error: RecordError, task_id: str = "",
                          processed: int = -1) -> None:
        """Send ``error``'s record to the dead-letter topic; ``processed``: how many records
        its task processed fine so far (for the log, see :mod:`dead_letter_log`)."""
        record = error.record
        self._dead_letter_log.report(error, task_id, processed, self._dead_letter_topic)
        key, value, cut = truncated_payload(record.key, record.value)
        await self.deliveries.send(self._dead_letter_topic, key, value,
                                   error.dead_letter_headers() + cut, task_id)
        self.dead_lettered += 1
        if self._metrics is not None:
            self._metrics.record_dead_letters(self._label, task_id, reason=drop_reason(error))

    async def wait_acknowledged(self, running: Iterable[str] = ()) -> frozenset[str]:
        """Every output, dead letter and changelog record sent so far is reported (the
        stores' changelog positions move on); returns the tasks among ``running`` whose
        records were not delivered, and raises the first refusal (see
        :meth:`Deliveries.wait_acknowledged`)."""
        return await self.deliveries.wait_acknowledged(running)

    def discard_queued(self) -> None:
        """The thread's tasks were stopped uncommitted: what they queued is not sent."""
        self.deliveries.discard_queued()

    async def close(self) -> None:
        """Wait (bounded) for what is in flight; the thread stops its other producer."""
        await self.deliveries.close()
