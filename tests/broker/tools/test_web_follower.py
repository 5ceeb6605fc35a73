"""The web view's topic follower on the real broker: status records, leaving marks and
undecodable records written to an app's topics reach the model, and later ones keep coming."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import msgpack
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from statestore.topics import COMPACTED, TopicSpec, ensure_topics
from streams.group.control import (
    REBALANCE_KEY,
    ROUND_KEY,
    LeavingMark,
    control_topic_name,
    encode_mark,
    encode_round_report,
)
from streams.group.status_topic import status_topic_name
from tests.broker.streams.harness import produce
from tests.conftest import wait_until
from tests.unit.tools.test_web_model import status
from tools.web.follower import GroupFollower
from tools.web.model import GroupModel

pytestmark = pytest.mark.broker


async def test_the_follower_feeds_the_model(bootstrap: str,
                                            unique: Callable[[str], str]) -> None:
    app = unique("follow")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, [TopicSpec(status_topic_name(app), 1, COMPACTED),
                                    TopicSpec(control_topic_name(app), 1, COMPACTED)])
    finally:
        await admin.close()
    now = int(time.time() * 1000)
    first = status("a", active=("0_0", "0_1"), leader=True, at=now).value
    await produce(bootstrap, status_topic_name(app), [
        (b"a-thread-0", msgpack.packb(first)),
        (b"b-thread-0", b"\xc1 not msgpack"),
    ], raw=True)
    await produce(bootstrap, control_topic_name(app), [
        (REBALANCE_KEY, b"learners ready"),  # not a mark: ignored
        (ROUND_KEY, encode_round_report("member-a", 3)),  # not a mark either
        (b"a", encode_mark(LeavingMark(now, 60_000))),
    ], raw=True)

    model = GroupModel(app)
    changes: list[int] = []
    follower = GroupFollower(bootstrap, model, lambda: changes.append(1))
    stop = asyncio.Event()
    following = asyncio.create_task(follower.run(stop))
    try:
        def view() -> dict:
            return model.view(int(time.time() * 1000))

        await wait_until(lambda: follower.caught_up and bool(view()["leaving"]), timeout_s=30,
                         message="the follower to read the status and the mark")
        seen = view()
        assert [t["active"] for t in seen["tasks"]] == ["a-thread-0", "a-thread-0"]
        assert seen["leader"] == "a-thread-0"
        assert seen["leaving"][0]["deadline_ms"] == now + 60_000
        assert seen["unreadable_records"] == 1
        assert "undecodable status record of 'b-thread-0' at offset 1" in seen["last_error"]
        assert changes and follower.error is None

        later = status("a", active=("0_0",), leader=True, at=int(time.time() * 1000)).value
        await produce(bootstrap, status_topic_name(app),
                      [(b"a-thread-0", msgpack.packb(later))], raw=True)
        await wait_until(lambda: [t["active"] for t in view()["tasks"]] == ["a-thread-0", None],
                         timeout_s=30, message="the follower to keep following")
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(following, 30)
