"""Member status: what each member runs, published on the compacted topic
``<application_id>-status`` keyed by member (``<instance>-thread-<n>``).

A broker's DescribeGroups does not return members' assignments, so ``relay describe`` reads
this topic, and a static member checks it at start for a live member already using its id.
Interactive queries are routed by it too: a member serving queries publishes its endpoint,
and every member the layout of the app's stores (:mod:`streams.queries.routing`).
"""

from __future__ import annotations

import logging
from typing import Any

import msgpack
from aiokafka.structs import TopicPartition

from streams.kafka.started_consumer import started_consumer

log = logging.getLogger(__name__)


def status_topic_name(application_id: str) -> str:
    return f"{application_id}-status"


async def read_status(bootstrap: str, application_id: str,
                      departures: dict[str, int] | None = None) -> dict[str, dict[str, Any]]:
    """The latest status record of every member (tombstones removed); empty while the app
    has not created its status topic yet (reading it then would have some brokers create it
    with their default partition count, which the app would refuse). ``departures``, if
    given, gets the time (ms) of each member's tombstone that is its latest record: when it
    stopped."""
    consumer = await started_consumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    latest: dict[str, dict[str, Any]] = {}
    try:
        topic = status_topic_name(application_id)
        if topic not in await consumer.topics():
            return latest
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        while True:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for r in records:
                    key = r.key.decode(errors="replace") if r.key else "?"
                    if r.value is None:
                        latest.pop(key, None)
                        if departures is not None:
                            departures[key] = r.timestamp
                        continue
                    if departures is not None:
                        departures.pop(key, None)
                    try:
                        latest[key] = msgpack.unpackb(r.value, raw=False)
                    except Exception:
                        log.warning("skipping an unreadable status record at offset %d",
                                    r.offset)
            highwater = consumer.highwater(tp)
            if highwater is not None and await consumer.position(tp) >= highwater:
                break
    finally:
        await consumer.stop()
    return latest
