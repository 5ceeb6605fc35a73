"""Purging repartition topics after commits, as Kafka Streams does.

A repartition topic keeps its records however old they are (``retention.ms=-1``), so that
none is deleted before the task reading it has processed it; left alone, it grows without
bound. Once a task's offset on a repartition partition is committed (with the group at
least once; with the task's transaction exactly once), nothing will read below it again: a
task that moves or restarts starts at its committed offset or later. So after a commit, at
most once per ``repartition_purge_interval_ms``, a thread deletes (DeleteRecords) the
records below the committed offsets of the repartition partitions of the tasks it runs
(Kafka Streams' ``TaskManager.maybePurgeCommittedRecords``).

:func:`purge_due` and :func:`records_to_delete` decide, over plain data;
:class:`RepartitionPurger` carries the decision out after each commit, one request at a time
and in the background, through a :class:`Deleter` (:mod:`streams.kafka.delete_records`). A
failed request is a warning: the records stay, the next interval asks again, and processing
never waits for it. On a broker without DeleteRecords (quirk ``no-delete-records``) no
purger is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from aiokafka.structs import TopicPartition

from streams.runtime.task import StreamTask

log = logging.getLogger(__name__)


class Deleter(Protocol):
    async def delete_before(self, offsets: Mapping[TopicPartition, int],
                            ) -> dict[TopicPartition, int | Exception]: ...

    def close(self) -> None: ...


def purge_due(now_ms: float, last_ms: float, interval_ms: int, in_flight: bool) -> bool:
    """Whether a commit at ``now_ms`` purges: the interval has passed since the last purge
    (0: every commit) and the previous request has been answered."""
    return not in_flight and now_ms - last_ms >= interval_ms


def records_to_delete(committed: Mapping[TopicPartition, int],
                      partitions: Iterable[TopicPartition],
                      purged: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Per repartition partition of a running task (``partitions``): the offset below which
    its records go, its committed offset, where that is past what was deleted already."""
    offsets: dict[TopicPartition, int] = {}
    for tp in partitions:
        offset = committed.get(tp)
        if offset is not None and offset > purged.get(tp, 0):
            offsets[tp] = offset
    return offsets


def repartition_inputs(tasks: Iterable[StreamTask]) -> list[TopicPartition]:
    """The partitions of repartition topics that ``tasks`` read."""
    return [tp for task in tasks for tp in task.partitions
            if tp.topic in task.sub.repartition_sources]


class RepartitionPurger:
    """Deletes what a thread's running tasks have committed on their repartition topics, at
    most once per ``interval_ms``, after a commit (:meth:`after_commit`)."""

    def __init__(self, deleter: Deleter, interval_ms: int, name: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._deleter = deleter
        self.interval_ms = interval_ms
        self._name = name
        self._clock = clock
        # As in Kafka Streams, the first purge waits an interval from the start.
        self._last_ms = clock() * 1000
        self._request: asyncio.Task[None] | None = None
        #: Per partition, its log start offset as the last answer said.
        self.purged: dict[TopicPartition, int] = {}
        #: DeleteRecords requests answered, and those that failed in part or in full.
        self.requests = 0
        self.failures = 0

    @property
    def in_flight(self) -> bool:
        return self._request is not None and not self._request.done()

    def after_commit(self, tasks: Iterable[StreamTask],
                     committed: Mapping[TopicPartition, int]) -> None:
        """Called after each commit with the running tasks and the offsets committed: sends
        a DeleteRecords in the background when one is due."""
        now_ms = self._clock() * 1000
        if not purge_due(now_ms, self._last_ms, self.interval_ms, self.in_flight):
            return
        self._last_ms = now_ms
        offsets = records_to_delete(committed, repartition_inputs(tasks), self.purged)
        if offsets:
            self._request = asyncio.get_running_loop().create_task(
                self._delete(offsets), name=f"purge-{self._name}")

    async def _delete(self, offsets: dict[TopicPartition, int]) -> None:
        try:
            answers = await self._deleter.delete_before(offsets)
        except Exception as exc:
            self.failures += 1
            log.warning("%s: deleting committed records of repartition topics failed, they "
                        "stay until the next purge: %s: %s", self._name, type(exc).__name__,
                        exc)
            return
        self.requests += 1
        failed = {tp: a for tp, a in answers.items() if isinstance(a, Exception)}
        for tp, answer in answers.items():
            if not isinstance(answer, Exception):
                self.purged[tp] = max(answer, self.purged.get(tp, 0))
        if failed:
            self.failures += 1
            log.warning("%s: deleting committed records failed for %s; they stay until the "
                        "next purge", self._name,
                        ", ".join(f"{tp.topic}[{tp.partition}] ({type(a).__name__}: {a})"
                                  for tp, a in sorted(failed.items())))
        log.debug("%s: purged repartition partitions up to %s", self._name, self.purged)

    async def close(self) -> None:
        """Cancel a request under way (the next owner of the tasks purges them) and close
        the deleter."""
        request, self._request = self._request, None
        if request is not None and not request.done():
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await request
        self._deleter.close()
