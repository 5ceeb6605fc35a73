"""A consumer whose start fails is stopped before the error propagates: followers that retry
while a broker is down would otherwise leave one unclosed consumer per try."""

from __future__ import annotations

from typing import Any

import pytest

from streams.kafka import started_consumer as module


class _Consumer:
    made: list[_Consumer] = []
    fails = False

    def __init__(self, **settings: Any) -> None:
        self.settings, self.started, self.stopped = settings, False, False
        _Consumer.made.append(self)

    async def start(self) -> None:
        if _Consumer.fails:
            raise ConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")
        self.started = True

    async def stop(self) -> None:
        self.stopped = True


@pytest.mark.parametrize("fails", [False, True])
async def test_a_consumer_that_fails_to_start_is_stopped(
    monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    monkeypatch.setattr(module, "AIOKafkaConsumer", _Consumer)
    monkeypatch.setattr(_Consumer, "made", [])
    monkeypatch.setattr(_Consumer, "fails", fails)
    if fails:
        with pytest.raises(ConnectionError, match="Unable to bootstrap"):
            await module.started_consumer(bootstrap_servers="127.0.0.1:1")
    else:
        consumer = await module.started_consumer(bootstrap_servers="127.0.0.1:1")
        assert consumer is _Consumer.made[0] and consumer.started
    [made] = _Consumer.made
    assert made.settings == {"bootstrap_servers": "127.0.0.1:1"}
    assert made.stopped == fails
