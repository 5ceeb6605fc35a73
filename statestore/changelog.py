"""The changelog writer: sends the records a task's stores queued to their changelog topics and
reports each acknowledgement back to its store, which commits only once every record it
queued was acknowledged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata

from statestore.store import KeyValueStore


class ChangelogWriter:
    """Ships queued store writes through a shared producer and tracks their acknowledgements."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer
        self._in_flight: list[tuple[KeyValueStore, asyncio.Future[RecordMetadata]]] = []

    async def send_pending(self, stores: Iterable[KeyValueStore]) -> int:
        """Hand every queued record of ``stores`` to the producer; returns how many."""
        sent = 0
        for store in stores:
            topic = store.changelog_topic
            records = store.drain_changelog()
            if topic is None or not records:
                continue
            handed = 0
            try:
                for key, value in records:
                    future = await self._producer.send(
                        topic, value=value, key=key, partition=store.partition
                    )
                    self._in_flight.append((store, future))
                    handed += 1
            finally:
                # A send waits when the producer's buffer is full; cancelled there (a thread
                # stopping), the records not yet handed over must stay queued, or the input
                # offsets committed next would cover state the changelog never got.
                store.requeue_changelog(records[handed:])
            sent += handed
        return sent

    async def wait_acknowledged(self) -> None:
        """Wait for every record sent so far; raises the first send error."""
        in_flight, self._in_flight = self._in_flight, []
        if not in_flight:
            return
        results = await asyncio.gather(*(future for _, future in in_flight))
        acked: dict[int, tuple[KeyValueStore, int, int]] = {}
        for (store, _), metadata in zip(in_flight, results, strict=True):
            _, count, end = acked.get(id(store), (store, 0, 0))
            acked[id(store)] = (store, count + 1, max(end, metadata.offset + 1))
        for store, count, end in acked.values():
            store.acknowledged(end, count)

    async def flush(self, stores: Iterable[KeyValueStore]) -> None:
        stores = list(stores)
        await self.send_pending(stores)
        await self.wait_acknowledged()
