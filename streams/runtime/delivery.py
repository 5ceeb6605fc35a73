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

A send that fails is sticky: every later :meth:`Deliveries.wait_acknowledged` raises it, so no
commit ever passes input whose outputs or changelog records the broker refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from statestore.store import KeyValueStore

log = logging.getLogger(__name__)

#: How long a commit waits for the delivery reports of the records in flight.
FLUSH_TIMEOUT_S = 30.0
#: How long a stopping thread waits for records still in flight.
CLOSE_FLUSH_TIMEOUT_S = 5.0
#: How long a thread waits between two attempts at handing records to a full queue.
ROOM_WAIT_S = 0.005
#: aiokafka's request limit, which Relay's record size limit leaves room under.
MAX_MESSAGE_BYTES = 1_048_576


def new_data_producer(bootstrap_servers: str, client_id: str = "") -> Any:
    """The producer of a thread's data. Idempotent: retries keep each partition's order, which
    a changelog needs (a later write of a key must stay later). ``murmur2_random`` places keyed
    records where Java clients and aiokafka do (repartition topics rely on it). The queue is
    bounded (records and bytes) so that memory stays flat when the broker falls behind."""
    from confluent_kafka import Producer

    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "linger.ms": 5,
        "acks": "all",
        "enable.idempotence": True,
        "partitioner": "murmur2_random",
        "message.max.bytes": MAX_MESSAGE_BYTES,
        "queue.buffering.max.messages": 200_000,
        "queue.buffering.max.kbytes": 64 * 1024,
    }
    if client_id:
        settings["client.id"] = client_id
    # librdkafka's own log lines (a broker gone at shutdown) go through Python's logging.
    return Producer(settings, logger=log)


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

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self._errors: list[Any] = []
        self._stores: dict[int, StoreDeliveries] = {}
        self._failure: BaseException | None = None

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(err)

    def for_store(self, store: KeyValueStore) -> StoreDeliveries:
        # Keyed by identity: a store reopened meanwhile is another object, whose records
        # these acknowledgements must not count.
        tracked = self._stores.get(id(store))
        if tracked is None:
            tracked = self._stores[id(store)] = StoreDeliveries(store)
        return tracked

    def hand(self, records: list[Any], start: int, topic: str | None = None,
             partition: int | None = None, store: StoreDeliveries | None = None) -> int:
        """Hand ``records[start:]`` to the producer until its queue is full; returns the index
        of the first record not handed. Each record is an output (with ``topic``, ``key``,
        ``value``, ``timestamp_ms``) or, with ``topic`` and ``store`` given, a changelog
        ``(key, value)`` pair for ``partition``."""
        if store is None:
            return hand_outputs(self.producer.produce, records, start, self._delivered)
        index = hand_changelog(self.producer.produce, records, start, topic or "", partition,
                               store.delivered)
        store.handed += index - start
        return index

    async def room(self) -> None:
        """Wait a moment for the full queue to drain (serving the reports that arrived)."""
        self.producer.poll(0)
        await asyncio.sleep(ROOM_WAIT_S)

    async def send(self, topic: str, key: bytes | None, value: bytes | None,
                   headers: list[tuple[str, bytes]] | None = None) -> None:
        """One record (a dead letter), waiting for room while the queue is full."""
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, headers=headers,
                                      on_delivery=self._delivered)
                return
            except BufferError:
                await self.room()

    def serve(self) -> None:
        """Serve the delivery reports that arrived, without waiting."""
        self.producer.poll(0)

    async def wait_acknowledged(self) -> None:
        """Every record handed so far is acknowledged (each store's changelog position moves
        on); raises the first send error, then and at every later call."""
        if self._failure is not None:
            raise self._failure
        if len(self.producer):
            remaining = await asyncio.to_thread(self.producer.flush, FLUSH_TIMEOUT_S)
        else:
            remaining = 0
        errors = [*self._errors, *(e for s in self._stores.values() for e in s.errors)]
        if errors:
            self._failure = DeliveryError(f"the broker refused a record: {errors[0]}")
            raise self._failure
        for key, tracked in list(self._stores.items()):
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
                                f"{FLUSH_TIMEOUT_S:.0f}s")

    async def close(self) -> None:
        """Wait briefly for what is in flight (records no commit covers: delivered, they
        are only not repeated); the producer is released with this object."""
        if len(self.producer):
            await asyncio.to_thread(self.producer.flush, CLOSE_FLUSH_TIMEOUT_S)
