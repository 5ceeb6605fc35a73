"""Fake clients for the stream thread's unit tests: a group consumer, a producer, changelog
readers, a control channel and (for exactly-once) transactional producers over an in-memory
transaction log with fencing, that keep what they were asked in memory. Handed to
:func:`streams.runtime.factory.build_stream_thread`, they let a test drive a real thread (real
topology, tasks and RocksDB stores) through assignments, records and commits, without a
broker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.structs import ConsumerRecord, RecordMetadata, TopicPartition

from assignor import MemberAssignment, parse_task_id
from assignor.protocol import encode_assignment
from streams.app import App
from streams.config import AppConfig
from streams.dsl.topology import SubTopology
from streams.group.group_learning import GroupLearning
from streams.group.predecessors import MemberFiles
from streams.group.promotion_asks import PromotionAsks
from streams.group.round_alarm import RoundAlarm
from streams.group.warm_up import WarmUpGate
from streams.quirks.hooks import RoundHooks
from streams.quirks.static_followers import StaticFollowers
from streams.quirks.synced_round import RoundReports
from streams.runtime.factory import ThreadClients, build_stream_thread
from streams.runtime.store_handover import ProcessStores
from streams.runtime.thread import StreamThread
from streams.runtime.thread_status import Leaving
from streams.runtime.transactions import OffsetsEvidence

SOURCE, SINK = "in", "out"


class FakeConsumer:
    """The :class:`streams.kafka.driver.GroupConsumer` interface, in memory."""

    def __init__(self, events: list[str] | None = None) -> None:
        self.events = events if events is not None else []
        self.assigned: set[TopicPartition] = set()
        self.committed_offsets: dict[TopicPartition, int] = {}
        self.commits: list[dict[TopicPartition, int]] = []
        self.seeks: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()
        #: Partitions read ahead for a restoring task, not handed out.
        self.held: set[TopicPartition] = set()
        self.rejoins = 0
        #: The generation of the SyncGroup the member waits for (None: none), and those
        #: given up.
        self.pending_sync: int | None = None
        self.abandoned_syncs: list[int] = []
        self.rebalancing = False
        self.rebalancing_since: float | None = None
        self.round_started: float | None = None
        #: Partition ends (high watermarks) as the last fetch would report them.
        self.highwaters: dict[TopicPartition, int] = {}
        self.rejoin_pending = False
        #: The membership may have ended (see the cooperative coordinator): hold everything.
        self.membership_in_doubt = False
        #: Batches handed back unprocessed while in doubt.
        self.given_back: list[dict[TopicPartition, list[Any]]] = []
        self.member_id = "member-1"
        self.generation = 1
        self.listener: Any = None
        #: Exactly-once rigs: where the group's offsets are (committed by transactions).
        self.transactions: TransactionLog | None = None
        self._batches: asyncio.Queue[dict[TopicPartition, list[Any]]] = asyncio.Queue()
        #: Since when (monotonic seconds) the group has had its coordinator (from the start);
        #: None: it has none.
        self.coordinator_since: float | None = 0.0
        #: When its coordinator was found on the node it is on (from the start).
        self.coordinator_found: float | None = 0.0
        #: When its coordinator was last marked dead (never).
        self.coordinator_lost: float | None = None

    def coordinator_known_since(self) -> float | None:
        return self.coordinator_since

    def coordinator_found_at(self) -> float | None:
        return self.coordinator_found

    def coordinator_lost_at(self) -> float | None:
        return self.coordinator_lost

    def on_round_heard(self, callback: Callable[[int], None]) -> None:
        """What a heartbeat answered REBALANCE_IN_PROGRESS tells (the round alarm)."""
        self.round_heard = callback

    def before_rejoin_after_silence(self, wait: Callable[[], Awaitable[None]]) -> None:
        """What a member whose membership ended by its silence awaits before it joins."""
        self.rejoin_waiter = wait

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def heartbeat(self) -> str | None:
        """Answered without error: a formed group."""
        return None

    def subscribe(self, topics: list[str], listener: Any) -> None:
        self.listener = listener

    def feed(self, batch: dict[TopicPartition, list[Any]]) -> None:
        self._batches.put_nowait(batch)

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        """The next fed batch, or nothing at once: a fetch that waited out its timeout would
        only make the test sleep."""
        await asyncio.sleep(0)
        try:
            return self._batches.get_nowait()
        except asyncio.QueueEmpty:
            return {}

    def give_back(self, batches: dict[TopicPartition, list[Any]]) -> None:
        if batches:
            self.given_back.append(batches)
        for tp, records in batches.items():
            if records:
                self.seeks[tp] = records[0].offset

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks[tp] = offset

    async def seek_to_beginning(self, tp: TopicPartition) -> None:
        self.seeks[tp] = 0

    def pause(self, *tps: TopicPartition) -> None:
        self.paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused.difference_update(tps)

    def hold(self, *tps: TopicPartition) -> None:
        self.held.update(tps)

    def release(self, *tps: TopicPartition) -> None:
        self.held.difference_update(tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.highwaters.get(tp)

    async def committed(self, tp: TopicPartition) -> int | None:
        if tp in self.committed_offsets:
            return self.committed_offsets[tp]
        if self.transactions is not None:
            # Exactly-once: the offsets the committed transactions carried.
            return self.transactions.offsets.get((tp.topic, tp.partition))
        return None

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.events.append("offsets")
        self.commits.append(dict(offsets))
        self.committed_offsets.update(offsets)

    def rebalancing_for_s(self, now: float | None = None) -> float:
        if not self.rebalancing or self.rebalancing_since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - self.rebalancing_since

    def request_rejoin(self) -> None:
        self.rejoins += 1

    def abandon_sync(self, generation: int, reason: str) -> bool:
        """Gives up :attr:`pending_sync` if it is of ``generation``."""
        if self.pending_sync != generation:
            return False
        self.pending_sync = None
        self.abandoned_syncs.append(generation)
        return True


@dataclass
class Sent:
    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None
    headers: Any = None


class FakeProducer:
    """Sends land in ``sent``; acknowledgements come at once, or when the test calls
    :meth:`ack` (``auto_ack=False``). Like aiokafka's, a send over ``max_request_size`` raises
    at once; a send to a topic in ``failing`` raises that topic's error, and a topic in
    ``refusing`` gets that error in its delivery report.

    It speaks aiokafka's interface (``send``: the thread's status and control records) and
    confluent-kafka's (``produce``, ``poll``, ``flush``: the data producer of
    :mod:`streams.runtime.delivery`), whose delivery reports are served by ``poll`` and ``flush``,
    the latter waiting (in a worker thread, as the runtime calls it) for :meth:`ack`."""

    #: aiokafka's default request limit.
    max_request_size = 1_048_576

    def __init__(self, events: list[str] | None = None, auto_ack: bool = True) -> None:
        self.events = events if events is not None else []
        self.auto_ack = auto_ack
        self.sent: list[Sent] = []
        self._unacked: list[tuple[asyncio.Future[RecordMetadata], Sent]] = []
        self._offsets: dict[tuple[str, int], int] = {}
        self.client = None
        self.failing: dict[str, Exception] = {}
        self.refusing: dict[str, Exception] = {}
        self._reports = threading.Condition()
        #: Produced and not acknowledged; acknowledged and not reported.
        self._queued: list[tuple[Any, Sent]] = []
        self._ready: list[tuple[Any, Any, Sent, int]] = []
        #: Calls of :meth:`flush` waiting for acknowledgements now (a commit waiting).
        self.flushes_waiting = 0
        #: Records dropped from the queue by :meth:`purge`.
        self.purged = 0

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                   partition: int | None = None, timestamp_ms: int | None = None,
                   headers: Any = None) -> asyncio.Future[RecordMetadata]:
        if len(key or b"") + len(value or b"") > self.max_request_size:
            raise MessageSizeTooLargeError(f"the message is over {self.max_request_size} bytes")
        if topic in self.failing:
            raise self.failing[topic]
        record = Sent(topic, key, value, partition, headers)
        self.sent.append(record)
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        self._unacked.append((future, record))
        if self.auto_ack:
            self.ack()
        return future

    async def send_and_wait(self, topic: str, value: bytes | None = None,
                            key: bytes | None = None, **kwargs: Any) -> RecordMetadata:
        return await (await self.send(topic, value=value, key=key, **kwargs))

    def ack(self) -> None:
        unacked, self._unacked = self._unacked, []
        with self._reports:
            queued, self._queued = self._queued, []
            if unacked or queued:
                self.events.append("ack")
            for callback, record in queued:
                self._ready.append((callback, self.refusing.get(record.topic), record,
                                    self._next_offset(record)))
            self._reports.notify_all()
        for future, record in unacked:
            partition = record.partition or 0
            future.set_result(RecordMetadata(
                topic=record.topic, partition=partition,
                topic_partition=TopicPartition(record.topic, partition),
                offset=self._next_offset(record),
                timestamp=None, timestamp_type=0, log_start_offset=0))

    def _next_offset(self, record: Sent) -> int:
        partition = record.partition or 0
        offset = self._offsets.get((record.topic, partition), 0)
        self._offsets[(record.topic, partition)] = offset + 1
        return offset

    # -- confluent-kafka's interface -------------------------------------------------------

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                partition: int | None = None, on_delivery: Any = None,
                timestamp: int | None = None, headers: Any = None) -> None:
        if len(key or b"") + len(value or b"") > self.max_request_size:
            raise MessageSizeTooLargeError(f"the message is over {self.max_request_size} bytes")
        if topic in self.failing:
            raise self.failing[topic]
        record = Sent(topic, key, value, partition, headers)
        self.sent.append(record)
        with self._reports:
            self._queued.append((on_delivery, record))
        if self.auto_ack:
            self.ack()

    def poll(self, timeout: float = 0) -> int:
        with self._reports:
            ready, self._ready = self._ready, []
        for callback, error, record, offset in ready:
            if callback is not None:
                callback(error, _Delivered(record.topic, record.partition or 0, offset))
        return len(ready)

    def flush(self, timeout: float = -1) -> int:
        with self._reports:
            self.flushes_waiting += 1
            try:
                self._reports.wait_for(lambda: not self._queued,
                                       None if timeout < 0 else timeout)
            finally:
                self.flushes_waiting -= 1
        self.poll()
        return len(self)

    def purge(self, in_queue: bool = True, in_flight: bool = True,
              blocking: bool = True) -> None:
        """Records not acknowledged yet are dropped: reported ``_PURGE_QUEUE`` at the next
        poll, as librdkafka does."""
        from confluent_kafka import KafkaError

        with self._reports:
            queued, self._queued = self._queued, []
            for callback, record in queued:
                self._ready.append((callback, KafkaError(KafkaError._PURGE_QUEUE), record, -1))
            self.purged += len(queued)
            self._reports.notify_all()

    def __len__(self) -> int:
        with self._reports:
            return len(self._queued) + len(self._ready)

    def to(self, topic: str) -> list[Sent]:
        return [s for s in self.sent if s.topic == topic]


@dataclass
class _Delivered:
    """The message a delivery report carries (confluent-kafka's ``Message``)."""

    _topic: str
    _partition: int
    _offset: int

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


class FencedError(Exception):
    """What the fake broker answers a fenced producer."""


@dataclass
class Committed:
    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    offset: int = -1


class TransactionLog:
    """The fake broker's side of transactions: what each transactional id's latest
    producer is (fencing), and the records and offsets of committed transactions."""

    def __init__(self, events: list[str] | None = None) -> None:
        self.events = events if events is not None else []
        self.epochs: dict[str, int] = {}
        self.records: list[Committed] = []
        self.offsets: dict[tuple[str, int], int] = {}
        self.aborted = 0
        self._next: dict[tuple[str, int], int] = {}
        #: Open transactions by transactional id: aborted by the next producer's init.
        self.open: dict[str, FakeTransactionalProducer] = {}
        #: Transactional ids whose open transaction is being committed: the next producer's
        #: init completes it instead of aborting it.
        self.prepared: set[str] = set()

    def producer(self, tid: str) -> FakeTransactionalProducer:
        return FakeTransactionalProducer(tid, self)

    def next_offset(self, topic: str, partition: int) -> int:
        offset = self._next.get((topic, partition), 0)
        self._next[(topic, partition)] = offset + 1
        return offset

    def to(self, topic: str) -> list[Committed]:
        return [r for r in self.records if r.topic == topic]


class _Message:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset


class FakeTransactionalProducer:
    """confluent-kafka's transactional producer API over a :class:`TransactionLog`."""

    def __init__(self, tid: str, log: TransactionLog) -> None:
        self.tid, self.log = tid, log
        self.epoch = -1
        self.in_transaction = False
        self.pending: list[Committed] = []
        self._callbacks: list[tuple[Any, int]] = []
        self._offsets: dict[tuple[str, int], int] = {}
        self.closed = False

    def init_transactions(self, timeout: float = -1) -> None:
        self.log.events.append(f"init {self.tid}")
        self.epoch = self.log.epochs.get(self.tid, 0) + 1
        self.log.epochs[self.tid] = self.epoch
        earlier = self.log.open.get(self.tid)
        if earlier is not None and self.tid in self.log.prepared:
            earlier._complete()
        elif earlier is not None:
            del self.log.open[self.tid]
            earlier._discard()
            self.log.aborted += 1

    def _check(self) -> None:
        if self.log.epochs.get(self.tid) != self.epoch:
            raise FencedError(f"{self.tid}: producer fenced")

    def begin_transaction(self) -> None:
        self._check()
        self.in_transaction = True
        self.log.open[self.tid] = self

    def produce(self, topic: str, key: bytes | None = None, value: bytes | None = None,
                partition: int | None = None, on_delivery: Any = None, **kwargs: Any) -> None:
        assert self.in_transaction, "produce outside a transaction"
        self._check()  # a fenced producer refuses records
        offset = self.log.next_offset(topic, partition or 0)
        self.pending.append(Committed(topic, partition, key, value, offset))
        self._callbacks.append((on_delivery, offset))

    def flush(self, timeout: float = -1) -> int:
        callbacks, self._callbacks = self._callbacks, []
        for callback, offset in callbacks:
            if callback is not None:
                callback(None, _Message(offset))
        return 0

    def send_offsets_to_transaction(self, offsets: list[Any], metadata: Any,
                                    timeout: float = -1) -> None:
        self._check()
        for tp in offsets:
            self._offsets[(tp.topic, tp.partition)] = tp.offset

    def commit_transaction(self, timeout: float = -1) -> None:
        self.flush()
        self._check()
        self._complete()

    def prepare_commit(self) -> None:
        """The broker has the commit, and completes it even if this producer is fenced
        (its next owner's ``init_transactions`` waits for it) : a commit whose answer was
        lost on its way back."""
        self.flush()
        self._check()
        self.log.prepared.add(self.tid)

    def _complete(self) -> None:
        self.log.events.append(f"commit {self.tid}")
        self.log.records += self.pending
        self.log.offsets.update(self._offsets)
        self.log.open.pop(self.tid, None)
        self.log.prepared.discard(self.tid)
        self._discard()

    def abort_transaction(self, timeout: float = -1) -> None:
        self.log.open.pop(self.tid, None)
        self.log.aborted += 1
        self._discard()

    def _discard(self) -> None:
        self.pending, self._offsets, self._callbacks = [], {}, []
        self.in_transaction = False

    def purge(self) -> None:
        """Drop the records not sent yet; the broker's transaction (what was flushed, the
        offsets) stays open until the next producer's init settles it."""
        if self._callbacks:
            del self.pending[len(self.pending) - len(self._callbacks):]
        self._callbacks = []

    def close(self) -> None:
        self.closed = True


@dataclass
class _Stats:
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0


class FakeChangelogReader:
    """Restores at once; copies have the lag the test sets (0 by default). ``restored``
    names every store registered (restored, if its lag is 0)."""

    def __init__(self, events: list[str] | None = None) -> None:
        self.events = events
        #: Set: restoration replays the committed changelog records this log holds past
        #: each store's position, as a reader of a changelog (read_committed) would.
        self.transactions: TransactionLog | None = None
        self.registered: list[Any] = []
        self.lags: dict[str, int | None] = {}
        self.stats = _Stats()
        self.restored: list[str] = []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def register(self, store: Any) -> None:
        self.registered.append(store)
        if self.transactions is not None:
            self._replay(store, self.transactions)
        if self.events is not None:
            self.events.append(f"restore {store.name}/{store.partition}")
        self.restored.append(f"{store.name}/{store.partition}")

    def unregister(self, store: Any) -> None:
        if store in self.registered:
            self.registered.remove(store)

    def lag(self, store: Any) -> int | None:
        return self.lags.get(f"{store.partition}", 0)

    def read_position(self, store: Any) -> int:
        return int(store.position)

    def read_since_registered(self, store: Any) -> _Stats:
        return _Stats()

    async def poll(self, timeout_ms: int = 200) -> int:
        """Nothing to fetch, at once (a real reader would wait up to ``timeout_ms``)."""
        await asyncio.sleep(0)
        return 0

    @staticmethod
    def _replay(store: Any, log: TransactionLog) -> None:
        records = [r for r in log.records if r.topic == store.changelog_topic
                   and (r.partition or 0) == store.partition and r.offset >= store.position]
        if records:
            store.apply_restore_batch([(r.key, r.value) for r in records],
                                      records[-1].offset + 1)


@dataclass
class FakeControl:
    rebalance_requests: list[str] = field(default_factory=list)
    subscriptions: list[str] = field(default_factory=list)
    fetch_requests: list[dict[str, str]] = field(default_factory=list)

    def request_rebalance(self, reason: str) -> None:
        self.rebalance_requests.append(reason)

    def publish_subscription(self, static_id: str, data: bytes) -> None:
        self.subscriptions.append(static_id)

    def request_fetch(self, digests: dict[str, str]) -> None:
        self.fetch_requests.append(digests)


@dataclass
class Rig:
    """A thread built by the factory with fake clients, and those clients."""

    thread: StreamThread
    consumer: FakeConsumer
    producer: FakeProducer
    restorer: FakeChangelogReader
    follower: FakeChangelogReader
    control: FakeControl
    #: Exactly-once rigs: the fake broker's transactions.
    transactions: TransactionLog | None = None


def counting_subs(partitions: int = 4) -> list[SubTopology]:
    """The counting app's topology (count per key into ``counts``), sized."""
    app = App("unit", bootstrap_servers="127.0.0.1:1")
    app.stream(SOURCE).group_by_key().count(store="counts").to_stream().to(SINK)
    subs = app.topology.sub_topologies()
    app.topology.assign_partitions(subs, {SOURCE: partitions}, partitions)
    return subs


def config(state_dir: Path, **settings: Any) -> AppConfig:
    return AppConfig(application_id="unit", bootstrap_servers="127.0.0.1:1",
                     state_dir=state_dir, **settings)


def rig(state_dir: Path, *, index: int = 0, events: list[str] | None = None,
        process_stores: ProcessStores | None = None,
        static_followers: StaticFollowers | None = None,
        subs: list[SubTopology] | None = None, member_files: MemberFiles | None = None,
        promotion_asks: PromotionAsks | None = None, round_reports: RoundReports | None = None,
        leaving: Leaving | None = None, warm_up_gate: WarmUpGate | None = None,
        group_learning: GroupLearning | None = None, round_alarm: RoundAlarm | None = None,
        offsets_evidence: OffsetsEvidence | None = None, **settings: Any) -> Rig:
    events = events if events is not None else []
    transactions = TransactionLog(events)
    producer = FakeProducer(events)
    clients = ThreadClients(FakeConsumer(events), producer,
                            FakeChangelogReader(events), FakeChangelogReader(),
                            data_producer=producer,
                            transactional_producer=transactions.producer,
                            group_metadata=lambda: b"group-metadata")
    control = FakeControl()
    thread = build_stream_thread(
        config(state_dir, **settings), index, subs or counting_subs(), clients=clients,
        instance_id="unit-instance", control=control, process_stores=process_stores,
        hooks=embedded_hooks(static_followers, round_reports), member_files=member_files,
        promotion_asks=promotion_asks, leaving=leaving, warm_up_gate=warm_up_gate,
        group_learning=group_learning, round_alarm=round_alarm,
        offsets_evidence=offsets_evidence,
    )
    return Rig(thread, clients.consumer, clients.producer, clients.restorer,  # type: ignore[arg-type]
               clients.follower, control, transactions)


def embedded_hooks(static_followers: StaticFollowers | None = None,
                   round_reports: RoundReports | None = None) -> RoundHooks:
    """The embedded broker's hooks, with the process-wide parts a test hands in (the
    static-follower protocol, the round reports) and no others."""
    return RoundHooks(static_followers=static_followers, round_reports=round_reports,
                      leave_from_formed_group=True, remove_departed=True,
                      committed_by_markers=True, records_positions=True)


def partitions_of(*task_ids: str) -> set[TopicPartition]:
    return {TopicPartition(SOURCE, parse_task_id(t)[1]) for t in task_ids}


async def assign(rig: Rig, active: tuple[str, ...] = (), *, standbys: tuple[str, ...] = (),
                 learners: tuple[str, ...] = (), restore: bool = True, **extra: Any) -> None:
    """Deliver an assignment the way the coordinator does (the assignor first, then the
    listener), and let the restored actives start, and then the copies it added open."""
    assignment = MemberAssignment(active=active, standbys=standbys, learners=learners, **extra)
    rig.consumer.assigned = partitions_of(*active)
    by_topic = sorted({(SOURCE, tuple(sorted(tp.partition for tp in rig.consumer.assigned)))})
    rig.thread.assignor.on_assignment(ConsumerProtocolMemberAssignment(
        0, [(t, list(ps)) for t, ps in by_topic if ps], encode_assignment(assignment)))
    await rig.thread.listener.on_partitions_assigned(rig.consumer.assigned)
    if restore:
        await rig.thread.state_updater.restore_pending()
        await rig.thread.listener.copy_opener.settled()


def record(partition: int, offset: int, key: str, value: Any = 1,
           timestamp: int = 1_000) -> ConsumerRecord[bytes, bytes]:
    k, v = msgpack.packb(key), msgpack.packb(value)
    return ConsumerRecord(SOURCE, partition, offset, timestamp, 0, k, v, None, len(k), len(v), [])
