"""The control topic's follower on a real broker: reading the topic to its end, which a
member running tasks that learners follow does before every join, must not wait behind the
follower's own fetch (a broker answers a connection's requests in turn, and a fetch that finds
nothing new is held for its max wait)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaProducer

from streams.group.control import (
    ControlListener,
    LeavingMark,
    control_topic_name,
    encode_mark,
)
from streams.group.round_alarm import ROUND_BEGUN_KEY, encode_round_begun
from tests.broker.streams.harness import create_topics
from tests.conftest import wait_until

pytestmark = pytest.mark.broker

#: Far longer than the catch-up's bound: a catch-up that asked behind the idle fetch would
#: wait for all of it.
IDLE_FETCH_WAIT_MS = 30_000


async def new_control_topic(bootstrap: str, app_id: str) -> tuple[str, str]:
    """An app id and its control topic, created."""
    topic = control_topic_name(app_id)
    await create_topics(bootstrap, {topic: 1})
    return app_id, topic


async def test_reading_to_the_end_does_not_wait_behind_an_idle_fetch(
    bootstrap: str, unique: Callable[[str], str],
) -> None:
    app_id, topic = await new_control_topic(bootstrap, unique("control-end"))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, key=b"w1", value=None)
    finally:
        await producer.stop()
    listener = ControlListener(bootstrap, app_id, "w2", on_mark=lambda mark: None,
                               fetch_max_wait_ms=IDLE_FETCH_WAIT_MS)
    stop = asyncio.Event()
    following = asyncio.create_task(listener.run(stop))
    try:
        # The one record is read; the follower's next fetch then waits for news.
        await wait_until(lambda: listener._handled == 1, timeout_s=30)
        assert await listener.read_to_end(5.0)
    finally:
        stop.set()
        await asyncio.wait_for(following, IDLE_FETCH_WAIT_MS / 1000 + 10)


async def test_another_members_round_news_reaches_the_alarm_and_garbage_is_skipped(
    bootstrap: str, unique: Callable[[str], str],
) -> None:
    app_id, topic = await new_control_topic(bootstrap, unique("control-round"))
    listener = ControlListener(bootstrap, app_id, "w2", on_mark=lambda mark: None)
    begun: list[tuple[int, bool]] = []
    listener.on_round_begun = lambda generation, by_broker: begun.append((generation, by_broker))
    stop = asyncio.Event()
    following = asyncio.create_task(listener.run(stop))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await wait_until(lambda: listener._handled == 0, timeout_s=30)
        # Garbage first: skipped with a warning, and the news after it still heard.
        await producer.send_and_wait(topic, key=ROUND_BEGUN_KEY, value=b"\xc1")
        await producer.send_and_wait(topic, key=ROUND_BEGUN_KEY, value=encode_round_begun(5))
        await producer.send_and_wait(topic, key=ROUND_BEGUN_KEY,
                                     value=encode_round_begun(6, begun=False))
        await wait_until(lambda: begun == [(5, True), (6, False)], timeout_s=30,
                         message="the news heard")
        assert not following.done()
    finally:
        await producer.stop()
        stop.set()
        await asyncio.wait_for(following, 30)


async def test_a_mark_cleared_before_the_start_is_not_acted_on(
    bootstrap: str, unique: Callable[[str], str],
) -> None:
    """An instance restarted after its scale-down reads its old mark, then the tombstone it
    wrote as it left: it must not hand over again. A mark still set is acted on once read."""
    app_id, topic = await new_control_topic(bootstrap, unique("control-marks"))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    mark = LeavingMark(since_ms=1_000, scale_down_timeout_ms=60_000)
    try:
        for key, value in ((b"w2", encode_mark(mark)), (b"w3", encode_mark(mark)),
                           (b"w2", None), (b"w1", None)):
            await producer.send_and_wait(topic, key=key, value=value)
    finally:
        await producer.stop()
    seen: dict[str, list[LeavingMark | None]] = {"w2": [], "w3": []}
    listeners = [ControlListener(bootstrap, app_id, name, on_mark=seen[name].append)
                 for name in seen]
    stop = asyncio.Event()
    following = [asyncio.create_task(listener.run(stop)) for listener in listeners]
    try:
        await wait_until(lambda: all(listener._handled == 4 for listener in listeners),
                         timeout_s=30)
        await wait_until(lambda: seen["w3"] == [mark], timeout_s=10)
        assert seen["w2"] == []
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*following), 30)
