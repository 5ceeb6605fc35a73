"""Broker clients the state-store tests share: an admin client and a producer, each stopped
after its test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient


@pytest.fixture
async def admin(bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    client = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await client.start()
    yield client
    await client.close()


@pytest.fixture
async def producer(bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:
    client = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await client.start()
    yield client
    await client.stop()
