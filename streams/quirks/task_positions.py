"""Where each exactly-once task's input stands, kept in an internal topic beside the group.

Broker quirk ``deferred-transactional-offsets`` (see :mod:`streams.quirks.switch`): Tansu 0.6
applies the input offsets of a committed transaction to the group only once no transaction
that wrote the same partitions is still open. Tasks that all write one repartition topic or
one sink keep overlapping transactions open, so their offsets can stay unapplied for as long
as the input flows, and a task that moves (a crash, a rebalance) then reads its input again
from an old offset or from the beginning. With state, the position kept in the stores covers
this; a stateless task has none.

So each task's transaction also writes its input offsets to ``<application_id>-positions``,
one partition per task, where only that task's transactional producer writes. A commit marker
decides them with the outputs they belong to. A task that starts reads its partition's last
committed record per input partition (by markers, as the changelogs are read) and starts from
the later of that and the group's committed offset.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from statestore.errors import StateStoreError
from statestore.fetch import ChangelogFetcher

log = logging.getLogger(__name__)

#: How far back from a positions partition's end the first read starts. Every transaction
#: with input offsets writes one record per input partition and one marker, so the last
#: committed record of each lies within a few offsets of the end unless the last
#: transactions aborted; if one is missing there, the whole partition is read.
TAIL_OFFSETS = 256
#: How long a task keeps trying to read its positions before its thread fails.
READ_TIMEOUT_S = 60.0
RETRY_BACKOFF_S = 0.5
UNANSWERED_FETCHES = 10


def positions_topic_name(application_id: str) -> str:
    return f"{application_id}-positions"


def encode_position(tp: TopicPartition, offset: int) -> tuple[bytes, bytes]:
    """The record (key, value) saying that ``tp`` is processed up to ``offset``."""
    return f"{tp.topic}:{tp.partition}".encode(), str(offset).encode()


def decode_position(key: bytes | None, value: bytes | None) -> tuple[TopicPartition, int] | None:
    """The partition and offset a positions record holds; None for a record that is not one
    (it is skipped with a warning: a position read wrong must never move a task)."""
    try:
        topic, _, partition = (key or b"").decode().rpartition(":")
        if not topic or value is None:
            raise ValueError("no topic or no value")
        return TopicPartition(topic, int(partition)), int(value.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        log.warning("positions topic: skipped a record that is not a position (%r: %r): %s",
                    key, value, exc)
        return None


@dataclass(frozen=True)
class TaskPositions:
    """The positions topic and which of its partitions each task writes."""

    topic: str
    #: Each task's partition: its index among the app's tasks (the topic has one partition
    #: per task).
    partitions: Mapping[str, int]

    @classmethod
    def of(cls, application_id: str, task_ids: Iterable[str]) -> TaskPositions:
        return cls(positions_topic_name(application_id),
                   {task_id: i for i, task_id in enumerate(task_ids)})

    def partition_of(self, task_id: str) -> int:
        return self.partitions[task_id]

    def records(self, offsets: Mapping[TopicPartition, int]) -> list[tuple[bytes, bytes]]:
        return [encode_position(tp, offset) for tp, offset in sorted(offsets.items())]


class PositionReader:
    """Reads a task's last committed input positions from the positions topic."""

    def __init__(self, positions: TaskPositions, fetcher: ChangelogFetcher) -> None:
        """``fetcher`` reads committed records only (read_committed, or by markers)."""
        self.positions = positions
        self._fetcher = fetcher
        fetcher.track(positions.topic)

    async def latest(self, task_id: str,
                     wanted: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The last committed position of each ``wanted`` partition the task recorded.

        Called once the task's transactional producer has fenced its earlier owners: none of
        their transactions is open on the partition, so the read reaches its end."""
        tp = TopicPartition(self.positions.topic, self.positions.partition_of(task_id))
        want = set(wanted)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            try:
                return await self._latest(tp, want)
            except (StateStoreError, KafkaError) as exc:
                if time.monotonic() > deadline:
                    raise StateStoreError(
                        f"task {task_id}: could not read its input positions from "
                        f"{tp.topic}[{tp.partition}] within {READ_TIMEOUT_S:.0f} s: {exc}"
                    ) from exc
                log.warning("task %s: reading its input positions failed (%s); retrying",
                            task_id, exc)
                await asyncio.sleep(RETRY_BACKOFF_S)

    async def _latest(self, tp: TopicPartition,
                      want: set[TopicPartition]) -> dict[TopicPartition, int]:
        earliest = await self._fetcher.earliest_offset(tp)
        # Tansu answers ListOffsets(latest) short of the end (the last batch's base offset
        # + 1): good enough to know where the tail starts.
        start = max(earliest, await self._fetcher.latest_offset(tp) - TAIL_OFFSETS)
        found = await self._read(tp, start, want, stop=None)
        missing = want - found.keys()
        if missing and start > earliest:
            for key, offset in (await self._read(tp, earliest, missing, stop=start)).items():
                found.setdefault(key, offset)
        return found

    async def _read(self, tp: TopicPartition, offset: int, want: set[TopicPartition],
                    stop: int | None) -> dict[TopicPartition, int]:
        """The last committed position of each of ``want`` from ``offset`` to the end (or to
        ``stop``)."""
        found: dict[TopicPartition, int] = {}
        unanswered = 0
        while stop is None or offset < stop:
            fetched = [f for f in await self._fetcher.fetch({tp: offset}) if f.tp == tp]
            if not fetched:
                # A retriable error: the fetcher refreshed its metadata; try again.
                unanswered += 1
                if unanswered >= UNANSWERED_FETCHES:
                    raise StateStoreError(f"{unanswered} fetches at offset {offset} failed")
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            part = fetched[0]
            for key, value in part.changes:
                decoded = decode_position(key, value)
                if decoded is not None and decoded[0] in want:
                    found[decoded[0]] = decoded[1]
            offset = part.next_offset
            if part.end is not None and offset >= part.end:
                break
        return found
