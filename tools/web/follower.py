"""Follows an app's status and control topics from their beginning and keeps following,
feeding each record, with its timestamp as arrival time, into a :class:`GroupModel`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import msgpack
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from streams.group.control import CONTROL_MESSAGE_KEYS, control_topic_name, decode_mark
from streams.group.status_topic import status_topic_name
from streams.group.topology_record import TOPOLOGY_KEY, decode_topology_record
from streams.kafka.started_consumer import started_consumer
from streams.queries.routing import RoutingTable, now_ms
from tools.web.model import (
    STALE_AFTER_MS,
    GroupModel,
    MarkRecord,
    StatusRecord,
    TopologyRecord,
)

log = logging.getLogger(__name__)
RETRY_S = 2.0
#: How often the follower asks the broker for the topics' ends, and how long it waits for an
#: answer: a consumer whose broker went away just fetches nothing, so silence alone cannot
#: tell an idle group from a lost broker.
PROBE_EVERY_S = 5.0
PROBE_TIMEOUT_S = 5.0


def to_model_record(status_topic: str, record: ConsumerRecord,
                    model: GroupModel) -> StatusRecord | MarkRecord | TopologyRecord | None:
    """The model's record for a consumer record; None for records the view does not show
    (the control topic's other messages) and for undecodable ones (counted in the model,
    with a warning for a topology record: one of a newer Relay is skipped, not shown)."""
    at = record.timestamp if record.timestamp and record.timestamp > 0 \
        else int(time.time() * 1000)
    key = record.key.decode(errors="replace") if record.key else None
    if record.topic == status_topic:
        if key is None:
            model.reject(f"status record without a key at offset {record.offset}")
            return None
        if record.value is None:
            return StatusRecord(key, None, at)
        try:
            value = msgpack.unpackb(record.value, raw=False)
        except Exception as exc:
            model.reject(f"undecodable status record of {key!r} at offset {record.offset}: "
                         f"{exc}")
            return None
        return StatusRecord(key, value, at)
    if record.key == TOPOLOGY_KEY and record.value is not None:
        try:
            return TopologyRecord(decode_topology_record(record.value), at)
        except ValueError as exc:
            log.warning("skipping the topology record at offset %d: %s", record.offset, exc)
            model.reject(f"topology record at offset {record.offset}: {exc}")
            return None
    if record.key in CONTROL_MESSAGE_KEYS or key is None:
        return None
    try:
        return MarkRecord(key, decode_mark(record.value), at)
    except ValueError as exc:
        model.reject(f"control record of {key!r} at offset {record.offset}: {exc}")
        return None


class GroupFollower:
    """Keeps ``model`` up to date; calls ``on_change`` after each batch that changed it.

    Broker errors are kept in :attr:`error` (shown by the page) and the follower retries.
    """

    def __init__(self, bootstrap: str, model: GroupModel, on_change: Callable[[], None],
                 routes: RoutingTable | None = None) -> None:
        self.bootstrap = bootstrap
        self.model = model
        self.on_change = on_change
        #: Fed the status records too, for forwarding interactive queries.
        self.routes = routes
        self.error: str | None = None
        self.caught_up = False
        self._answered_ms: int | None = None
        self._status = status_topic_name(model.app)
        self._control = control_topic_name(model.app)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._follow(stop)
            except (KafkaError, OSError) as exc:
                self.error = f"lost the broker at {self.bootstrap}: {exc}; retrying"
                log.warning("%s", self.error)
                self.on_change()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RETRY_S)

    async def _follow(self, stop: asyncio.Event) -> None:
        consumer = await started_consumer(bootstrap_servers=self.bootstrap,
                                          enable_auto_commit=False)
        try:
            # Only topics that exist: asking for a missing one has some brokers create it
            # with their default partition count.
            topics = await consumer.topics()
            tps = [TopicPartition(t, 0) for t in (self._status, self._control) if t in topics]
            if not tps:
                raise KafkaError(f"no topic {self._status}: is {self.model.app} running?")
            consumer.assign(tps)
            await self._seek_start(consumer, tps)
            self.error = None
            self._answered_ms = int(time.time() * 1000)
            next_probe = time.monotonic() + PROBE_EVERY_S
            while not stop.is_set():
                if time.monotonic() >= next_probe:
                    await self._probe(consumer, tps)
                    next_probe = time.monotonic() + PROBE_EVERY_S
                batches = await consumer.getmany(timeout_ms=500)
                records = sorted((r for rs in batches.values() for r in rs),
                                 key=lambda r: r.timestamp)
                for record in records:
                    converted = to_model_record(self._status, record, self.model)
                    if converted is not None:
                        self.model.apply(converted)
                    if self.routes is not None and isinstance(converted, StatusRecord):
                        self.routes.apply(converted.member, converted.value, now_ms())
                if not self.caught_up and await self._at_end(consumer, tps):
                    self.caught_up = True
                if records or self.error:
                    self.on_change()
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def _probe(self, consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> None:
        """Sets :attr:`error` while the broker does not answer (the view is frozen as of its
        last answer), and clears it once it answers again."""
        try:
            await asyncio.wait_for(consumer.end_offsets(tps), PROBE_TIMEOUT_S)
        except (KafkaError, OSError, TimeoutError) as exc:
            if self._answered_ms is not None and self.error is None:
                since = time.strftime("%H:%M:%S", time.localtime(self._answered_ms / 1000))
                self.error = (f"no answer from the broker at {self.bootstrap} since {since} "
                              f"({str(exc) or type(exc).__name__}): the view shows the "
                              f"group as of then; retrying")
                log.warning("%s", self.error)
                self.on_change()
            return
        self._answered_ms = int(time.time() * 1000)
        if self.error is not None:
            log.info("the broker at %s answers again", self.bootstrap)
            self.error = None
            self.on_change()

    async def _seek_start(self, consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> None:
        """Marks are read from the start (a mark stays valid however old); the status topic
        from the start of the timeline's window, so that a long history is not replayed. A
        broker that does not look offsets up by time (some answer offset 0) gets the whole
        topic replayed, which is slower but shows the same."""
        await consumer.seek_to_beginning(*tps)
        status = TopicPartition(self._status, 0)
        since = int(time.time() * 1000) - self.model.window_ms - STALE_AFTER_MS
        try:
            found = await consumer.offsets_for_times({status: since})
        except (KafkaError, ValueError) as exc:
            log.info("replaying %s from its start: %s", self._status, exc)
            return
        if found.get(status) is not None:
            consumer.seek(status, found[status].offset)
        else:  # nothing published within the window
            await consumer.seek_to_end(status)

    @staticmethod
    async def _at_end(consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> bool:
        for tp in tps:
            highwater = consumer.highwater(tp)
            if highwater is None or await consumer.position(tp) < highwater:
                return False
        return True
