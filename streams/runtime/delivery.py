"""The at-least-once data producer: a confluent-kafka producer that a stream thread hands its
outputs, dead letters and changelog records to without awaiting each one, and the tracking of
their delivery reports.

aiokafka's producer costs about 9 µs of CPU and one future per record, which capped a thread
at about 38,000 records/s passed through; librdkafka takes a record in about 2 µs. Records
are handed synchronously (``produce``); a full queue (``BufferError``) is the only place the
handing waits, so records not handed when a stopping thread is cancelled there stay with
their caller. Delivery reports are served on the event loop's thread by ``poll(0)`` after
each batch, and at commit by a ``flush`` in a worker thread (the loop keeps heartbeating
meanwhile). The callbacks only append, which is safe from either thread; the counting is done
on the loop's thread once the flush returned.

**A zombie's queued records expire.** A process stopped (SIGSTOP, a frozen VM) past its
session loses its partitions to another member; when it resumes, its Python side finds its
silence at once (:mod:`streams.kafka.silence`) and drops its tasks uncommitted, but the
records it had queued before the stop belong to librdkafka's own threads, which would send
them as soon as they run: after the new owner's newer outputs, so that a key's last record
would be an older, smaller count. The producer's ``message.timeout.ms`` (counted from
``produce``) is therefore shorter than the stop it takes to lose the partitions
(:func:`message_timeout_ms`), and librdkafka checks it before it sends: its broker thread's
serving loop (``rd_kafka_broker_producer_serve``) runs the timeout scan on the first pass
after each state change and whenever a second has passed since the last (the monotonic clock
counts the stop), and ``rd_kafka_toppar_producer_serve`` scans both the partition's queue and
its transmit queue (``rd_kafka_broker_toppar_msgq_scan``, ``rd_kafka_msgq_age_scan``) before
it moves records into a produce request; an idempotent producer that timed records out then
sends nothing until it has drained and bumped its epoch. So every record queued before a stop
longer than the timeout is reported ``_MSG_TIMED_OUT`` instead of sent. The window left:
records already built into a produce request that was not yet written to the socket when the
process stopped (at most ``linger.ms`` of records, handed in the last moments before it), and
a stop that lands in the broker thread between its reading of the clock and its serving of
the queues (microseconds). A request written before the stop reaches the broker during the
stop, before any new owner has its partitions.

A record not delivered (timed out, purged) means the input it came from is processed again:
the commit leaves its task's offsets out and the task runs again in place from its last
commit (:mod:`streams.runtime.delivery_errors`), its outputs repeated, nothing lost; a broker
failover longer than the timeout ends so. A record the broker refused otherwise is sticky:
every later :meth:`Deliveries.wait_acknowledged` raises it, so no commit ever passes input
whose outputs or changelog records the broker refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from statestore.store import KeyValueStore
from streams.runtime.delivery_errors import described, judge, producer_lost

log = logging.getLogger(__name__)

#: How long a commit waits for the delivery reports of the records in flight (at least: see
#: :func:`flush_timeout_s`).
FLUSH_TIMEOUT_S = 30.0
#: How long past the records' own timeout a commit waits for their reports.
FLUSH_MARGIN_S = 5.0
#: The shortest ``message.timeout.ms``: a record handed during a commit must have the time of
#: a few produce round trips under load.
MESSAGE_TIMEOUT_FLOOR_MS = 1_000
#: How long a stopping thread waits for records still in flight.
CLOSE_FLUSH_TIMEOUT_S = 5.0
#: How long a thread waits between two attempts at handing records to a full queue.
ROOM_WAIT_S = 0.005
#: aiokafka's request limit, which Relay's record size limit leaves room under.
MAX_MESSAGE_BYTES = 1_048_576


def message_timeout_ms(session_timeout_ms: int, heartbeat_interval_ms: int) -> int:
    """The data producer's ``message.timeout.ms``: the session less one heartbeat interval.

    The member's last heartbeat before a stop went out at most one interval before it, so the
    broker expires the member, and another one may take its partitions, no sooner than
    ``session - heartbeat`` after the stop began. A record handed before the stop expires at
    most that long after it: by the time the stop has cost the partitions, every record
    queued before it has expired, and the timeout scan that runs when the process resumes
    drops it before any send. A shorter timeout would only fail more records in a broker's
    failover (each a revival); a longer one would let a zombie's records through. The floor
    (1 s) matters only for sessions Kafka's default ``group.min.session.timeout.ms`` (6 s)
    refuses anyway."""
    return max(MESSAGE_TIMEOUT_FLOOR_MS, session_timeout_ms - heartbeat_interval_ms)


def flush_timeout_s(timeout_ms: int) -> float:
    """How long a commit waits for its reports: past the records' own timeout, so that it
    returns with every record reported, delivered or timed out."""
    return max(FLUSH_TIMEOUT_S, timeout_ms / 1000 + FLUSH_MARGIN_S)


def data_producer_settings(bootstrap_servers: str, client_id: str,
                           timeout_ms: int) -> dict[str, Any]:
    """The settings of a thread's data producer. Idempotent: retries keep each partition's
    order, which a changelog needs (a later write of a key must stay later).
    ``murmur2_random`` places keyed records where Java clients and aiokafka do (repartition
    topics rely on it). The queue is bounded (records and bytes) so that memory stays flat
    when the broker falls behind. ``timeout_ms``: each record's ``message.timeout.ms`` (see
    :func:`message_timeout_ms`)."""
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "linger.ms": 5,
        "acks": "all",
        "enable.idempotence": True,
        "partitioner": "murmur2_random",
        "message.max.bytes": MAX_MESSAGE_BYTES,
        "queue.buffering.max.messages": 200_000,
        "queue.buffering.max.kbytes": 64 * 1024,
        "message.timeout.ms": timeout_ms,
    }
    if client_id:
        settings["client.id"] = client_id
    return settings


def new_data_producer(bootstrap_servers: str, client_id: str, timeout_ms: int) -> Any:
    """The producer of a thread's data (see :func:`data_producer_settings`)."""
    from confluent_kafka import Producer

    # librdkafka's own log lines (a broker gone at shutdown) go through Python's logging.
    return Producer(data_producer_settings(bootstrap_servers, client_id, timeout_ms),
                    logger=log)


def hand_outputs(produce: Callable[..., None], outputs: list[Any], start: int,
                 on_delivery: Callable[[Any, Any], None]) -> int:
    """Hand ``outputs[start:]`` (each with ``topic``, ``key``, ``value``, ``timestamp_ms``,
    ``headers``) to
    a confluent-kafka ``produce`` until its queue is full; returns the index of the first
    one not handed (the caller waits for room and calls again)."""
    index = start
    try:
        for output in outputs[start:]:
            headers = getattr(output, "headers", None)
            if headers:
                produce(output.topic, value=output.value, key=output.key,
                        timestamp=output.timestamp_ms, headers=list(headers),
                        on_delivery=on_delivery)
            elif output.timestamp_ms:
                produce(output.topic, value=output.value, key=output.key,
                        timestamp=output.timestamp_ms, on_delivery=on_delivery)
            else:
                produce(output.topic, value=output.value, key=output.key,
                        on_delivery=on_delivery)
            index += 1
    except BufferError:
        pass  # the queue is full
    return index


def hand_changelog(produce: Callable[..., None], records: list[Any], start: int, topic: str,
                   partition: int | None, on_delivery: Callable[[Any, Any], None]) -> int:
    """:func:`hand_outputs` for a store's changelog ``(key, value)`` pairs, to ``partition``
    of ``topic``."""
    index = start
    try:
        for key, value in records[start:]:
            produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
            index += 1
    except BufferError:
        pass  # the queue is full
    return index


class DeliveryError(Exception):
    """The broker refused a record (or its delivery timed out)."""


@dataclass
class StoreDeliveries:
    """The changelog records of one store handed since the last acknowledgement: the offsets
    the broker reported for them."""

    store: KeyValueStore
    #: The task whose store it is.
    task_id: str = ""
    handed: int = 0
    offsets: list[int] = field(default_factory=list)
    errors: list[Any] = field(default_factory=list)

    def delivered(self, err: Any, msg: Any) -> None:
        # Called from whichever thread polls or flushes the producer: appends only.
        if err is not None:
            self.errors.append(err)
        else:
            self.offsets.append(msg.offset())


class Deliveries:
    """The records a thread handed its data producer, until the broker acknowledged them."""

    def __init__(self, producer: Any, flush_timeout_s: float = FLUSH_TIMEOUT_S,
                 new_producer: Callable[[], Any] | None = None) -> None:
        self.producer = producer
        self.flush_timeout_s = flush_timeout_s
        #: Makes the producer that replaces one that can send nothing more (None: such a
        #: producer's errors are refusals, fatal to the thread).
        self.new_producer = new_producer
        #: Producers replaced so far.
        self.replaced = 0
        #: The failed deliveries of outputs and dead letters, with their task's id.
        self._errors: list[tuple[str, Any]] = []
        self._callbacks: dict[str, Callable[[Any, Any], None]] = {}
        self._stores: dict[int, StoreDeliveries] = {}
        self._failure: BaseException | None = None

    def _callback(self, task_id: str) -> Callable[[Any, Any], None]:
        """The delivery callback of ``task_id``'s outputs and dead letters (one per task)."""
        callback = self._callbacks.get(task_id)
        if callback is None:
            errors = self._errors

            def callback(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append((task_id, err))
            self._callbacks[task_id] = callback
        return callback

    def for_store(self, store: KeyValueStore, task_id: str = "") -> StoreDeliveries:
        # Keyed by identity: a store reopened meanwhile is another object, whose records
        # these acknowledgements must not count.
        tracked = self._stores.get(id(store))
        if tracked is None:
            tracked = self._stores[id(store)] = StoreDeliveries(store, task_id)
        return tracked

    def hand(self, records: list[Any], start: int, topic: str | None = None,
             partition: int | None = None, store: StoreDeliveries | None = None,
             task_id: str = "") -> int:
        """Hand ``records[start:]`` to the producer until its queue is full; returns the index
        of the first record not handed. Each record is an output of ``task_id`` (with
        ``topic``, ``key``, ``value``, ``timestamp_ms``) or, with ``topic`` and ``store``
        given, a changelog ``(key, value)`` pair for ``partition``."""
        if store is None:
            return hand_outputs(self.producer.produce, records, start,
                                self._callback(task_id))
        index = hand_changelog(self.producer.produce, records, start, topic or "", partition,
                               store.delivered)
        store.handed += index - start
        return index

    async def room(self) -> None:
        """Wait a moment for the full queue to drain (serving the reports that arrived)."""
        self.producer.poll(0)
        await asyncio.sleep(ROOM_WAIT_S)

    async def send(self, topic: str, key: bytes | None, value: bytes | None,
                   headers: list[tuple[str, bytes]] | None = None, task_id: str = "") -> None:
        """One record (a dead letter of ``task_id``), waiting for room while the queue is
        full."""
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, headers=headers,
                                      on_delivery=self._callback(task_id))
                return
            except BufferError:
                await self.room()

    def serve(self) -> None:
        """Serve the delivery reports that arrived, without waiting."""
        self.producer.poll(0)

    async def wait_reported(self) -> frozenset[str] | None:
        """Wait until every record handed so far is reported, delivered or not (judged
        later, by :meth:`wait_acknowledged`); returns the tasks with outputs or dead letters
        not delivered, or None if some records are still unreported after the flush's
        timeout."""
        if len(self.producer):
            remaining = await asyncio.to_thread(self.producer.flush, self.flush_timeout_s)
            if remaining:
                return None
        return frozenset(task_id for task_id, _ in self._errors)

    async def wait_acknowledged(self, running: Iterable[str] = ()) -> frozenset[str]:
        """Every record handed so far is reported (each store's changelog position moves on
        with the acknowledged ones). Returns the tasks among ``running`` whose records were
        not delivered (timed out, purged: see :mod:`streams.runtime.delivery_errors`), whose
        input must be processed again; their stores are not acknowledged. Raises the first
        refusal, then and at every later call."""
        if self._failure is not None:
            raise self._failure
        if len(self.producer):
            remaining = await asyncio.to_thread(self.producer.flush, self.flush_timeout_s)
        else:
            remaining = 0
        errors = [*self._errors,
                  *((s.task_id, e) for s in self._stores.values() for e in s.errors)]
        verdict = judge(errors, running)
        if verdict.producer_lost and self.new_producer is None:
            lost = next(err for _, err in errors if producer_lost(err))
            self._failure = DeliveryError(f"the producer can send nothing more: {lost}")
            raise self._failure
        if verdict.refusal is not None:
            self._failure = DeliveryError(f"the broker refused a record: {verdict.refusal}")
            raise self._failure
        if verdict.producer_lost:
            self._replace_producer(errors)
        if errors:
            log.warning("%d records of tasks %s were not delivered (%s): their input since "
                        "the last commit is processed again", len(errors),
                        sorted({task_id for task_id, _ in errors}), described(errors[0][1]))
        # Settled: a task whose records did not get through is revived (new stores) or is
        # no longer this thread's; nothing of its old stores is acknowledged.
        self._errors.clear()
        failed = {task_id for task_id, _ in errors}
        for key, tracked in list(self._stores.items()):
            if tracked.task_id in failed:
                del self._stores[key]
                continue
            acked = len(tracked.offsets)
            if acked:
                # Swapped out before counting: a report that a flush outliving a cancelled
                # commit still delivers is not counted, so the store stays unacknowledged (it
                # refuses to commit) rather than acknowledged for a record it never got.
                offsets, tracked.offsets = tracked.offsets, []
                acked = len(offsets)
                tracked.store.acknowledged(max(offsets) + 1, acked)
                tracked.handed -= acked
            if tracked.handed <= 0:
                del self._stores[key]
        if remaining:
            raise DeliveryError(f"{remaining} records not acknowledged after "
                                f"{self.flush_timeout_s:.0f}s")
        return verdict.replay

    def _replace_producer(self, errors: list[tuple[str, Any]]) -> None:
        """The producer can send nothing more: drop what it still holds (its records are
        reported not delivered, and their tasks run again) and send with a new one, with a
        new producer id, from here on."""
        assert self.new_producer is not None
        lost = next(err for _, err in errors if producer_lost(err))
        old, self.producer = self.producer, self.new_producer()
        self.replaced += 1
        purge = getattr(old, "purge", None)
        if purge is not None:
            with contextlib.suppress(Exception):
                purge(in_queue=True, in_flight=True, blocking=False)
        log.warning("the data producer can send nothing more (%s): replaced by a new one; "
                    "the tasks whose records it held run again from their last commit", lost)

    def discard_queued(self) -> None:
        """Drop the records still queued, not yet in a request: their tasks were stopped
        uncommitted (lost with the membership), and their new owner writes them again. Their
        reports (``_PURGE_QUEUE``) revive nothing: the tasks are no longer this thread's."""
        purge = getattr(self.producer, "purge", None)
        if purge is not None and len(self.producer):
            purge(in_queue=True, in_flight=False, blocking=False)

    async def close(self) -> None:
        """Wait briefly for what is in flight (records no commit covers: delivered, they
        are only not repeated); the producer is released with this object."""
        if len(self.producer):
            await asyncio.to_thread(self.producer.flush, CLOSE_FLUSH_TIMEOUT_S)
