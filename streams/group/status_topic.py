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

from streams.kafka.topic_reader import read_to_end

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
    latest: dict[str, dict[str, Any]] = {}
    for r in await read_to_end(bootstrap, status_topic_name(application_id)) or []:
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
            log.warning("skipping an unreadable status record at offset %d", r.offset)
    return latest
