"""DeleteRecords, the one request that moves a partition's log start offset on: what purges a
repartition topic (:mod:`streams.runtime.repartition_purge` decides what to delete).

It goes through confluent-kafka's admin client, which finds each partition's leader, picks
the request version the broker speaks, and answers each partition on its own (aiokafka's
admin client stops at the first partition that fails). Its answers arrive on a thread of
librdkafka's and are awaited here without blocking the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from aiokafka.structs import TopicPartition

log = logging.getLogger(__name__)

#: How long one DeleteRecords may take, lookup of the leaders included.
DELETE_TIMEOUT_S = 30.0


class RecordDeleter:
    """Deletes the records of partitions below given offsets. The admin client is made on
    first use: a thread with nothing to purge never opens its connections."""

    def __init__(self, bootstrap_servers: str, client_id: str,
                 timeout_s: float = DELETE_TIMEOUT_S) -> None:
        self._config = {"bootstrap.servers": bootstrap_servers, "client.id": client_id}
        self._timeout_s = timeout_s
        self._admin: Any = None

    async def delete_before(self, offsets: Mapping[TopicPartition, int],
                            ) -> dict[TopicPartition, int | Exception]:
        """Delete each partition's records below its offset: per partition, its log start
        offset afterwards (its low watermark), or what went wrong."""
        from confluent_kafka import TopicPartition as AdminPartition
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            # librdkafka's own log lines (a broker gone) go through Python's logging.
            self._admin = AdminClient(self._config, logger=log)
        futures = self._admin.delete_records(
            [AdminPartition(tp.topic, tp.partition, offset) for tp, offset in offsets.items()],
            request_timeout=self._timeout_s, operation_timeout=self._timeout_s)
        results: dict[TopicPartition, int | Exception] = {}
        for asked, future in futures.items():
            tp = TopicPartition(asked.topic, asked.partition)
            try:
                deleted = await asyncio.wait_for(asyncio.wrap_future(future),
                                                 self._timeout_s + 5)
                results[tp] = int(deleted.low_watermark)
            except Exception as exc:
                results[tp] = exc
        return results

    def close(self) -> None:
        """Let the admin client go (it has no close of its own): its connections end."""
        self._admin = None
