"""The app's topology as each process publishes it once per start on the app's control topic
(key :data:`TOPOLOGY_KEY`), for ``relay web`` to draw without importing the app.

The record is msgpack: ``{"format": 1, "instance_id", "published_ms", "description"}``, the
description in :meth:`streams.dsl.describe.TopologyDescription.to_data`'s form. The topic is
compacted, so it keeps the latest one. A reader skips, with a warning, a record of another
format or a malformed one (:func:`decode_topology_record` raises ValueError).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from streams.dsl.describe import TopologyDescription, description_from_data

#: The key of the topology records on the control topic.
TOPOLOGY_KEY = b"__topology__"
#: The envelope's version; a record of another one is skipped by readers.
RECORD_FORMAT = 1


@dataclass(frozen=True)
class PublishedTopology:
    description: TopologyDescription
    #: The instance that published it, and when (ms since the epoch).
    instance_id: str
    published_ms: int


def encode_topology_record(description: TopologyDescription, instance_id: str,
                           now_ms: int) -> bytes:
    return msgpack.packb({"format": RECORD_FORMAT, "instance_id": instance_id,
                          "published_ms": now_ms, "description": description.to_data()})


def decode_topology_record(raw: bytes) -> PublishedTopology:
    """The published topology; raises ValueError for a record of another format, or an
    undecodable or malformed one."""
    try:
        data: Any = msgpack.unpackb(raw, raw=False)
    except Exception as exc:
        raise ValueError(f"undecodable topology record ({len(raw)} bytes): {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"a topology record is a map, not {type(data).__name__}")
    if data.get("format") != RECORD_FORMAT:
        raise ValueError(f"topology record of format {data.get('format')!r}, not "
                         f"{RECORD_FORMAT} (published by another version of Relay)")
    instance, published = data.get("instance_id"), data.get("published_ms")
    if not isinstance(instance, str) or not isinstance(published, int):
        raise ValueError(f"topology record without its instance_id and published_ms: "
                         f"{instance!r}, {published!r}")
    return PublishedTopology(description_from_data(data.get("description")), instance,
                             published)
