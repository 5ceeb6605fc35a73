"""Public: a reader of a topic's committed records, for checking what an exactly-once app
wrote, on any broker.

A ``read_committed`` consumer must skip the records of aborted transactions. Apache Kafka
tells it which ones (the fetch response lists them); the embedded broker (Tansu 0.6) does not,
so an ordinary client with ``isolation.level=read_committed`` sees aborted records there.
This reader tells aborted from committed by the transactions' own markers in the log, as
Relay's runtime does, so it is right on both.

    records = await read_committed("localhost:9092", "counts-out")
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from aiokafka.structs import TopicPartition

from statestore.fetch import ChangelogFetcher, FetchSettings
from statestore.serdes import Serde, serde_from_name

# The DSL's own serde names (``windowed``) are registered by their modules: a reader of an
# app's outputs takes every name the app writes with.
from streams.dsl import windows as _windowed_serde  # noqa: F401


class ReadTimeout(TimeoutError):
    """The topic could not be read to its end in time (no leader, an unknown topic)."""


async def read_committed(
    bootstrap_servers: str,
    topic: str,
    *,
    key_serde: str | Serde = "msgpack",
    value_serde: str | Serde = "msgpack",
    partitions: Iterable[int] | None = None,
    timeout_s: float = 60.0,
) -> list[tuple[Any, Any]]:
    """Every committed record of ``topic`` (``partitions``, all by default) up to its end as
    of the call, as ``(key, value)`` decoded with the serdes (``bytes`` reads them raw),
    partition by partition in offset order. Records of aborted transactions are left out, and
    a partition is read only up to a transaction still open on it. Raises
    :class:`ReadTimeout` when that takes longer than ``timeout_s``."""
    keys, values = serde_from_name(key_serde), serde_from_name(value_serde)
    fetcher = ChangelogFetcher(bootstrap_servers, "relay-read-committed",
                               FetchSettings(committed_by_markers=True))
    deadline = time.monotonic() + timeout_s
    await fetcher.start()
    try:
        fetcher.track(topic)
        wanted = sorted(partitions) if partitions is not None else await _partitions(
            fetcher, topic, deadline)
        positions = {TopicPartition(topic, p): 0 for p in wanted}
        read: dict[TopicPartition, list[tuple[Any, Any]]] = {tp: [] for tp in positions}
        done: set[TopicPartition] = set()
        while len(done) < len(positions):
            if time.monotonic() > deadline:
                left = sorted(tp.partition for tp in set(positions) - done)
                raise ReadTimeout(f"{topic} not read to its end within {timeout_s}s "
                                  f"(partitions left: {left})")
            for fetched in await fetcher.fetch({tp: o for tp, o in positions.items()
                                                if tp not in done}):
                read[fetched.tp] += [(None if k is None else keys.loads(k),
                                      None if v is None else values.loads(v))
                                     for k, v in fetched.changes]
                positions[fetched.tp] = fetched.next_offset
                # At the end, or at a transaction still open (the end then is where it
                # starts): what is committed so far. A fetch that brought nothing for a
                # partition (the response filled up with others') says nothing of it.
                if fetched.end is not None and fetched.next_offset >= fetched.end:
                    done.add(fetched.tp)
        return [record for tp in sorted(read) for record in read[tp]]
    finally:
        await fetcher.close()


async def _partitions(fetcher: ChangelogFetcher, topic: str, deadline: float) -> list[int]:
    while True:
        known = fetcher.client.cluster.partitions_for_topic(topic)
        if known:
            return sorted(known)
        if time.monotonic() > deadline:
            raise ReadTimeout(f"topic {topic} has no partitions the broker knows of")
        await fetcher.client.force_metadata_update()
        await asyncio.sleep(0.2)
