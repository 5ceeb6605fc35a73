"""Changelog fetching: FetchRequests sent straight through an aiokafka client, record batches
decoded into ``(key, value)`` pairs.

aiokafka's consumer builds a ``ConsumerRecord`` object per record, which costs more than
writing the record to RocksDB; restoration needs only keys, values and where the next fetch
starts. This module reads the same wire format with aiokafka's own (C-accelerated) record
batch readers and leaves everything per record to the caller's single pass.

It does what the consumer's fetcher did for the reader: one request per partition leader,
``read_committed`` (control batches and aborted transactions are skipped; aborts are also
read from the markers in the data, for brokers whose responses list none), records before the
fetch offset in the first batch skipped, retriable errors (leader moved, connection lost)
answered with a metadata refresh before the partition is fetched again, an out-of-range
position reset to the earliest offset. An empty fetch waits ``max_wait_ms`` at the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiokafka.errors as kafka_errors
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.record.control_record import ABORT_MARKER, ControlRecord
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from statestore.errors import StateStoreError

log = logging.getLogger(__name__)

#: A record's key and value as fetched (either may be None: validation says if it may).
FetchedRecord = tuple[bytes | None, bytes | None]

READ_UNCOMMITTED = 0
READ_COMMITTED = 1
_EARLIEST = -2
_LATEST = -1


@dataclass
class FetchedPartition:
    """What one fetch returned for one partition."""

    tp: TopicPartition
    #: The offset the fetch asked for: records before it (in the first batch) are left out.
    fetch_offset: int
    #: Where the next fetch of this partition starts.
    next_offset: int
    #: The end a reader can reach: the last stable offset (the high watermark when no
    #: transaction is open). None when the response did not say (an offset reset).
    end: int | None
    #: The data records from ``fetch_offset`` on, in offset order.
    changes: list[FetchedRecord] = field(default_factory=list)
    #: Bytes of record batches received.
    size: int = 0
    #: The record batches as received and the (producer id, first offset) of the aborted
    #: transactions they overlap: kept to find a record's offset when it is reported.
    raw: bytes = b""
    aborted_transactions: list[tuple[int, int]] = field(default_factory=list)
    #: The fetch asked for an offset past the partition's end: whoever read up to it read
    #: another log (a replaced broker, a topic deleted and created again).
    past_end: bool = False

    def offset_of(self, index: int) -> int:
        """The offset of ``changes[index]``, found by decoding again (for error messages)."""
        position = 0
        for batch, is_data in _walk_batches(self.raw, self.aborted_transactions):
            if is_data is None:
                break
            if not is_data:
                continue
            for record in batch:
                if record.offset < self.fetch_offset:
                    continue
                if position == index:
                    return int(record.offset)
                position += 1
        raise IndexError(f"no record {index} in the fetch of {self.tp} at {self.fetch_offset}")


def decode_records(
    tp: TopicPartition,
    raw: bytes,
    fetch_offset: int,
    aborted_transactions: list[tuple[int, int]] | None = None,
) -> tuple[list[FetchedRecord], int]:
    """The data records of ``raw`` from ``fetch_offset`` on, and the offset after the last
    complete batch (``fetch_offset`` when there is none). A transactional batch whose outcome
    the response does not show yet ends the fetch before it: the next fetch starts there."""
    changes, next_offset, _ = _decode(tp, raw, fetch_offset, aborted_transactions)
    return changes, next_offset


def _decode(
    tp: TopicPartition,
    raw: bytes,
    fetch_offset: int,
    aborted_transactions: list[tuple[int, int]] | None = None,
) -> tuple[list[FetchedRecord], int, bool]:
    """:func:`decode_records`, and whether an undecided transaction ended the records."""
    changes: list[FetchedRecord] = []
    next_offset = fetch_offset
    for batch, is_data in _walk_batches(raw, aborted_transactions or []):
        if is_data is None:
            return changes, max(fetch_offset, _base_offset(batch)), True
        # The batch header says where it ends, whatever the records inside (compaction may
        # have removed the last ones): the next fetch starts there.
        batch_end = batch.next_offset
        if is_data and batch_end > fetch_offset:
            if _base_offset(batch) >= fetch_offset:
                changes += [(record.key, record.value) for record in batch]
            else:  # a fetch from the middle of a batch gets the whole batch
                changes += [(r.key, r.value) for r in batch if r.offset >= fetch_offset]
        next_offset = max(next_offset, batch_end)
    # Bytes but not one complete batch: the batch at the position is larger than the fetch
    # could hold; the fetcher fetches the partition again with room for it.
    return changes, next_offset, False


def _walk_batches(
    raw: bytes, aborted_transactions: list[tuple[int, int]]
) -> Iterator[tuple[Any, bool | None]]:
    return walk_batches(complete_batches(raw), aborted_transactions)


def walk_batches(
    batches: list[Any], aborted_transactions: list[tuple[int, int]]
) -> Iterator[tuple[Any, bool | None]]:
    """Every batch of ``batches`` (complete, in offset order) with whether its records are
    data to apply: control batches and batches of aborted transactions are not
    (``read_committed``); None for a transactional batch whose commit or abort marker is not
    among them (the walk ends there).

    Aborted transactions are known from the response's list and, since some brokers leave
    that list empty (Tansu 0.6), from the abort markers in the data itself: below the last
    stable offset every transaction is decided, so each transactional batch is followed by
    its producer's marker, in this response or a later one."""
    aborted_by_marker, abort_markers, undecided = _outcomes_from_markers(batches)
    # (producer id, first offset) of each aborted transaction the response overlaps.
    pending_aborts = sorted(aborted_transactions, key=lambda abort: abort[1])
    aborting: set[int] = set()
    for index, batch in enumerate(batches):
        if index == undecided:
            yield batch, None
            return
        while pending_aborts and pending_aborts[0][1] <= _base_offset(batch):
            aborting.add(pending_aborts.pop(0)[0])
        if batch.is_control_batch:
            if batch.producer_id in aborting and index in abort_markers:
                aborting.discard(batch.producer_id)
            yield batch, False
        elif batch.is_transactional and (batch.producer_id in aborting
                                         or index in aborted_by_marker):
            yield batch, False
        else:
            yield batch, True


def complete_batches(raw: bytes) -> list[Any]:
    records = MemoryRecords(raw)
    batches = []
    while records.has_next():
        batch = records.next_batch()
        if batch is None:
            break
        batches.append(batch)
    return batches


def _outcomes_from_markers(batches: list[Any]) -> tuple[set[int], set[int], int | None]:
    """The indexes of transactional data batches that an abort marker of their producer
    follows (or a marker of a later epoch of it), the indexes of the abort markers, and the
    index of the first transactional batch no marker follows (None: every one is decided).
    A batch's records can be read once only, so each marker is read here and nowhere else.

    A marker decides its producer's open batches of its own epoch; batches of an earlier
    epoch belong to a fenced producer (a zombie: the new owner of its transactional id bumped
    the epoch) and never commit, as in Kafka. Any such batch that got in after the fencing
    would otherwise seem committed by the new owner's commit marker (same producer id)."""
    open_batches: dict[int, list[tuple[int, int]]] = {}
    aborted: set[int] = set()
    abort_markers: set[int] = set()
    for index, batch in enumerate(batches):
        if batch.is_control_batch:
            decided = open_batches.pop(batch.producer_id, [])
            abort = _is_abort_marker(batch)
            if abort:
                abort_markers.add(index)
            epoch = _epoch(batch)
            aborted.update(i for i, e in decided if abort or e < epoch)
        elif batch.is_transactional:
            open_batches.setdefault(batch.producer_id, []).append((index, _epoch(batch)))
    undecided = min((i for opened in open_batches.values() for i, _ in opened), default=None)
    return aborted, abort_markers, undecided


def _epoch(batch: Any) -> int:
    return int(getattr(batch, "producer_epoch", -1))


def _base_offset(batch: Any) -> int:
    # Message format v0 and v1 batches do not carry it (nor transactions): -1 makes a caller
    # look at each record's offset.
    return int(getattr(batch, "base_offset", -1))


def _is_abort_marker(batch: Any) -> bool:
    marker = next(iter(batch), None)
    return marker is not None and ControlRecord.parse(marker.key) == ABORT_MARKER


#: The most a partition's fetch grows to, to hold a record batch or a transaction (up to
#: its marker) larger than ``max_partition_bytes``.
MAX_GROWN_PARTITION_BYTES = 512 * 1024 * 1024


def grown_size(fetched: FetchedPartition, size: int) -> int | None:
    """The fetch size to fetch ``fetched``'s partition with next, when this fetch of it (of
    ``size`` bytes at most) returned bytes but made no progress although more is readable:
    a record batch larger than the size, or a transaction whose commit or abort marker lies
    past it (its batches cannot be applied before it is known whether it committed). None:
    no growth needed (progress, nothing returned, or the readable end reached)."""
    stuck = (fetched.next_offset == fetched.fetch_offset and not fetched.changes
             and fetched.size > 0 and not fetched.past_end
             and (fetched.end is None or fetched.end > fetched.fetch_offset))
    return min(2 * size, MAX_GROWN_PARTITION_BYTES) if stuck else None


@dataclass(frozen=True)
class FetchSettings:
    max_wait_ms: int = 100
    max_bytes: int = 64 * 1024 * 1024
    max_partition_bytes: int = 16 * 1024 * 1024
    retry_backoff_ms: int = 100
    #: How long a fetch round waits for a metadata refresh after a retriable error.
    metadata_wait_ms: int = 2_000
    #: Broker quirk ``stuck-last-stable-offset`` (see streams.quirks.switch): fetch
    #: read_uncommitted up to the high watermark and keep committed transactions only, told
    #: by their markers; the end is where the first undecided transaction starts (what the
    #: last stable offset means), or the high watermark. Tansu 0.6 can hold a partition's
    #: last stable offset behind transactions long committed, and a restore that ended
    #: there restored nothing of them.
    committed_by_markers: bool = False


class ChangelogFetcher:
    """Fetches partitions at given offsets from their leaders."""

    def __init__(
        self, bootstrap_servers: str, client_id: str, settings: FetchSettings | None = None
    ) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._client_id = client_id
        self.settings = settings or FetchSettings()
        self._client: AIOKafkaClient | None = None
        self._topics: set[str] = set()
        #: Partitions fetched with more than ``max_partition_bytes`` for now (see
        #: :func:`grown_size`), until a fetch of them makes progress.
        self._grown: dict[TopicPartition, int] = {}
        self._too_large: set[TopicPartition] = set()

    async def start(self) -> None:
        if self._client is not None:
            return
        client = AIOKafkaClient(
            bootstrap_servers=self._bootstrap_servers,
            client_id=self._client_id,
            retry_backoff_ms=self.settings.retry_backoff_ms,
        )
        await client.bootstrap()
        self._client = client
        if self._topics:
            await self._wait_metadata(client.set_topics(sorted(self._topics)))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    @property
    def client(self) -> AIOKafkaClient:
        if self._client is None:
            raise StateStoreError("the changelog fetcher is not started")
        return self._client

    def track(self, topic: str) -> None:
        """Keep metadata (partition leaders) for ``topic``."""
        if topic not in self._topics:
            self._topics.add(topic)
            if self._client is not None:
                self._client.add_topic(topic)

    async def fetch(
        self, positions: Mapping[TopicPartition, int], sent: asyncio.Event | None = None,
        max_wait_ms: int | None = None,
    ) -> list[FetchedPartition]:
        """Fetch every partition from its position, one request per leader, concurrently.

        Partitions that failed with a retriable error are left out of the result (after a
        metadata refresh): fetching them again retries. ``sent`` is set once the requests
        are on their way (or none will be), so that the caller can work meanwhile.
        ``max_wait_ms``: how long the broker may hold a fetch that finds nothing (default:
        the settings').
        """
        try:
            client = self.client
            by_leader: dict[int, list[tuple[TopicPartition, int]]] = defaultdict(list)
            leaderless = False
            for tp, offset in positions.items():
                leader = client.cluster.leader_for_partition(tp)
                if leader is None or leader == -1:
                    leaderless = True
                else:
                    by_leader[leader].append((tp, offset))
            if not by_leader:
                if sent is not None:
                    sent.set()
                if leaderless:
                    await self._wait_metadata(client.force_metadata_update())
                    # A refresh may answer at once with still no leader: do not spin.
                    await asyncio.sleep(self.settings.retry_backoff_ms / 1000)
                return []
            unsent = len(by_leader)

            def one_sent() -> None:
                nonlocal unsent
                unsent -= 1
                if unsent == 0 and sent is not None:
                    sent.set()

            wait_ms = self.settings.max_wait_ms if max_wait_ms is None else max_wait_ms
            rounds = await asyncio.gather(
                *(self._fetch_from(leader, wanted, one_sent, wait_ms)
                  for leader, wanted in by_leader.items())
            )
            if leaderless:
                client.force_metadata_update()
            return [fetched for round_ in rounds for fetched in round_]
        finally:
            if sent is not None:
                sent.set()

    async def _fetch_from(
        self,
        leader: int,
        wanted: list[tuple[TopicPartition, int]],
        on_sending: Callable[[], None] = lambda: None,
        max_wait_ms: int | None = None,
    ) -> list[FetchedPartition]:
        settings = self.settings
        if max_wait_ms is None:
            max_wait_ms = settings.max_wait_ms
        by_topic: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        sizes = {tp: self._grown.get(tp, settings.max_partition_bytes) for tp, _ in wanted}
        for tp, offset in wanted:
            by_topic[tp.topic].append((tp.partition, offset, sizes[tp]))
        isolation = READ_UNCOMMITTED if settings.committed_by_markers else READ_COMMITTED
        request = FetchRequest(
            max_wait_ms, 1, max(settings.max_bytes, *sizes.values()), isolation,
            list(by_topic.items())
        )
        try:
            # Connected first, send() writes the request before it first waits: whoever
            # waits for on_sending resumes with the request on its way.
            await self.client.ready(leader)
            on_sending()
            response = await self.client.send(leader, request)
        except kafka_errors.KafkaError as exc:
            log.warning("changelog fetch from node %s failed (%r); retrying", leader, exc)
            await self._wait_metadata(self.client.force_metadata_update())
            await asyncio.sleep(settings.retry_backoff_ms / 1000)
            return []
        asked = dict(wanted)
        fetched: list[FetchedPartition] = []
        refresh = False
        for topic, partitions in response.topics:
            for partition, error_code, highwater, *rest in partitions:
                tp = TopicPartition(topic, partition)
                offset = asked[tp]
                error = kafka_errors.for_code(error_code)
                if error is kafka_errors.NoError:
                    fetched.append(decoded_partition(
                        tp, offset, highwater, rest, response.API_VERSION,
                        settings.committed_by_markers))
                    self._size_next(fetched[-1], sizes[tp])
                elif error is kafka_errors.OffsetOutOfRangeError:
                    fetched.append(await self._reset_to_earliest(leader, tp, offset))
                elif error.retriable:
                    log.info("changelog fetch of %s: %s; refreshing metadata", tp, error.__name__)
                    refresh = True
                else:
                    raise StateStoreError(
                        f"fetching changelog {topic}[{partition}]@{offset} failed: "
                        f"{error.__name__}"
                    )
        if refresh:
            await self._wait_metadata(self.client.force_metadata_update())
        return fetched

    def _size_next(self, fetched: FetchedPartition, size: int) -> None:
        """Grow the partition's next fetch when this one made no progress for its size;
        back to the setting once one makes progress."""
        tp = fetched.tp
        grown = grown_size(fetched, size)
        if grown is None:
            if fetched.next_offset != fetched.fetch_offset:
                self._grown.pop(tp, None)
                self._too_large.discard(tp)
            return
        if grown == size:
            if tp not in self._too_large:
                self._too_large.add(tp)
                log.warning("%s[%d]@%d: a record batch or transaction there is larger than "
                            "%d MiB, the most a fetch takes; it cannot be read", tp.topic,
                            tp.partition, fetched.fetch_offset, size >> 20)
            return
        log.info("%s[%d]@%d: a record batch or transaction larger than %d MiB; fetching it "
                 "with %d MiB", tp.topic, tp.partition, fetched.fetch_offset, size >> 20,
                 grown >> 20)
        self._grown[tp] = grown

    async def _reset_to_earliest(
        self, leader: int, tp: TopicPartition, offset: int
    ) -> FetchedPartition:
        """The position is outside the log: carry on from its start, as a consumer with
        ``auto_offset_reset="earliest"`` would."""
        earliest = await self.earliest_offset(tp, leader)
        if offset > earliest:
            # Out of range yet not before the start: past the end.
            return FetchedPartition(tp, offset, earliest, None, past_end=True)
        log.warning(
            "changelog %s[%d]: offset %d is out of range; continuing from the earliest "
            "offset %d", tp.topic, tp.partition, offset, earliest,
        )
        return FetchedPartition(tp, offset, earliest, None)

    async def earliest_offset(self, tp: TopicPartition, leader: int | None = None) -> int:
        """The partition's log start offset (ListOffsets "earliest", asked of its leader)."""
        return await self._list_offset(tp, _EARLIEST, "earliest", leader)

    async def latest_offset(self, tp: TopicPartition) -> int:
        """What the leader answers ListOffsets "latest" with. On Tansu that is short of the
        end (the last batch's base offset + 1): use it as a hint, never as the end."""
        return await self._list_offset(tp, _LATEST, "latest")

    async def _list_offset(self, tp: TopicPartition, which: int, name: str,
                           leader: int | None = None) -> int:
        client = self.client
        if leader is None:
            leader = client.cluster.leader_for_partition(tp)
            if leader is None or leader == -1:
                await self._wait_metadata(client.force_metadata_update())
                leader = client.cluster.leader_for_partition(tp)
        if leader is None or leader == -1:
            raise StateStoreError(f"no leader known for {tp.topic}[{tp.partition}]")
        isolation = READ_UNCOMMITTED if which == _LATEST else READ_COMMITTED
        request = OffsetRequest(-1, isolation, [(tp.topic, [(tp.partition, which)])])
        response = await client.send(leader, request)
        for _topic, partitions in response.topics:
            for _partition, error_code, *info in partitions:
                error = kafka_errors.for_code(error_code)
                if error is not kafka_errors.NoError:
                    raise StateStoreError(
                        f"ListOffsets({name}) for {tp.topic}[{tp.partition}] failed: "
                        f"{error.__name__}"
                    )
                # v0 answers a list of offsets; later versions (timestamp, offset[, epoch]).
                return int(info[0][0] if response.API_VERSION == 0 else info[1])
        raise StateStoreError(f"ListOffsets({name}) did not answer {tp.topic}[{tp.partition}]")

    async def _wait_metadata(self, refresh: asyncio.Future[Any]) -> None:
        # A refresh that takes long is not an error here: the next fetch round tries again.
        with contextlib.suppress(asyncio.TimeoutError, kafka_errors.KafkaError):
            await asyncio.wait_for(refresh, self.settings.metadata_wait_ms / 1000)


def decoded_partition(
    tp: TopicPartition, offset: int, highwater: int, rest: list[Any], api_version: int,
    committed_by_markers: bool = False,
) -> FetchedPartition:
    # The partition data after the high watermark: v4 (lso, aborted, records), v5 to v10
    # (lso, log start, aborted, records), v11 (lso, log start, aborted, preferred replica,
    # records), v0 to v3 (records).
    raw = rest[-1] or b""
    if api_version >= 11:
        lso, aborted = rest[0], rest[2]
    elif api_version >= 4:
        lso, aborted = rest[0], rest[-2]
    else:
        lso, aborted = -1, None
    aborted = [(int(producer), int(first)) for producer, first in aborted or []]
    changes, next_offset, undecided = _decode(tp, raw, offset, aborted)
    if committed_by_markers:
        # An undecided transaction ends what can be read only when the response reached the
        # high watermark: otherwise its marker may just lie past the fetch's size.
        batches = complete_batches(raw) if undecided else []
        reached = batches[-1].next_offset if batches else offset
        end = next_offset if undecided and reached >= highwater else highwater
    else:
        end = lso if lso is not None and lso >= 0 else highwater
    return FetchedPartition(tp, offset, next_offset, end, changes, len(raw), raw, aborted,
                            past_end=0 <= highwater < offset)
