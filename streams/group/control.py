"""The control channel: instructions to instances of an app, on the compacted topic
``<application_id>-control`` keyed by group instance id. It needs nothing but Kafka.

``relay mark-leaving`` writes ``{"leaving": true, "since_ms": …, "scale_down_timeout_ms": …}``
for an instance; every member follows the topic and the marked instance rejoins with the
leaving flag. When the instance has handed everything over it deletes its mark (a tombstone),
so that it can later start again as a normal member.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from streams.group.promotion_asks import PROMOTION_KEY, PromotionAsk, decode_ask
from streams.group.round_alarm import ROUND_BEGUN_KEY, decode_round_begun
from streams.group.topology_record import TOPOLOGY_KEY
from streams.kafka.topic_reader import read_to_end

log = logging.getLogger(__name__)


def control_topic_name(application_id: str) -> str:
    return f"{application_id}-control"


#: Key of the records that ask the group's leader to rejoin: the leader rejoining always
#: starts a round (a static follower's rejoin may not, on some brokers), and a member stuck
#: joining for longer than a round or two gets the group going again this way.
REBALANCE_KEY = b"__rebalance__"
#: Key of the records in which a leader tells static members which assignment it computed
#: for each (a digest), so that one that missed the round rejoins for it.
FETCH_KEY = b"__fetch__"
#: Key of the records in which a static member publishes its current subscription: a broker
#: may keep a static follower's old metadata when it rejoins a stable group.
SUBSCRIPTION_KEY = b"__subscription__"
#: Key of the records in which a member reports that it has its assignment of a generation,
#: so that a member about to ask for the next round can wait until the whole round has its
#: assignments (see :mod:`streams.quirks.synced_round`).
ROUND_KEY = b"__round__"
#: Every key of a control message that is not an instance's leaving mark, so that readers
#: of the topic (the web view) can tell them apart; a new message kind is added here.
CONTROL_MESSAGE_KEYS = (REBALANCE_KEY, FETCH_KEY, SUBSCRIPTION_KEY, ROUND_KEY, PROMOTION_KEY,
                        TOPOLOGY_KEY, ROUND_BEGUN_KEY)


def encode_round_report(member_id: str, generation: int) -> bytes:
    return msgpack.packb([member_id, generation])


def decode_round_report(raw: bytes) -> tuple[str, int]:
    """``(member id, generation)``; raises ValueError for a malformed record."""
    try:
        member_id, generation = msgpack.unpackb(raw, raw=False)
        if not isinstance(member_id, str) or not isinstance(generation, int):
            raise TypeError(f"{member_id!r}, {generation!r}")
        return member_id, generation
    except Exception as exc:
        raise ValueError(f"malformed round report ({len(raw)} bytes): {exc}") from exc


@dataclass(frozen=True)
class LeavingMark:
    since_ms: int
    scale_down_timeout_ms: int | None


def encode_mark(mark: LeavingMark) -> bytes:
    return msgpack.packb({"leaving": True, "since_ms": mark.since_ms,
                          "scale_down_timeout_ms": mark.scale_down_timeout_ms})


def decode_mark(raw: bytes | None) -> LeavingMark | None:
    """A mark, or None for a tombstone; raises ValueError for a malformed record."""
    if raw is None:
        return None
    try:
        data = msgpack.unpackb(raw, raw=False)
        if not (isinstance(data, dict) and data.get("leaving") is True):
            raise ValueError("not a leaving mark")
        timeout = data.get("scale_down_timeout_ms")
        return LeavingMark(int(data["since_ms"]), None if timeout is None else int(timeout))
    except Exception as exc:
        raise ValueError(f"malformed control record ({len(raw)} bytes): {exc}") from exc


async def read_marks(bootstrap: str, application_id: str) -> dict[str, LeavingMark] | None:
    """The leaving marks in force, by group instance id, as the control topic holds them at
    its end now (a tombstone takes a mark back; a malformed mark is skipped with a warning);
    None while the app has no control topic (it never ran)."""
    records = await read_to_end(bootstrap, control_topic_name(application_id))
    if records is None:
        return None
    marks: dict[str, LeavingMark] = {}
    for record in records:
        if record.key is None or record.key in CONTROL_MESSAGE_KEYS:
            continue
        readable, mark = readable_mark(record)
        if not readable:
            continue
        instance = record.key.decode(errors="replace")
        if mark is None:
            marks.pop(instance, None)
        else:
            marks[instance] = mark
    return marks


def readable_mark(record: Any) -> tuple[bool, LeavingMark | None]:
    """``(True, the mark or None for a tombstone)`` of an instance's control record, or
    ``(False, None)``, with a warning, for a malformed one (which its readers skip)."""
    try:
        return True, decode_mark(record.value)
    except ValueError as exc:
        log.warning("ignoring control record at offset %d: %s", record.offset, exc)
        return False, None


class LeavingState:
    """Whether this instance is marked as leaving, as its threads read it:
    ``(leaving, since_ms, scale_down_timeout_ms)``."""

    def __init__(self) -> None:
        self.mark: LeavingMark | None = None

    def current(self) -> tuple[bool, int | None, int | None]:
        if self.mark is None:
            return (False, None, None)
        return (True, self.mark.since_ms, self.mark.scale_down_timeout_ms)


class RoundNews(Protocol):
    """What the broker's quirks read on the control topic (streams.quirks.hooks)."""

    def on_fetch_request(self, digests: dict[str, str]) -> None: ...

    def on_subscription(self, static_id: str, data: bytes) -> None: ...

    def on_round_report(self, member_id: str, generation: int) -> None: ...


class AskRecorder(Protocol):
    def record(self, ask: PromotionAsk) -> None: ...


class ControlListener:
    """Follows the control topic and calls ``on_mark`` when this instance's mark changes."""

    def __init__(
        self,
        bootstrap: str,
        application_id: str,
        instance_id: str | None,
        on_mark: Callable[[LeavingMark | None], None],
        on_rebalance_request: Callable[[str], None] = lambda reason: None,
        on_fetch_request: Callable[[dict[str, str]], None] = lambda digests: None,
        on_subscription: Callable[[str, bytes], None] = lambda static_id, data: None,
        on_round_report: Callable[[str, int], None] = lambda member_id, generation: None,
        on_promotion_ask: Callable[[PromotionAsk], None] = lambda ask: None,
        fetch_max_wait_ms: int = 500,
    ) -> None:
        self._on_promotion_ask = on_promotion_ask
        #: Told the generation whose round another member heard has begun
        #: (streams.group.round_alarm).
        self.on_round_begun: Callable[[int, bool], object] = (
            lambda generation, begun: None)
        #: The offset after the last record handled (-1: not reading yet).
        self._handled = -1
        self._topic = control_topic_name(application_id)
        self._instance = instance_id.encode() if instance_id else None
        self._on_mark = on_mark
        self._on_rebalance_request = on_rebalance_request
        self._on_fetch_request = on_fetch_request
        self._on_subscription = on_subscription
        self._on_round_report = on_round_report
        self._started_ms = 0
        self._fetch_max_wait_ms = fetch_max_wait_ms
        # Its clients are made by run(): an app that stops before it runs (a topology
        # error at start) leaves none unclosed.
        self._ends: AIOKafkaConsumer | None = None
        self._ends_started = False
        self._bootstrap = bootstrap
        self.current: LeavingMark | None = None

    def listen(self, news: RoundNews, asks: AskRecorder) -> None:
        """Hand the quirks' records to ``news`` and the promotion asks to ``asks``."""
        self._on_fetch_request = news.on_fetch_request
        self._on_subscription = news.on_subscription
        self._on_round_report = news.on_round_report
        self._on_promotion_ask = asks.record

    async def run(self, stop: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, enable_auto_commit=False,
                                    auto_offset_reset="earliest",
                                    fetch_max_wait_ms=self._fetch_max_wait_ms)
        # The topic's end is asked on a connection of its own: a broker answers a connection's
        # requests in turn, so on the follower's it would wait behind a fetch that finds
        # nothing new (up to its max wait), and a joining member waits for that answer.
        self._ends = AIOKafkaConsumer(bootstrap_servers=self._bootstrap,
                                      enable_auto_commit=False)
        try:
            await consumer.start()
            self._started_ms = int(time.time() * 1000)
            tp = TopicPartition(self._topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            self._handled = 0
            # Marks written before this start are acted on only once all of them are read:
            # an instance restarted after its scale-down reads its old mark, then the
            # tombstone it wrote as it left, and must not hand over on the first alone.
            backlog_end = 0
            try:
                await self._ends.start()
                self._ends_started = True
                # Once now: the first ask of a partition's end looks up its leader (and
                # waits a retry's backoff), and a member's first join would wait for that.
                backlog_end = (await self._ends.end_offsets([tp])).get(tp, 0)
            except Exception as exc:  # read_to_end then tells its callers it could not tell
                log.warning("control topic: no connection to ask its end on (%s)", exc)
            mark_waits = False
            while not stop.is_set():
                if mark_waits and self._handled >= backlog_end:
                    mark_waits = False
                    if self.current is not None:
                        self._on_mark(self.current)
                batches = await consumer.getmany(timeout_ms=300)
                for records in batches.values():
                    for record in records:
                        self._handled = record.offset + 1
                        if record.key == TOPOLOGY_KEY:
                            continue  # for the web view (streams.group.topology_record)
                        if record.key == PROMOTION_KEY:
                            self._news(record, lambda raw: self._on_promotion_ask(
                                decode_ask(raw)))
                            continue
                        if record.key == SUBSCRIPTION_KEY:
                            if record.timestamp >= self._started_ms and record.value:
                                with contextlib.suppress(Exception):
                                    static_id, data = msgpack.unpackb(record.value, raw=False)
                                    self._on_subscription(str(static_id), bytes(data))
                            continue
                        if record.key == ROUND_BEGUN_KEY:
                            self._news(record, lambda raw: self.on_round_begun(
                                *decode_round_begun(raw)))
                            continue
                        if record.key == ROUND_KEY:
                            self._news(record, lambda raw: self._on_round_report(
                                *decode_round_report(raw)))
                            continue
                        if record.key == FETCH_KEY:
                            if record.timestamp >= self._started_ms and record.value:
                                with contextlib.suppress(Exception):
                                    digests = msgpack.unpackb(record.value, raw=False)
                                    self._on_fetch_request(
                                        {str(k): str(v) for k, v in digests.items()})
                            continue
                        if record.key == REBALANCE_KEY:
                            if record.timestamp >= self._started_ms and record.value:
                                self._on_rebalance_request(record.value.decode(errors="replace"))
                            continue
                        if self._instance is None or record.key != self._instance:
                            continue
                        readable, mark = readable_mark(record)
                        if not readable:
                            continue
                        if mark != self.current:
                            self.current = mark
                            if record.offset + 1 < backlog_end:
                                mark_waits = True
                            else:
                                mark_waits = False
                                self._on_mark(mark)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()
            self._ends_started = False
            with contextlib.suppress(Exception):
                await self._ends.stop()

    def _news(self, record: Any, handle: Callable[[bytes], object]) -> None:
        """Hand a message written since this listener started to ``handle``; one it cannot
        decode (a ValueError) is skipped with a warning, and the listener goes on."""
        if record.timestamp < self._started_ms or not record.value:
            return
        try:
            handle(record.value)
        except ValueError as exc:
            log.warning("ignoring control record at offset %d: %s", record.offset, exc)

    async def read_to_end(self, timeout_s: float) -> bool:
        """Wait until every record on the topic as of now has been handled (at most
        ``timeout_s``); False if that could not be told in time."""
        tp = TopicPartition(self._topic, 0)
        deadline = time.monotonic() + timeout_s
        if not self._ends_started or self._ends is None:
            return False
        try:
            ends = await asyncio.wait_for(self._ends.end_offsets([tp]), timeout_s)
        except Exception as exc:
            log.debug("control topic's end unknown: %s", exc)
            return False
        end = ends.get(tp, 0)
        while self._handled < end:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def request_rebalance(self, reason: str) -> None:
        await self._send(REBALANCE_KEY, reason.encode())

    async def publish_subscription(self, static_id: str, data: bytes) -> None:
        await self._send(SUBSCRIPTION_KEY, msgpack.packb([static_id, data]))

    async def request_fetch(self, digests: dict[str, str]) -> None:
        await self._send(FETCH_KEY, msgpack.packb(digests))

    async def publish_topology(self, record: bytes) -> None:
        try:
            await self._send(TOPOLOGY_KEY, record)
        except Exception as exc:  # the app runs on; only the web view lacks its drawing
            log.warning("could not publish the topology on %s: %s", self._topic, exc)

    async def _send(self, key: bytes, value: bytes) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self._bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(self._topic, key=key, value=value)
        finally:
            await producer.stop()

    async def clear_mark(self) -> None:
        """Delete this instance's mark once it has left."""
        producer = AIOKafkaProducer(bootstrap_servers=self._bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(self._topic, key=self._instance, value=None)
        finally:
            await producer.stop()


class ControlChannel:
    """The control topic as a process's stream threads use it: a listener, and messages sent
    in the background (a thread's rebalance callback must not wait for them)."""

    def __init__(self, listener: ControlListener) -> None:
        self.listener = listener
        self._background: set[asyncio.Task[None]] = set()

    def request_rebalance(self, reason: str) -> None:
        """Ask the group's leader to rejoin (the leader rejoining always starts a round)."""
        self._in_background(self.listener.request_rebalance(reason))

    def publish_subscription(self, static_id: str, data: bytes) -> None:
        self._in_background(self.listener.publish_subscription(static_id, data))

    def request_fetch(self, digests: dict[str, str]) -> None:
        if digests:
            self._in_background(self.listener.request_fetch(digests))

    def publish_topology(self, record: bytes) -> None:
        """The app's topology, for the web view (streams.group.topology_record)."""
        self._in_background(self.listener.publish_topology(record))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Let messages sent on the way out (a leaving leader's last word to its followers)
        go out before the control client stops."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout_s)
