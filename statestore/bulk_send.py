"""Producing many records with a bounded number unacknowledged: used where records are
written in bulk (snapshot seeding, the pipeline's topic writer, benchmark fills), so memory
stays flat and a failed send surfaces within one window."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata


class BoundedSender:
    """Sends through ``producer``; after ``window`` sends, waits for all of them."""

    def __init__(self, producer: AIOKafkaProducer, window: int = 20_000) -> None:
        self._producer = producer
        self._window = window
        self._pending: list[asyncio.Future[RecordMetadata]] = []

    async def send(self, topic: str, **kwargs: Any) -> None:
        self._pending.append(await self._producer.send(topic, **kwargs))
        if len(self._pending) >= self._window:
            await self.flush()

    async def flush(self) -> None:
        """Wait for every record sent so far; raises the first send error."""
        pending, self._pending = self._pending, []
        await asyncio.gather(*pending)
