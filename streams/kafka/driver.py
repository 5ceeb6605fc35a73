"""The aiokafka driver: the one place that reads or changes aiokafka's private state.

aiokafka 0.14 has no public API for what a stream thread needs to know about its group:
its member id and generation, whether a rebalance is under way (and since when), whether a
rejoin is already pending, or a way to ask for a rejoin. :class:`GroupConsumer` wraps the
consumer and answers those from the coordinator's internals, next to the consumer calls the
thread makes, so that the rest of the runtime speaks only to this interface (and tests can
hand the thread a fake with the same methods). The cooperative coordinator it installs is in
:mod:`streams.kafka.cooperative`. aiokafka is pinned to 0.14.* while this relies on its internals.

It also installs :class:`ReadCommittedRecords` in aiokafka's fetcher: a ``read_committed``
consumer that finds aborted transactions from their abort markers too. aiokafka skips only
the aborted transactions a fetch response lists, and some brokers (Tansu 0.6) list none, so
the records of aborted transactions reached the next stage of an exactly-once app as if
committed. Reading the markers is correct on every broker, so this has no switch.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.client import AIOKafkaClient, ConnectionGroup
from aiokafka.consumer import fetcher as fetcher_module
from aiokafka.consumer.fetcher import OffsetResetStrategy
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaError,
    RebalanceInProgressError,
    for_code,
)
from aiokafka.protocol.group import HeartbeatRequest
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from statestore.fetch import walk_batches
from streams.config import AppConfig
from streams.kafka import cooperative
from streams.kafka.turns import TurnState, end_turn, newcomers_first, take_turns

log = logging.getLogger(__name__)

#: aiokafka's default fetch size per partition, and the one of read_committed members.
DEFAULT_PARTITION_FETCH_BYTES = 1024 * 1024
READ_COMMITTED_PARTITION_FETCH_BYTES = 16 * 1024 * 1024
#: How long the broker may hold a fetch that finds nothing new (aiokafka's default is 500).
#: The fetcher sends one fetch per broker at a time, so a task that starts running (a moved
#: or restored task, its partitions resumed) gets its first records only once the fetch in
#: flight returns; among idle partitions that is this long, and it sits in every hand-over.
FETCH_MAX_WAIT_MS = 100

#: The most records one fetch call hands the thread while a task starts (its input read
#: ahead, or resumed less than :data:`STARTING_WINDOW_S` ago): a full call's batch of a
#: heavy app took 0.25 s to process, and a task that started meanwhile waited behind it,
#: and behind one more for each task moved with it.
STARTING_BATCH = 200
STARTING_WINDOW_S = 1.0

#: Errors of an offset commit that mean "a rebalance is under way": the next commit carries
#: the offsets.
COMMIT_DEFERRED_ERRORS = (CommitFailedError, RebalanceInProgressError, IllegalStateError,
                          TimeoutError)


class GroupConsumer:
    """A group member's consumer, and what the runtime needs to know about its group."""

    def __init__(self, consumer: AIOKafkaConsumer, committed_by_markers: bool = False,
                 turn_ms: int = 0, clock: Callable[[], float] | None = None,
                 refetch_skipped: bool = False) -> None:
        self._consumer = consumer
        self._committed_by_markers = committed_by_markers
        #: ``skipped-batches``: a fetch that skipped offsets is made again (see
        #: :func:`skipped_batches`); the gaps seen, with when each was first seen.
        self._refetch_skipped = refetch_skipped
        self._gaps: dict[tuple[TopicPartition, int, int], float] = {}
        #: Partitions sought since the positions were read: their records start where the
        #: seek said, not where the position was.
        self._sought: set[TopicPartition] = set()
        self._round_listener: Callable[[int], None] | None = None
        self._rejoin_waiter: Callable[[], Awaitable[None]] | None = None
        # How long a partition number keeps its turn at the fetched records at most
        # (streams.kafka.turns).
        self._turn_s = turn_ms / 1000
        self._clock = clock or time.monotonic
        self._turns = TurnState()
        #: Partitions fetched but not handed out: a restoring task's input read ahead
        #: (:meth:`hold`).
        self._held: set[TopicPartition] = set()
        self._released = asyncio.Event()
        #: When (clock seconds) partitions were last resumed: a task started.
        self._resumed_at: float | None = None

    # -- the consumer's public API ---------------------------------------------------------

    async def start(self) -> None:
        await self._consumer.start()
        if self._committed_by_markers:
            read_committed_by_markers(self._consumer)
        if self._round_listener is not None and self._coordinator is not None:
            self._coordinator.on_round_heard = self._round_listener
        if self._rejoin_waiter is not None and self._coordinator is not None:
            self._coordinator.before_rejoin_after_silence = self._rejoin_waiter

    async def stop(self) -> None:
        await self._consumer.stop()

    def subscribe(self, topics: list[str], listener: ConsumerRebalanceListener) -> None:
        self._consumer.subscribe(topics, listener=listener)

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        """Fetched records, up to ``max_records``, each partition's in offset order. Taken
        in turns across partitions (:mod:`streams.kafka.turns`): aiokafka hands out its
        fetched records partition by partition in the order they were fetched, so a task
        given a partition after a rebalance waited until every partition fetched before it
        was drained (a moved task processed its first record seconds after it started,
        behind the backlogs of the other tasks moved with it)."""
        if self.membership_in_doubt:
            # Held in the fetcher, not dropped: the member may be in the group after all. The
            # group's errors (a fenced member) reach the thread as aiokafka's getmany raises
            # them.
            await asyncio.sleep(timeout_ms / 1000)
            self._coordinator.check_errors()
            return {}
        positions = self._positions() if self._refetch_skipped else None
        self._sought.clear()
        buffered = self._fetch_buffer()
        if buffered is not None:
            # Fetched since the last call: a partition handed nothing yet goes first.
            hand_out_in(buffered, newcomers_first(list(buffered), self._turns))
        if self._starting():
            max_records = min(max_records, STARTING_BATCH)
        if self._held:
            batches = await self._getmany_unheld(timeout_ms, max_records)
        else:
            batches = await self._consumer.getmany(timeout_ms=timeout_ms,
                                                   max_records=max_records)
        held = [tp for tp in batches if tp in self._held]
        if held:
            # Held while the call waited: their task is not running yet. Sought back, they
            # are fetched again for it.
            self.give_back({tp: batches.pop(tp) for tp in held})
        buffered = self._fetch_buffer()
        if buffered is not None:
            assignment = getattr(self._consumer, "assignment", None)
            order, self._turns = take_turns(
                list(buffered), list(batches), self._turns, self._clock(), self._turn_s,
                assignment() if assignment is not None else None)
            hand_out_in(buffered, order)
        if positions is not None and batches:
            self._refetch_skipped_batches(batches, positions)
        return batches

    def _positions(self) -> dict[TopicPartition, int]:
        """aiokafka's position of each assigned partition (its subscription's private
        state): the offset of the next record it hands out."""
        subscription = getattr(getattr(self._consumer, "_subscription", None),
                               "subscription", None)
        assignment = getattr(subscription, "assignment", None)
        if assignment is None:
            return {}
        positions: dict[TopicPartition, int] = {}
        for tp in assignment.tps:
            state = assignment.state_value(tp)
            if state is not None and state.has_valid_position:
                positions[tp] = state.position
        return positions

    def _refetch_skipped_batches(self, batches: dict[TopicPartition, list[Any]],
                                 positions: dict[TopicPartition, int]) -> None:
        """The ``skipped-batches`` quirk: where a partition's records jump past the next
        offset (at their start, from its position, or between two batches of one fetch),
        the records from the jump on are not handed out and the partition is sought back to
        the missing offset, until the gap has stood :data:`GAP_SETTLE_S` (then it is one
        Kafka has too: a transaction's marker)."""
        now = self._clock()
        for tp in list(batches):
            records = batches[tp]
            expected = positions.get(tp)
            if not records or expected is None or tp in self._sought:
                continue
            for index, record in enumerate(records):
                offset = record.offset
                if offset != expected:
                    key = (tp, expected, offset)
                    decision = skipped_batches(expected, offset, self._gaps.get(key), now)
                    if decision is GapDecision.ACCEPT:
                        del self._gaps[key]
                        log.info("%s: offsets %d to %d stayed missing for %.1fs: taken as "
                                 "a gap of the log", tp, expected, offset - 1, GAP_SETTLE_S)
                    elif decision is GapDecision.REFETCH:
                        if key not in self._gaps:
                            self._gaps[key] = now
                            log.info("%s: fetched records jump from offset %d to %d: "
                                     "fetched again (skipped-batches)", tp, expected, offset)
                        if index:
                            batches[tp] = records[:index]
                        else:
                            del batches[tp]
                        self._consumer.seek(tp, expected)
                        break
                expected = offset + 1
        if len(self._gaps) > 1_000:  # gaps seen once and filled: forget the oldest
            for key in sorted(self._gaps, key=self._gaps.__getitem__)[:500]:
                del self._gaps[key]

    async def _getmany_unheld(self, timeout_ms: int, max_records: int,
                              ) -> dict[TopicPartition, list[Any]]:
        """aiokafka's getmany for the partitions not held. A release ends the wait early
        (with nothing): the caller calls again, and the released partitions' records, read
        ahead, are handed out at once."""
        self._released.clear()
        allowed = [tp for tp in self._consumer.assignment() if tp not in self._held]
        if not allowed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), timeout_ms / 1000)
            return {}
        fetch = asyncio.ensure_future(
            self._consumer.getmany(*allowed, timeout_ms=timeout_ms, max_records=max_records))
        released = asyncio.ensure_future(self._released.wait())
        try:
            await asyncio.wait({fetch, released}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            released.cancel()
            if not fetch.done():
                fetch.cancel()
        try:
            return await fetch
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return {}  # released meanwhile: aiokafka drains nothing before it waits

    def _starting(self) -> bool:
        """Whether a task is about to get its first records: its input is read ahead, or
        its partitions were resumed a moment ago."""
        if self._held:
            return True
        return (self._resumed_at is not None
                and self._clock() - self._resumed_at < STARTING_WINDOW_S)

    def hold(self, *tps: TopicPartition) -> None:
        """Fetch these partitions but hand out none of their records until :meth:`release`:
        a restoring task's input is read ahead (from the offsets it will start at), so that
        its first records are at hand when it starts instead of one fetch later."""
        self._held.update(tps)

    def release(self, *tps: TopicPartition) -> None:
        """Hand out these partitions' records again (a getmany waiting meanwhile returns)."""
        if self._held.intersection(tps):
            self._held.difference_update(tps)
            self._released.set()

    def _fetch_buffer(self) -> dict[TopicPartition, Any] | None:
        """aiokafka's fetched records not handed out yet, per partition in hand-out order."""
        buffered = getattr(getattr(self._consumer, "_fetcher", None), "_records", None)
        return buffered if isinstance(buffered, dict) else None

    def give_back(self, batches: dict[TopicPartition, list[Any]]) -> None:
        """Records handed out but not processed go back: each partition's position returns
        to its first one, so the next fetch reads them again (a member whose membership
        came in doubt after the fetch: if it stays a member, it processes them then)."""
        assigned = self._consumer.assignment()
        for tp, records in batches.items():
            if records and tp in assigned:
                self.seek(tp, records[0].offset)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._sought.add(tp)
        self._consumer.seek(tp, offset)

    async def seek_to_beginning(self, tp: TopicPartition) -> None:
        """Move ``tp`` to its earliest offset. The reset is requested, not waited for: the
        fetcher does not fetch the partition before it has resolved the position, and
        waiting (up to a fetch's max wait, 0.5 s) would hold the thread's processing of its
        other tasks meanwhile."""
        self._sought.add(tp)
        fetcher = getattr(self._consumer, "_fetcher", None)
        if fetcher is None or tp not in self._consumer.assignment():
            await self._consumer.seek_to_beginning(tp)  # raises for a partition not assigned
            return
        resolved = fetcher.request_offset_reset([tp], OffsetResetStrategy.EARLIEST)
        resolved.add_done_callback(_retrieve_outcome)

    def pause(self, *tps: TopicPartition) -> None:
        self._consumer.pause(*tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._consumer.resume(*tps)
        if tps:
            self._resumed_at = self._clock()

    def assignment(self) -> set[TopicPartition]:
        return set(self._consumer.assignment())

    def highwater(self, tp: TopicPartition) -> int | None:
        """The partition's high watermark from the last fetch (None before one): its end.
        ListOffsets latest is not trusted for that (see the broker notes)."""
        if tp not in self._consumer.assignment():
            return None  # aiokafka asserts the partition is assigned
        return self._consumer.highwater(tp)

    def lagging(self, tp: TopicPartition) -> bool:
        """Whether the broker holds more of ``tp`` than the consumer has handed out: its
        position is before the partition's end from the last fetch (the last stable offset
        for a ``read_committed`` reader), no fetch has told the end yet, or its position is
        still being looked up (a task with nothing committed asks for the earliest offset
        without waiting: :meth:`seek_to_beginning`). Unassigned or paused partitions do not
        lag."""
        subscription = self._consumer._subscription  # aiokafka's private state, read only
        if not subscription.is_assigned(tp) or tp in self._consumer.paused():
            return False
        state = subscription.subscription.assignment.state_value(tp)
        if state is None:
            return False
        if not state.has_valid_position:
            # A table partition looking up its earliest offset while its stream partition
            # already has records: the stream waits, or it joins rows not read yet.
            return True
        end = state.highwater
        if self._consumer._isolation_level == "read_committed" and state.lso is not None:
            end = state.lso
        return end is None or state.position < end

    async def committed(self, tp: TopicPartition) -> int | None:
        return await self._consumer.committed(tp)

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        await self._consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in offsets.items()})
        # A turn ends with the commit interval it ran in, so that the next interval's
        # records come from the next partition number, and a store ships its keys once a turn.
        buffered = self._fetch_buffer()
        if buffered is not None:
            order, self._turns = end_turn(list(buffered), self._turns)
            hand_out_in(buffered, order)

    # -- the group, from the coordinator's internals ----------------------------------------

    @property
    def _coordinator(self) -> Any:
        return getattr(self._consumer, "_coordinator", None)

    @property
    def member_id(self) -> str:
        return str(getattr(self._coordinator, "member_id", "") or "")

    @property
    def generation(self) -> int:
        return int(getattr(self._coordinator, "generation", -1))

    @property
    def membership_in_doubt(self) -> bool:
        """The member holds partitions that may have a new owner (see the cooperative
        coordinator): :meth:`getmany` hands out nothing until the broker tells."""
        check = getattr(self._coordinator, "membership_in_doubt", None)
        return bool(check()) if check is not None else False

    @property
    def rebalancing(self) -> bool:
        """Between join-prepare and join-complete (see the cooperative coordinator)."""
        return bool(getattr(self._coordinator, "rebalancing", False))

    def rebalancing_for_s(self, now: float | None = None) -> float:
        """How long the member has been joining the current round (0 when it is not)."""
        since = getattr(self._coordinator, "rebalancing_since", None)
        if not self.rebalancing or since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - since

    def coordinator_known_since(self) -> float | None:
        """Since when (monotonic seconds) the group has had the coordinator it has now; None
        while it has none (the last one was marked dead)."""
        return getattr(self._coordinator, "coordinator_known_since", None)

    def coordinator_found_at(self) -> float | None:
        """When (monotonic seconds) the group's coordinator was last found on another node
        (None: never found); marking it dead and finding it on the same node does not count."""
        return getattr(self._coordinator, "coordinator_found_at", None)

    def coordinator_lost_at(self) -> float | None:
        """When (monotonic seconds) the group's coordinator was last marked dead (None:
        never)."""
        return getattr(self._coordinator, "coordinator_lost_at", None)

    @property
    def round_started(self) -> float | None:
        """When (monotonic seconds) the member entered its latest round, if it did."""
        return getattr(self._coordinator, "round_started", None)

    @property
    def rejoin_pending(self) -> bool:
        """A rejoin was asked for and has not started yet."""
        coordinator = self._coordinator
        future = getattr(coordinator, "_rejoin_needed_fut", None)
        return bool(future is not None and future.done())

    def request_rejoin(self) -> None:
        coordinator = self._coordinator
        if coordinator is not None:
            coordinator.request_rejoin()

    def abandon_sync(self, generation: int, reason: str) -> bool:
        """Give up the SyncGroup of ``generation`` the member waits for the answer of, and
        join the round after it (see the cooperative coordinator); whether it did."""
        abandon = getattr(self._coordinator, "abandon_sync", None)
        return bool(abandon(generation, reason)) if abandon is not None else False

    def pending_sync_leader(self) -> tuple[int, str] | None:
        """``(generation, leader's member id)`` while the member, a follower, waits for its
        SyncGroup answer (see the cooperative coordinator); None otherwise."""
        pending = getattr(self._coordinator, "pending_sync_leader", None)
        return pending() if pending is not None else None

    def before_rejoin_after_silence(self, wait: Callable[[], Awaitable[None]]) -> None:
        """Await ``wait`` before the member joins again once its membership ended by its own
        silence (see the cooperative coordinator)."""
        self._rejoin_waiter = wait
        coordinator = self._coordinator
        if coordinator is not None:
            coordinator.before_rejoin_after_silence = wait

    def on_round_heard(self, listener: Callable[[int], None]) -> None:
        """Call ``listener`` with the member's generation whenever a heartbeat says its group
        has begun a round (streams.group.round_alarm)."""
        self._round_listener = listener
        coordinator = self._coordinator
        if coordinator is not None:
            coordinator.on_round_heard = listener

    async def heartbeat(self) -> str | None:
        """Send one Heartbeat of this member's own and return the broker's error, named by
        aiokafka's error class (``RebalanceInProgressError``); None when answered without
        error, "NOT_A_MEMBER" when the member has no member id.

        Broker quirk (Tansu 0.6, the leader wedge): in a forming group LeaveGroup removes the
        member but keeps it as the group's leader, so a leader leaving mid-round wedges the
        group. A member about to leave asks with this heartbeat whether the group is formed
        (see :mod:`streams.quirks.formed_group`). On Apache Kafka it is one extra heartbeat.
        """
        coordinator = self._coordinator
        if coordinator is None or not self.member_id:
            return "NOT_A_MEMBER"
        node = getattr(coordinator, "coordinator_id", None)
        if node is None:
            return "COORDINATOR_UNKNOWN"
        request = HeartbeatRequest(coordinator.group_id, self.generation, self.member_id)
        try:
            response = await self._consumer._client.send(
                node, request, group=ConnectionGroup.COORDINATION)
        except (KafkaError, OSError, TimeoutError) as exc:
            return type(exc).__name__
        if not response.error_code:
            return None
        return str(for_code(response.error_code).__name__)


class _MarkerIsolation(int):
    """An isolation level that fetches read_uncommitted (its value, 0, goes on the wire) and
    that :class:`ReadCommittedRecords` reads as read_committed by markers."""


#: Committed records only, told by their markers, from fetches up to the high watermark.
COMMITTED_BY_MARKERS = _MarkerIsolation(fetcher_module.READ_UNCOMMITTED)


def read_committed_by_markers(consumer: AIOKafkaConsumer) -> None:
    """Make a started consumer read committed records by their markers alone.

    Broker quirk (the ``stuck-last-stable-offset`` one, see :mod:`streams.quirks.switch`):
    Tansu 0.6 does not move a partition's last stable offset on while any transaction on
    it is open, so with two or more producers whose transactions overlap (the tasks writing
    a repartition topic or a sink) a read_committed fetch returns nothing until they all
    happen to be closed at once. Fetching read_uncommitted and stopping at the first
    transaction whose marker has not arrived gives what read_committed means: committed
    records, in offset order, never past an open transaction."""
    install_read_committed_records()
    consumer._fetcher._isolation_level = COMMITTED_BY_MARKERS  # type: ignore[attr-defined]


class ReadCommittedRecords(fetcher_module.PartitionRecords):  # type: ignore[misc]
    """One partition's records of a fetch response, ``read_committed`` also by abort markers.

    Below the last stable offset every transaction is decided, so each transactional batch is
    followed by its producer's commit or abort marker: in this response, or, when the response
    ends first, in a later one. A batch whose marker is not in this response ends the records
    before it, and the next fetch starts there. ``read_uncommitted`` is aiokafka's own."""

    def _unpack_records(self) -> Any:
        if (self._isolation_level != fetcher_module.READ_COMMITTED
                and self._isolation_level is not COMMITTED_BY_MARKERS):
            yield from super()._unpack_records()
            return
        tp, records = self._tp, self._records
        batches = []
        while records.has_next():
            batch = records.next_batch()
            if batch is None:
                break
            if self._check_crcs and not batch.validate_crc():
                raise fetcher_module.Errors.CorruptRecordException(f"Invalid CRC - {tp}")
            batches.append(batch)
        for batch, is_data in walk_batches(batches, self._aborted_transactions):
            if is_data is None:
                self.next_fetch_offset = max(self.next_fetch_offset, batch.base_offset)
                if batch is batches[0] and _WAITING_ON.get(tp) != batch.base_offset:
                    # Said once per transaction: the fetch is repeated until its end shows.
                    _WAITING_ON[tp] = batch.base_offset
                    log.debug("%s: waiting for the end of the transaction at offset %d (its "
                             "marker is not in the fetch yet)", tp, batch.base_offset)
                return
            if is_data:
                for record in batch:
                    if record.offset < self.next_fetch_offset:
                        continue  # a fetch from inside a batch gets the whole batch
                    consumer_record = self._consumer_record(tp, record)
                    self.next_fetch_offset = record.offset + 1
                    yield consumer_record
            self.next_fetch_offset = max(self.next_fetch_offset, batch.next_offset)


#: The transaction each partition's read_committed fetch last waited on (for its log line).
_WAITING_ON: dict[Any, int] = {}


def install_read_committed_records() -> None:
    """Make aiokafka's fetcher build :class:`ReadCommittedRecords` (idempotent)."""
    if fetcher_module.PartitionRecords is not ReadCommittedRecords:
        fetcher_module.PartitionRecords = ReadCommittedRecords  # type: ignore[misc]


#: How long a gap in a partition's offsets is fetched again before it is taken as the
#: log's own (``skipped-batches``): Tansu makes a batch appended by another producer
#: readable within milliseconds.
GAP_SETTLE_S = 0.3


class GapDecision(enum.Enum):
    NONE = "no gap"
    REFETCH = "fetch again"
    ACCEPT = "a gap of the log"


def skipped_batches(expected: int, first: int, first_seen: float | None,
                    now: float) -> GapDecision:
    """What to do with fetched records starting at ``first`` where the partition's position
    was ``expected``. On Tansu a fetch at the end of a partition several producers append
    to can return a later batch while an earlier one is not yet readable, and a consumer
    that takes it never reads the earlier one: the gap is fetched again until it has stood
    :data:`GAP_SETTLE_S` since ``first_seen`` (None: not seen before). Apache Kafka leaves
    gaps only where the log has them (compaction, transaction markers)."""
    if first <= expected:
        return GapDecision.NONE
    if first_seen is not None and now - first_seen >= GAP_SETTLE_S:
        return GapDecision.ACCEPT
    return GapDecision.REFETCH


def hand_out_in(buffered: dict[TopicPartition, Any], order: list[TopicPartition]) -> None:
    """Reorder the fetcher's buffer (a dict in hand-out order) to ``order``, in place."""
    if list(buffered) != order:
        for tp in order:
            buffered[tp] = buffered.pop(tp)


def _retrieve_outcome(future: Any) -> None:
    # Nobody waits for the reset; an error of it is the fetcher's to retry, but unretrieved
    # it would be reported as "never retrieved".
    if not future.cancelled():
        future.exception()


def new_group_consumer(
    config: AppConfig, bootstrap_servers: str, static_id: str | None, index: int,
    assignor: AbstractPartitionAssignor, committed_by_markers: bool = False,
    refetch_skipped: bool = False,
) -> GroupConsumer:
    """A consumer in the app's group, with the cooperative coordinator installed.
    ``committed_by_markers``: exactly-once input read by markers (see
    :func:`read_committed_by_markers`). ``refetch_skipped``: gaps in a partition's offsets
    fetched again (:func:`skipped_batches`), at-least-once only: an exactly-once member
    meets a gap at every transaction's marker."""
    cooperative.install()
    install_read_committed_records()
    return GroupConsumer(AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        group_id=config.application_id,
        group_instance_id=static_id,
        client_id=f"{config.application_id}-{static_id or index}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        partition_assignment_strategy=(assignor,),
        session_timeout_ms=config.session_timeout_ms,
        heartbeat_interval_ms=config.heartbeat_interval_ms,
        max_poll_interval_ms=config.max_poll_interval_ms,
        rebalance_timeout_ms=config.max_poll_interval_ms,
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
        # Exactly-once: input written by transactions (repartition topics, upstream apps)
        # counts only once committed.
        isolation_level="read_committed" if config.exactly_once else "read_uncommitted",
        # A transaction's records are delivered once its marker is fetched too (see
        # ReadCommittedRecords): room for a commit interval's worth per partition.
        max_partition_fetch_bytes=(READ_COMMITTED_PARTITION_FETCH_BYTES if config.exactly_once
                                   else DEFAULT_PARTITION_FETCH_BYTES),
    ), committed_by_markers=committed_by_markers and config.exactly_once,
        turn_ms=config.commit_interval_ms,
        refetch_skipped=refetch_skipped and not config.exactly_once)


def new_producer(bootstrap_servers: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", linger_ms=5)


def producer_client(producer: Any) -> AIOKafkaClient | None:
    """The producer's connection, for requests aiokafka has no API for (LeaveGroup v3)."""
    return getattr(producer, "client", None)


async def broker_cluster_id(bootstrap_servers: str) -> str | None:
    """The cluster id the broker reports in a Metadata response (None when it gives none)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap_servers)
    await client.bootstrap()
    try:
        nodes: Iterable[Any] = client.cluster.brokers()
        node = next(iter(nodes)).nodeId
        response = await client.send(node, MetadataRequest([]))
        return getattr(response, "cluster_id", None)
    finally:
        await client.close()
