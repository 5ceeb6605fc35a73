"""Exactly-once processing: one Kafka transaction per task and commit interval.

Each active task has a transactional producer of its own (confluent-kafka; aiokafka's fails
on Tansu), with ``transactional.id`` ``<application_id>-<task>``. When a task becomes active
its producer's ``init_transactions`` runs before its state is restored: that fences any
earlier owner of the task (a zombie that lost it and does not know yet) and aborts the
zombie's open transaction, so restoration reads a changelog no one else can still extend.

Every commit interval, each task's transaction holds its outputs, dead letters, changelog
records (the last of which is the task's input position, kept in its state) and, through
``send_offsets_to_transaction``, its input offsets for the group. Commit or abort decides
them all at once. The store's write buffer reaches RocksDB only after the transaction
committed; a failed transaction (fenced, aborted, a send error) discards the buffer, and its
task starts again from the committed state on disk plus the committed changelog after its
checkpoint, never a full restore: in place, or, fenced, once the group has planned again
(see :mod:`streams.runtime.transaction_errors`). After a SIGKILL of the group's
coordinator, a producer that waited out its move is replaced once its transaction committed
(see :meth:`TaskProducers.renew`).

The offsets go with a consumer group metadata that names the group only (no member id, no
generation): fencing rests on the per-task transactional id, not on the group generation,
because the group members are aiokafka consumers that confluent-kafka cannot describe.

The confluent-kafka calls that wait on the broker (``init_transactions``, ``flush``,
``send_offsets_to_transaction``, ``commit_transaction``, ``abort_transaction``) run each in a
thread of its own (see :mod:`streams.runtime.call_threads`), so that the event loop
(heartbeats, fetches) goes on meanwhile, and each is waited for a bounded time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka.structs import TopicPartition

from statestore.record_size import truncated_payload
from statestore.store import KeyValueStore
from streams.metrics import Metrics
from streams.quirks.task_positions import TaskPositions
from streams.runtime.call_threads import in_own_thread
from streams.runtime.dead_letter_log import DeadLetterLog
from streams.runtime.delivery import hand_changelog, hand_outputs
from streams.runtime.record_collector import changelogs_due
from streams.runtime.repartition_purge import RepartitionPurger
from streams.runtime.task import RecordError, StreamTask, drop_reason, task_counts
from streams.runtime.transaction_errors import retriable

log = logging.getLogger(__name__)

#: How long a blocking transactional call may take before it counts as failed.
TRANSACTION_TIMEOUT_S = 30.0
#: How long past its own timeout a transactional call is waited for (see CallHung).
CALL_GRACE_S = 5.0
#: The timeout of ``send_offsets_to_transaction``, and how long past it the call is waited
#: for. A call that hangs (see CallHung) hangs for as long as it is waited for, and its task
#: is revived only then: at 30 + 5 s, the bulk of every task's stall after the SIGKILL of the
#: group's coordinator. One started before the coordinator moved (9 s of the broker's session
#: and more under load) returns once it moved, 11 to 12 s after the SIGKILL in the fault
#: suite; given up at 4 + 2 s instead, its task's new producer waited out that move anyway.
OFFSETS_TIMEOUT_S = 12.0
OFFSETS_GRACE_S = 3.0
#: How long a sending of offsets may go on once the group's consumer has had a coordinator
#: (and the call had started): a call still waiting then waits on the coordinator that is
#: gone, librdkafka's stale choice (issue 5511), and is given up before its 12 + 3 s.
OFFSETS_KNOWN_COORDINATOR_S = 5.0
#: How long a sending of offsets may go on once another task's, started about as early (at
#: most OFFSETS_STARTED_TOGETHER_S before it, a commit's calls start together), went through:
#: the coordinators answer, and a call still waiting waits on the dead broker. After a
#: SIGKILL of the group's coordinator, calls started together either returned within 0.5 s
#: of each other or hung to their bound, 4 s and more later.
OFFSETS_AFTER_ANOTHER_S = 2.0
#: How long a sending of offsets started before the group's coordinator was found on a new
#: node may go on after that: it waits on the old node, the dead broker (calls that were
#: going through returned within 1.7 s of the find after the coordinator's SIGKILL, while
#: the consumer's coordinator, still loading, was marked dead and found again for seconds).
OFFSETS_AFTER_NEW_COORDINATOR_S = 3.0
OFFSETS_STARTED_TOGETHER_S = 1.0
#: How often a sending of offsets checks the group's coordinator.
OFFSETS_CHECK_S = 0.5
#: A sending of offsets that took longer than this waited out a coordinator's move, as a
#: rule: its producer is replaced once its transaction committed (see TaskProducers.renew).
RENEW_AFTER_OFFSETS_S = 3.0
#: How long a producer's replacement (see TaskProducers.renew) may take to fence the old one
#: (0.1 to 1.6 s after a SIGKILL in the fault suite) before its task is revived instead.
RENEW_TIMEOUT_S = 5.0
#: How long an abort may take before the producer is released instead.
ABORT_TIMEOUT_S = 5.0
#: Attempts at fencing a task's previous owner before the error propagates.
INIT_ATTEMPTS = 3
#: A transactional call that takes longer than this is logged with its duration.
SLOW_CALL_S = 1.0


class CoordinatorView(Protocol):
    """What a thread's group consumer knows of the group's coordinator (monotonic seconds)."""

    def coordinator_found_at(self) -> float | None:
        """When it last found the coordinator on another node (None: never)."""
        ...

    def coordinator_lost_at(self) -> float | None:
        """When it last marked the coordinator dead (None: never)."""
        ...


@dataclass
class OffsetsEvidence:
    """What a process's threads know that tells a hung sending of offsets: the latest sending
    that went through (when it started and ended), and what each thread's consumer saw of
    the group's coordinator. Shared by the threads: their tasks' offsets all go to the
    group's one coordinator, so what one thread saw holds for every thread's (see
    :data:`OFFSETS_AFTER_ANOTHER_S`: after the coordinator's SIGKILL, both tasks of one
    thread hung while another thread's had gone through 3.5 s before; and
    :data:`OFFSETS_AFTER_NEW_COORDINATOR_S`: one thread's consumer found the new
    coordinator 2.6 s before another's)."""

    latest: tuple[float, float] | None = None
    #: Each thread's consumer.
    coordinators: list[CoordinatorView] = field(default_factory=list)

    def went_through(self, started: float, ended: float) -> None:
        self.latest = (started, ended)

    def found_after(self, moment: float) -> float | None:
        """The first find of the group's coordinator on another node, by any thread, after
        ``moment``; None: none since."""
        finds = [found for found in (c.coordinator_found_at() for c in self.coordinators)
                 if found is not None and found > moment]
        return min(finds) if finds else None

    def lost_since(self, moment: float) -> bool:
        """Whether any thread's consumer marked the group's coordinator dead after
        ``moment``."""
        return any(lost is not None and lost > moment
                   for lost in (c.coordinator_lost_at() for c in self.coordinators))


def transactional_id(application_id: str, task_id: str) -> str:
    return f"{application_id}-{task_id}"


def new_transactional_producer(bootstrap_servers: str, tid: str) -> Any:
    """A confluent-kafka producer for one task. ``murmur2_random`` places keyed records on
    the partitions Java clients and aiokafka choose."""
    from confluent_kafka import Producer

    return Producer({
        "bootstrap.servers": bootstrap_servers,
        "transactional.id": tid,
        "transaction.timeout.ms": 60_000,
        # Outputs become visible only at the commit, which flushes at once: a longer linger
        # costs no latency a reader sees, and makes fewer, larger produce requests.
        "linger.ms": 50,
        "partitioner": "murmur2_random",
        "enable.idempotence": True,
        "acks": "all",
    })


def new_group_metadata(bootstrap_servers: str, group_id: str) -> Any:
    """Consumer group metadata naming ``group_id`` alone, for ``send_offsets_to_transaction``
    (read from a confluent-kafka consumer that never joins)."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": group_id,
                         "enable.auto.commit": False})
    try:
        return consumer.consumer_group_metadata()
    finally:
        consumer.close()


class TransactionFailed(Exception):
    """A task's transaction could not commit; its writes are discarded. ``cause``: the
    producer's error behind it, when there is one (a failed send's delivery report)."""

    def __init__(self, message: str, cause: Any = None) -> None:
        super().__init__(message)
        self.cause = cause


class CallHung(TransactionFailed):
    """A transactional call still had not returned well past its own timeout: librdkafka's
    ``send_offsets_to_transaction`` can wait for a group coordinator that is gone without
    end, its timeout ignored (librdkafka issues 5456 and 5511), and the stream thread, which
    holds its lock through the commit, would wait with it. The producer is left to the
    worker thread that waits; the task starts again with a new one."""

    hung = True


class ProducerNotRenewed(TransactionFailed):
    """A task's transaction committed, but the producer that was to replace its producer
    could not start: the task is revived (its next producer, started off the thread's lock,
    fences the old one with retries), from the state just committed."""

    hung = True


async def call_within(call: Callable[..., Any], *args: Any, timeout_s: float,
                      grace_s: float = CALL_GRACE_S) -> Any:
    """``call(*args, timeout_s)`` in a thread of its own, waited for at most ``timeout_s`` +
    ``grace_s``; :class:`CallHung` after that (the call goes on in its thread)."""
    name = getattr(call, "__name__", "a transactional call")
    started = time.monotonic()
    try:
        return await asyncio.wait_for(in_own_thread(call, *args, timeout_s),
                                      timeout_s + grace_s)
    except TimeoutError:
        raise CallHung(f"{name} did not return within {timeout_s + grace_s:.0f} s "
                       f"(its timeout: {timeout_s:.0f} s)") from None
    finally:
        took = time.monotonic() - started
        if took > SLOW_CALL_S:
            log.info("%s took %.1f s (its timeout: %.0f s)", name, took, timeout_s)


async def commit_transaction(producer: Any, task_id: str,
                             budget_s: float = TRANSACTION_TIMEOUT_S,
                             grace_s: float = CALL_GRACE_S) -> None:
    """Commit the producer's transaction. A retriable error (a timeout) leaves the commit
    undecided: it may still go through, so the call is made again, as confluent-kafka asks,
    until it succeeds, fails otherwise, or ``budget_s`` is spent (then the last error is
    raised, and the task's next producer settles the transaction when it fences this one)."""
    deadline = time.monotonic() + budget_s
    while True:
        left = max(0.1, deadline - time.monotonic())
        try:
            await call_within(producer.commit_transaction, timeout_s=left, grace_s=grace_s)
            return
        except Exception as exc:
            if not retriable(exc) or time.monotonic() >= deadline:
                raise
            log.info("task %s: commit undecided (%s); committing again", task_id, exc)


@dataclass
class _StoreAcks:
    store: KeyValueStore
    count: int = 0
    end: int = 0


@dataclass
class TaskTransaction:
    """One task's producer and what its open transaction holds."""

    task_id: str
    producer: Any
    open: bool = False
    #: When the producer was made (monotonic seconds): one older than the group's coordinator
    #: may still send offsets to the one before it.
    since: float = field(default_factory=time.monotonic)
    #: Changelog acknowledgements per store (filled by delivery reports).
    acks: dict[int, _StoreAcks] = field(default_factory=dict)
    errors: list[Any] = field(default_factory=list)
    produced: int = 0
    #: One delivery callback per store (the store kept to tell a reopened one apart).
    _callbacks: dict[int, tuple[KeyValueStore, Callable[[Any, Any], None]]] = field(
        default_factory=dict)

    def _delivered(self, store: KeyValueStore | None, err: Any, msg: Any) -> None:
        # Called from the thread that flushes or polls the producer.
        if err is not None:
            self.errors.append(err)
        elif store is not None:
            acks = self.acks.setdefault(id(store), _StoreAcks(store))
            acks.count += 1
            acks.end = max(acks.end, msg.offset() + 1)

    async def produce(self, topic: str, key: bytes | None, value: bytes | None, *,
                      partition: int | None = None, timestamp_ms: int | None = None,
                      headers: list[tuple[str, bytes]] | None = None,
                      store: KeyValueStore | None = None) -> None:
        if self.errors:
            return  # the transaction fails at commit and is discarded: nothing more to add
        if not self.open:
            try:
                self.producer.begin_transaction()
            except Exception as exc:
                self.errors.append(exc)
                return
            self.open = True
        kwargs: dict[str, Any] = {"key": key, "value": value,
                                  "on_delivery": lambda err, msg: self._delivered(store, err, msg)}
        if partition is not None:
            kwargs["partition"] = partition
        if timestamp_ms:
            kwargs["timestamp"] = timestamp_ms
        if headers:
            kwargs["headers"] = headers
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                break
            except BufferError:
                # The producer's queue is full: let it drain (off the event loop).
                await asyncio.to_thread(self.producer.poll, 0.1)
            except Exception as exc:
                # A fenced or failed producer refuses records: the commit reports it (the
                # task is closed there), the processing loop goes on with other tasks.
                self.errors.append(exc)
                return
        self.produced += 1

    def hand(self, records: list[Any], start: int, topic: str | None = None,
             partition: int | None = None, store: KeyValueStore | None = None) -> int:
        """Hand ``records[start:]`` to the transaction without awaiting each one, until the
        producer's queue is full; returns the index of the first record not handed (the
        caller waits for room and calls again). Each record is an output (``topic``,
        ``key``, ``value``, ``timestamp_ms``) or, with ``topic`` and ``store`` given, a
        changelog ``(key, value)`` pair for ``partition``. A producer that refuses records
        (fenced, failed) fails the transaction at commit: the rest are dropped here."""
        if self.errors:
            return len(records)
        if not self.open:
            try:
                self.producer.begin_transaction()
            except Exception as exc:
                self.errors.append(exc)
                return len(records)
            self.open = True
        produce = self.producer.produce
        try:
            if store is not None:
                index = hand_changelog(produce, records, start, topic or "", partition,
                                       self._store_callback(store))
            else:
                index = hand_outputs(produce, records, start, self._output_callback)
        except Exception as exc:
            # A fenced or failed producer refuses records: the commit reports it.
            self.errors.append(exc)
            index = len(records)
        self.produced += index - start
        return index

    def _output_callback(self, err: Any, msg: Any) -> None:
        self._delivered(None, err, msg)

    def _store_callback(self, store: KeyValueStore) -> Callable[[Any, Any], None]:
        callback = self._callbacks.get(id(store))
        if callback is None or callback[0] is not store:
            callback = (store, lambda err, msg: self._delivered(store, err, msg))
            self._callbacks[id(store)] = callback
        return callback[1]

    async def room(self) -> None:
        """Wait for the full queue to drain a little (off the event loop)."""
        await asyncio.to_thread(self.producer.poll, 0.1)

    def reset(self) -> None:
        self.open = False
        self.acks.clear()
        self.errors.clear()
        self.produced = 0


class TaskProducers:
    """The transactional producers of a thread's tasks, by task id."""

    def __init__(self, application_id: str, new_producer: Callable[[str], Any]) -> None:
        self._application_id = application_id
        self._new_producer = new_producer
        self.transactions: dict[str, TaskTransaction] = {}

    async def start_task(self, task_id: str) -> TaskTransaction:
        """A fresh producer for ``task_id``, its transactions initialised: every earlier
        producer with the task's transactional id is fenced, its open transaction aborted."""
        await self.drop(task_id)
        tid = transactional_id(self._application_id, task_id)
        for attempt in range(1, INIT_ATTEMPTS + 1):
            producer = self._new_producer(tid)
            try:
                await call_within(producer.init_transactions, timeout_s=TRANSACTION_TIMEOUT_S)
                break
            except Exception as exc:
                await _close_producer(producer)
                if attempt == INIT_ATTEMPTS:
                    raise
                log.warning("init_transactions for %s failed (%s); retrying", tid, exc)
        transaction = TaskTransaction(task_id, producer)
        self.transactions[task_id] = transaction
        log.info("task %s: transactional producer %s ready (earlier owners fenced)",
                 task_id, tid)
        return transaction

    async def renew(self, task_id: str, timeout_s: float = RENEW_TIMEOUT_S,
                    why: str = "after the coordinator's move") -> None:
        """Replace the producer of ``task_id``, between two of its transactions, with a new
        one that looks the coordinators up afresh. After the SIGKILL of the group's
        coordinator, a producer whose sending of offsets waited out the move sends the next
        ones to the dead broker (librdkafka's stale choice, issue 5511), and hangs until given
        up, its task revived: a new producer costs one ``init_transactions`` instead. One
        attempt, within ``timeout_s`` (the caller holds its thread's lock): if it fails, the
        task has no producer, and the error propagates."""
        transaction = self.transactions.get(task_id)
        if transaction is None or transaction.open:
            return
        started = time.monotonic()
        await self.drop(task_id)
        producer = self._new_producer(transactional_id(self._application_id, task_id))
        try:
            await call_within(producer.init_transactions, timeout_s=timeout_s)
        except Exception:
            await _close_producer(producer)
            raise
        self.transactions[task_id] = TaskTransaction(task_id, producer)
        log.info("task %s: producer replaced (%s) in %.1f s", task_id, why,
                 time.monotonic() - started)

    async def drop(self, task_id: str, failed: bool = False) -> None:
        """Close the task's producer; an open transaction is aborted. A producer whose
        transaction ``failed`` (fenced, or an abort that did not go through) is only
        released: it could not abort nor close (both wait on a transaction the broker will
        not finish), and its open transaction is aborted by the task's next owner's
        ``init_transactions``, or by the broker's transaction timeout."""
        transaction = self.transactions.pop(task_id, None)
        if transaction is None:
            return
        producer = transaction.producer
        if transaction.open and not failed:
            try:
                await call_within(producer.abort_transaction, timeout_s=ABORT_TIMEOUT_S)
            except Exception as exc:
                log.warning("task %s: abort failed (%s); releasing its producer", task_id, exc)
                failed = True
        if failed:
            with contextlib.suppress(Exception):
                producer.purge()
            return  # released: librdkafka destroys it without waiting on the transaction
        await _close_producer(producer)

    async def retain(self, task_ids: Iterable[str]) -> None:
        """Close the producers of tasks this thread no longer holds."""
        keep = set(task_ids)
        for task_id in [t for t in self.transactions if t not in keep]:
            await self.drop(task_id)

    async def close(self) -> None:
        for task_id in list(self.transactions):
            await self.drop(task_id)


async def _close_producer(producer: Any) -> None:
    close = getattr(producer, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(in_own_thread(close), ABORT_TIMEOUT_S)


class TransactionalCollector:
    """The record collector of an exactly-once thread: ships each task's outputs, dead
    letters and changelog records into the task's open transaction. The broker's
    acknowledgements count only once the transaction commits (see the committer)."""

    def __init__(self, producers: TaskProducers, dead_letter_topic: str,
                 metrics: Metrics | None = None, metrics_label: str = "",
                 changelog_buffer_bytes: int = 0) -> None:
        self.producers = producers
        self.changelog_buffer_bytes = changelog_buffer_bytes
        self._dead_letter_topic = dead_letter_topic
        self._metrics = metrics
        self._label = metrics_label
        self.dead_lettered = 0
        self._dead_letter_log = DeadLetterLog()

    async def transaction(self, task_id: str) -> TaskTransaction:
        transaction = self.producers.transactions.get(task_id)
        if transaction is None:
            # Every active is started through the state updater, which fences first; a task
            # without a producer lost it to a failed transaction and is being closed.
            transaction = await self.producers.start_task(task_id)
        return transaction

    async def ship_outputs(self, tasks: Iterable[StreamTask]) -> None:
        """After a batch: hand the queued outputs of ``tasks`` to their transactions, and
        their changelog records too once they outgrew ``changelog_buffer_bytes``."""
        tasks = list(tasks)
        await self.ship(tasks, changelogs=changelogs_due(tasks, self.changelog_buffer_bytes))

    async def ship(self, tasks: Iterable[StreamTask], changelogs: bool = True) -> None:
        """Hand every queued output and (``changelogs``) changelog record of ``tasks`` to
        their task's transaction, with each task's input position written into its stores
        first."""
        for task in tasks:
            outputs = task.take_outputs()
            if changelogs and task.stores:
                task.record_input_position()
                changelogs_of = [(store, store.drain_changelog())
                                 for store in task.stores.values()]
            else:
                changelogs_of = []
            if not outputs and not any(records for _, records in changelogs_of):
                continue
            transaction = await self.transaction(task.task_id)
            handed = transaction.hand(outputs, 0)
            while handed < len(outputs):
                await transaction.room()
                handed = transaction.hand(outputs, handed)
            for store, records in changelogs_of:
                topic = store.changelog_topic
                if topic is None:
                    continue
                handed = transaction.hand(records, 0, topic, store.partition, store)
                while handed < len(records):
                    await transaction.room()
                    handed = transaction.hand(records, handed, topic, store.partition, store)

    async def send_changelogs(self, tasks: Iterable[StreamTask]) -> None:
        await self.ship(tasks)

    async def dead_letter(self, error: RecordError, task_id: str = "",
                          processed: int = -1) -> None:
        """As :meth:`RecordCollector.dead_letter`, in the task's transaction."""
        record = error.record
        self._dead_letter_log.report(error, task_id, processed, self._dead_letter_topic)
        key, value, cut = truncated_payload(record.key, record.value)
        transaction = await self.transaction(task_id)
        await transaction.produce(self._dead_letter_topic, key, value,
                                  headers=error.dead_letter_headers() + cut)
        self.dead_lettered += 1
        if self._metrics is not None:
            self._metrics.record_dead_letters(self._label, task_id, reason=drop_reason(error))

    async def wait_acknowledged(self) -> None:
        """Acknowledgements are waited for at commit, inside each transaction."""

    def discard_queued(self) -> None:
        """Nothing to do: a stopped task's producer is dropped (and fenced by its next
        owner) with its open transaction."""

    async def close(self) -> None:
        await self.producers.close()


class TransactionalCommitter:
    """Commits each running task's transaction: ship what is queued, wait for the
    acknowledgements, add the input offsets, commit; then the stores apply their buffers.

    A task whose transaction fails is reported to ``on_failed`` (which closes it and asks
    for a rebalance); the other tasks commit independently."""

    def __init__(self, collector: TransactionalCollector, group_metadata: Callable[[], Any],
                 tasks: Callable[[], list[StreamTask]], held: Callable[[], Iterable[str]],
                 name: str, on_failed: Callable[[str, BaseException], Awaitable[None] | None],
                 metrics: Metrics | None = None, metrics_label: str = "",
                 positions: TaskPositions | None = None,
                 purger: RepartitionPurger | None = None,
                 coordinator_known_since: Callable[[], float | None] | None = None,
                 evidence: OffsetsEvidence | None = None,
                 coordinator: CoordinatorView | None = None) -> None:
        self._collector = collector
        #: Since when the group's consumer has had its coordinator (see
        #: OFFSETS_KNOWN_COORDINATOR_S); None: not known here.
        self._coordinator_known_since = coordinator_known_since
        #: Where each task also records its input offsets (broker quirk
        #: ``deferred-transactional-offsets``); None where the group's offsets suffice.
        self._positions = positions
        self._group_metadata = group_metadata
        self._metadata: Any = None
        self._tasks = tasks
        self._held = held
        self._name = name
        self._on_failed = on_failed
        self._metrics = metrics
        self._label = metrics_label or name
        #: Deletes what the tasks' transactions committed on their repartition topics; None:
        #: nothing does.
        self.purger = purger
        #: The offsets this thread committed last, per partition.
        self.committed: dict[TopicPartition, int] = {}
        #: How long a commit that times out is made again before it counts as failed.
        self.commit_budget_s = TRANSACTION_TIMEOUT_S
        #: How long past a call's own timeout it is waited for (see CallHung); the timeout
        #: given to ``send_offsets_to_transaction``, and its own grace.
        self.call_grace_s = CALL_GRACE_S
        self.offsets_timeout_s = OFFSETS_TIMEOUT_S
        self.offsets_grace_s = OFFSETS_GRACE_S
        self.offsets_known_coordinator_s = OFFSETS_KNOWN_COORDINATOR_S
        self.offsets_check_s = OFFSETS_CHECK_S
        self.offsets_after_another_s = OFFSETS_AFTER_ANOTHER_S
        self.offsets_after_new_coordinator_s = OFFSETS_AFTER_NEW_COORDINATOR_S
        #: What the process's threads saw of their sendings and the group's coordinator.
        self.evidence = evidence if evidence is not None else OffsetsEvidence()
        if coordinator is not None:
            self.evidence.coordinators.append(coordinator)
        #: A sending of offsets slower than this gets its producer replaced after the commit.
        self.renew_after_offsets_s = RENEW_AFTER_OFFSETS_S
        self.renew_timeout_s = RENEW_TIMEOUT_S
        #: Transactions committed and failed, for tests and status.
        self.commits = 0
        self.failures = 0

    async def commit(self, force: bool = False) -> None:
        """One transaction per task with something to commit. ``force`` is accepted for the
        at-least-once committer's interface: a transaction commits during a rebalance too
        (its offsets are not a group commit)."""
        started = time.perf_counter()
        tasks = self._tasks()
        # The tasks' transactions are independent (a producer each): their flushes and
        # commits, round trips to the broker, overlap.
        outcomes = await asyncio.gather(*(self._commit_task(task) for task in tasks),
                                        return_exceptions=True)
        await self._fail_where_raised([task.task_id for task in tasks], outcomes,
                                      "its transaction failed, its writes are discarded")
        await self._renew_from_before_the_move(tasks)
        # Restoring tasks keep the producer that fenced their previous owner.
        await self._collector.producers.retain(self._held())
        if self.purger is not None:
            # Only the offsets of transactions that committed are in ``committed``.
            self.purger.after_commit(self._tasks(), self.committed)
        if self._metrics is not None:
            self._metrics.record_task_counts(self._label, task_counts(tasks))
            if any(task.processed for task in tasks):  # only a commit of some input counts
                self._metrics.observe_commit(self._label, time.perf_counter() - started)

    async def close(self) -> None:
        if self.purger is not None:
            await self.purger.close()

    async def _commit_task(self, task: StreamTask) -> None:
        task.purge_expired_windows()
        offsets = {tp: offset for tp, offset in task.processed.items()
                   if self.committed.get(tp) != offset}
        await self._collector.ship([task])
        transaction = self._collector.producers.transactions.get(task.task_id)
        if transaction is None or (not transaction.open and not offsets):
            return
        producer = transaction.producer
        if transaction.errors:
            raise TransactionFailed(f"sends failed: {transaction.errors[0]}",
                                    transaction.errors[0])
        if not transaction.open:
            producer.begin_transaction()
            transaction.open = True
        if offsets and self._positions is not None:
            # Every input partition's position, not only those that moved: the last
            # transaction's records then hold them all, and a reader finds them at the end.
            partition = self._positions.partition_of(task.task_id)
            for key, value in self._positions.records(task.processed):
                await transaction.produce(self._positions.topic, key, value,
                                          partition=partition)
        if offsets:
            # Before the flush: after a broker's SIGKILL the flush waits (9 s and more) for
            # the partitions' leaders to move, and the sending of offsets, started once the
            # group's coordinator moved meanwhile, could hang for as long as it is waited for
            # (see CallHung). Sent first, it finds the new coordinator as it moves, or is
            # given up while the flush would still be waiting.
            from confluent_kafka import TopicPartition as OffsetPartition

            if self._metadata is None:
                self._metadata = await asyncio.to_thread(self._group_metadata)
            sending = time.monotonic()
            await self._send_offsets(producer, [OffsetPartition(tp.topic, tp.partition, offset)
                                                for tp, offset in offsets.items()])
            renew = time.monotonic() - sending > self.renew_after_offsets_s
        else:
            renew = False
        unsent = await call_within(producer.flush, timeout_s=TRANSACTION_TIMEOUT_S,
                                   grace_s=self.call_grace_s)
        if transaction.errors:
            raise TransactionFailed(f"sends failed: {transaction.errors[0]}",
                                    transaction.errors[0])
        if unsent:
            raise TransactionFailed(f"{unsent} records still unsent after the flush")
        await commit_transaction(producer, task.task_id, self.commit_budget_s,
                                 self.call_grace_s)
        self.commits += 1
        # Committed: the changelog holds every write, the stores may apply their buffers.
        for acks in transaction.acks.values():
            acks.store.acknowledged(acks.end, acks.count)
        transaction.reset()
        for store in task.stores.values():
            store.commit()
        self.committed.update(offsets)
        if renew or self._coordinator_moved_since(transaction.since):
            try:
                await self._collector.producers.renew(task.task_id, self.renew_timeout_s)
            except Exception as exc:
                raise ProducerNotRenewed(f"committed, but its new producer could not start: "
                                         f"{type(exc).__name__}: {exc}") from exc

    async def _renew_from_before_the_move(self, tasks: list[StreamTask]) -> None:
        """Replace, between transactions, the producers made before the group's coordinator
        was found on another node. A commit through the move replaces its task's producer
        (``_commit_task``), but a task that committed before the SIGKILL, while its thread
        then waited on another task's hung call, kept its old producer, and its next sending
        of offsets hung on the dead broker (run S: given up 2.1 s after another task's went
        through, then a revival). The replacements run together: one ``init_transactions``
        for the thread (1.1 to 1.6 s); a task whose replacement fails is revived."""
        transactions = self._collector.producers.transactions
        stale = [task.task_id for task in tasks
                 if (transaction := transactions.get(task.task_id)) is not None
                 and not transaction.open and self._moved_since(transaction.since)]
        if not stale:
            return
        outcomes = await asyncio.gather(
            *(self._collector.producers.renew(
                task_id, self.renew_timeout_s,
                "made before the coordinator's move; its task was idle through it")
              for task_id in stale), return_exceptions=True)
        await self._fail_where_raised(
            stale, [ProducerNotRenewed(f"its producer from before the coordinator's move "
                                       f"could not be replaced: {type(exc).__name__}: {exc}")
                    if isinstance(exc, Exception) else exc for exc in outcomes],
            "its producer from before the coordinator's move could not be replaced")

    async def _fail_where_raised(self, task_ids: list[str], outcomes: list[Any],
                                 what: str) -> None:
        """Each task whose outcome is an exception is failed: counted, its producer dropped
        (an open transaction aborted) and handed to ``on_failed``; anything else than an
        Exception (a cancellation) propagates."""
        for task_id, exc in zip(task_ids, outcomes, strict=True):
            if isinstance(exc, BaseException) and not isinstance(exc, Exception):
                raise exc
            if exc is None:
                continue
            self.failures += 1
            log.warning("%s: task %s: %s: %s: %s", self._name, task_id, what,
                        type(exc).__name__, exc)
            await self._collector.producers.drop(task_id, failed=True)
            outcome = self._on_failed(task_id, exc)
            if outcome is not None:
                await outcome

    def _moved_since(self, since: float) -> bool:
        """Whether, after ``since``, a thread of the process lost the group's coordinator and
        one found it on another node: a move (a thread's first find of it, at its start, is
        not one, nor is a coordinator still loading found again on the same node)."""
        return (self.evidence.lost_since(since)
                and self.evidence.found_after(since) is not None)

    def _coordinator_moved_since(self, since: float) -> bool:
        """The group's consumer found its coordinator after ``since``, or has none now (it
        marked it dead, and looks for it): it moved, or is moving (or was lost and found
        again). A commit that ended while the consumer had none was followed by one whose
        offsets hung on its producer (run L of the fault suite)."""
        if self._coordinator_known_since is None:
            return False
        known = self._coordinator_known_since()
        return known is None or known > since

    async def _send_offsets(self, producer: Any, offsets: list[Any]) -> None:
        """``send_offsets_to_transaction`` within its bound, and given up sooner if the
        group's consumer has had a coordinator for ``offsets_known_coordinator_s`` while the
        call went on (see :data:`OFFSETS_KNOWN_COORDINATOR_S`), or another task's sending of
        offsets (of any thread of the process), started about as early or later, went
        through ``offsets_after_another_s`` ago (see :data:`OFFSETS_AFTER_ANOTHER_S`), or
        the group's coordinator was found on another node, after the call started,
        ``offsets_after_new_coordinator_s`` ago (see
        :data:`OFFSETS_AFTER_NEW_COORDINATOR_S`)."""
        started = time.monotonic()
        call = asyncio.ensure_future(call_within(
            producer.send_offsets_to_transaction, offsets, self._metadata,
            timeout_s=self.offsets_timeout_s, grace_s=self.offsets_grace_s))
        #: When the first sending seen to go through, started about as early or later, ended:
        #: the process's other threads go on committing, and the latest of theirs is always
        #: recent, so the wait counts from the first.
        evidence: float | None = None
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=self.offsets_check_s)
                if done:
                    result = call.result()
                    self.evidence.went_through(started, time.monotonic())
                    return result
                other = self.evidence.latest
                if (evidence is None and other is not None
                        and other[0] >= started - OFFSETS_STARTED_TOGETHER_S
                        and other[1] >= started):
                    evidence = other[1]
                if evidence is not None and not self.evidence.lost_since(started):
                    # Another's went through while the coordinator stayed put. Once it was
                    # lost meanwhile, what went through may have gone to coordinators still
                    # alive while this call's is dead, and a call given up before the move
                    # revives into a fencing that waits for it (17 s in run Q): the new
                    # coordinator's find counts instead (below).
                    waited = time.monotonic() - evidence
                    if waited >= self.offsets_after_another_s:
                        raise CallHung(f"send_offsets_to_transaction still waiting "
                                       f"{waited:.1f} s after another task's went through")
                found = self.evidence.found_after(started)
                if found is not None:
                    waited = time.monotonic() - found
                    if waited >= self.offsets_after_new_coordinator_s:
                        raise CallHung(f"send_offsets_to_transaction still waiting "
                                       f"{waited:.1f} s after the group's coordinator was "
                                       f"found on another node")
                since = (self._coordinator_known_since()
                         if self._coordinator_known_since is not None else None)
                if since is None:
                    continue
                waited = time.monotonic() - max(since, started)
                if waited >= self.offsets_known_coordinator_s:
                    raise CallHung(f"send_offsets_to_transaction still waiting {waited:.0f} s "
                                   f"after the group's coordinator answered its consumer")
        finally:
            if not call.done():
                call.cancel()
