"""The record collector: ships a thread's output, dead-letter and changelog records through
its producer and tracks their acknowledgements.

A send waits while the producer's buffer is full. Cancelled there (a thread stopping), the
records not handed over yet stay queued (outputs in the task, changelog records in their
store), so the final commit ships them instead of dropping them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from statestore.changelog import ChangelogWriter
from statestore.record_size import truncated_payload
from streams.metrics import Metrics
from streams.task import MAX_ERROR_CHARS, RecordError, StreamTask

log = logging.getLogger(__name__)


class RecordCollector:
    def __init__(self, producer: Any, dead_letter_topic: str, metrics: Metrics | None = None,
                 metrics_label: str = "") -> None:
        self.producer = producer
        self._metrics = metrics
        self._label = metrics_label
        self.changelog = ChangelogWriter(producer)
        self._dead_letter_topic = dead_letter_topic
        self._output_futures: list[asyncio.Future[Any]] = []
        self.dead_lettered = 0

    async def ship(self, tasks: Iterable[StreamTask]) -> None:
        """Hand every queued output and changelog record of ``tasks`` to the producer, with
        each task's input position written into its stores first."""
        for task in tasks:
            task.record_input_position()
            outputs = task.take_outputs()
            handed = 0
            try:
                for output in outputs:
                    future = await self.producer.send(
                        output.topic, value=output.value, key=output.key,
                        timestamp_ms=output.timestamp_ms,
                    )
                    self._output_futures.append(future)
                    handed += 1
            finally:
                task.context.outputs[:0] = outputs[handed:]
            await self.changelog.send_pending(task.stores.values())

    async def send_changelogs(self, tasks: Iterable[StreamTask]) -> None:
        for task in tasks:
            await self.changelog.send_pending(task.stores.values())

    async def dead_letter(self, error: RecordError, task_id: str = "") -> None:
        record = error.record
        log.warning("%s; sent to %s", str(error)[:MAX_ERROR_CHARS], self._dead_letter_topic)
        key, value, cut = truncated_payload(record.key, record.value)
        future = await self.producer.send(
            self._dead_letter_topic, value=value, key=key,
            headers=error.dead_letter_headers() + cut,
        )
        self._output_futures.append(future)
        self.dead_lettered += 1
        if self._metrics is not None:
            self._metrics.record_dead_letters(self._label, task_id)

    async def wait_acknowledged(self) -> None:
        """Every output, dead letter and changelog record sent so far is acknowledged (the
        stores' changelog positions move on); raises the first send error."""
        futures, self._output_futures = self._output_futures, []
        if futures:
            await asyncio.gather(*futures)
        await self.changelog.wait_acknowledged()

    async def close(self) -> None:
        """Nothing of its own to close: the thread stops the shared producer."""
