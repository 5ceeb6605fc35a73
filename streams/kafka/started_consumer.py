"""A started aiokafka consumer, stopped again when its start fails.

aiokafka's ``start()`` can fail half-way (a broker that does not answer): the consumer then
holds what it opened, and is reported unclosed when it is collected. Code that retries a
follower every few seconds while a broker is down would leave one such consumer per try.
"""

from __future__ import annotations

import contextlib
from typing import Any

from aiokafka import AIOKafkaConsumer


async def started_consumer(**settings: Any) -> AIOKafkaConsumer:
    """``AIOKafkaConsumer(**settings)``, started; if its start fails, it is stopped before the
    error propagates."""
    consumer = AIOKafkaConsumer(**settings)
    try:
        await consumer.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await consumer.stop()
        raise
    return consumer
