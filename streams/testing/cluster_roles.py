"""Who does what in a running cluster, asked of it through the admin client: which broker
leads each partition of some topics, which coordinates a group (or a transactional id), and
which partitions have fewer in-sync replicas than replicas. The fault suite picks the broker
to kill from these, and a rolling restart waits on the last before it restarts the next
broker.

Each question is asked again, with a fresh client, while the answer is a retriable error
(for at most ``timeout_s``): a question asked while a broker is down may go to that broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

T = TypeVar("T")


async def _ask(bootstrap: str, question: Callable[[AIOKafkaAdminClient], Awaitable[T]],
               timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5_000)
        try:
            await admin.start()
            return await question(admin)
        except KafkaError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
        finally:
            await admin.close()
        await asyncio.sleep(0.2)


async def partition_leaders(bootstrap: str, topics: list[str],
                            timeout_s: float = 30.0) -> dict[tuple[str, int], int]:
    """``(topic, partition) -> leader's node id`` for every partition of ``topics`` that
    exists and has a leader now (-1 and errors are left out)."""

    async def ask(admin: AIOKafkaAdminClient) -> list[Any]:
        return await admin.describe_topics(sorted(topics))

    described = await _ask(bootstrap, ask, timeout_s)
    return {(t["topic"], p["partition"]): p["leader"]
            for t in described if t.get("error_code", 0) == 0
            for p in t["partitions"] if p.get("leader", -1) >= 0}


async def group_coordinator(bootstrap: str, group_id: str, coordinator_type: int = 0,
                            timeout_s: float = 30.0) -> int:
    """The node id of the broker that coordinates ``group_id`` now (``coordinator_type`` 1:
    the transaction coordinator of that transactional id). The first request for a
    coordinator makes Kafka create its internal topic; until that topic has leaders it
    answers "not available", which is asked again."""

    async def ask(admin: AIOKafkaAdminClient) -> int:
        return int(await admin.find_coordinator(group_id, coordinator_type))

    return await _ask(bootstrap, ask, timeout_s)


async def under_replicated(bootstrap: str, timeout_s: float = 30.0) -> list[tuple[str, int]]:
    """Every partition (internal topics included) whose in-sync replicas are fewer than its
    replicas, or that has no leader."""

    async def ask(admin: AIOKafkaAdminClient) -> list[Any]:
        return await admin.describe_topics(None)

    described = await _ask(bootstrap, ask, timeout_s)
    return sorted((t["topic"], p["partition"]) for t in described
                  for p in t["partitions"]
                  if p.get("leader", -1) < 0 or len(p["isr"]) < len(p["replicas"]))
