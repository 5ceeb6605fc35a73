"""Where a key's state lives in the group, from what members publish on the status topic.

Each member's status record names the tasks it runs and restores, its copies and their lag,
the layout of the app's stores (:meth:`streams.queries.store_layout.StoreLayout.to_status`)
and, when it
serves queries, its query endpoint. :class:`RoutingTable` folds those records in (pure: the
clock is passed in) and answers which member to forward a key's query to;
:class:`StatusFollower` keeps one up to date from the topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from streams.group.status_topic import status_topic_name
from streams.kafka.started_consumer import started_consumer
from streams.queries.store_layout import StoreLayout

log = logging.getLogger(__name__)

#: A member that published nothing for this long is not routed to (it may have died).
LIVE_WITHIN_MS = 15_000
RETRY_S = 2.0


@dataclass(frozen=True)
class Route:
    """A member that holds a key's task: its endpoint, its role there and its copy's lag."""

    member: str
    instance_id: str
    endpoint: str
    role: str  # "active", "standby", "learner"
    lag: int | None


class RoutingTable:
    """The latest status record of every member, for routing queries."""

    def __init__(self) -> None:
        self._members: dict[str, tuple[Mapping[str, Any], int]] = {}
        #: Status records that could not be read (counted, and the last reason kept).
        self.rejected = 0
        self.last_rejection: str | None = None

    def apply(self, member: str, value: Mapping[str, Any] | None, now_ms: int) -> None:
        """Fold in one status record (None: the member stopped)."""
        if value is None:
            self._members.pop(member, None)
            return
        if not isinstance(value, Mapping):
            self.rejected += 1
            self.last_rejection = f"status of {member!r} is not a map"
            return
        self._members[member] = (value, now_ms)

    def _live(self, now_ms: int) -> dict[str, Mapping[str, Any]]:
        return {member: value for member, (value, at) in self._members.items()
                if now_ms - _int(value.get("updated_ms"), at) <= LIVE_WITHIN_MS}

    def layouts(self, now_ms: int) -> dict[str, StoreLayout | str]:
        """Every store a live member publishes, with its layout, or why it cannot be used."""
        found: dict[str, StoreLayout | str] = {}
        for value in self._live(now_ms).values():
            stores = value.get("stores")
            if not isinstance(stores, Mapping):
                continue
            for name, raw in stores.items():
                if isinstance(found.get(name), StoreLayout):
                    continue
                try:
                    found[str(name)] = StoreLayout.from_status(str(name), raw)
                except ValueError as exc:
                    found[str(name)] = str(exc)
        return found

    def routes(self, task: str, now_ms: int) -> list[Route]:
        """The live members holding ``task`` and serving queries: the active first, then
        copies by lag. A member restoring the task is listed with role ``restoring``."""
        found: list[Route] = []
        for member, value in sorted(self._live(now_ms).items()):
            endpoint = value.get("query_endpoint")
            if not isinstance(endpoint, str) or not endpoint:
                continue
            instance = str(value.get("instance_id", ""))
            if task in _tasks(value.get("active")):
                found.append(Route(member, instance, endpoint, "active", 0))
            elif task in _tasks(value.get("restoring")):
                found.append(Route(member, instance, endpoint, "restoring", None))
            for role, field in (("standby", "standbys"), ("learner", "learners")):
                lags = value.get(field)
                if isinstance(lags, Mapping) and task in lags:
                    found.append(Route(member, instance, endpoint, role, _int(lags[task], None)))
        order = {"active": 0, "restoring": 1, "standby": 2, "learner": 2}
        return sorted(found, key=lambda r: (order[r.role], r.lag if r.lag is not None
                                            else 2**62, r.member))

    def endpoints(self, now_ms: int) -> dict[str, str]:
        """Live members' query endpoints by member."""
        return {member: str(value["query_endpoint"])
                for member, value in self._live(now_ms).items()
                if isinstance(value.get("query_endpoint"), str)}


def _tasks(value: Any) -> set[str]:
    return {t for t in value if isinstance(t, str)} if isinstance(value, list | tuple) else set()


def _int(value: Any, default: Any) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def now_ms() -> int:
    return int(time.time() * 1000)


class StatusTable(Protocol):
    """What folds status records in: a routing table, the group's learners."""

    rejected: int
    last_rejection: str | None

    def apply(self, member: str, value: Mapping[str, Any] | None, now_ms: int) -> None: ...


class StatusFollower:
    """Keeps a table (a routing table, the group's learners) up to date from the app's
    status topic, from its beginning (it is compacted: one record per member); retries when
    the broker goes away."""

    def __init__(self, bootstrap: str, application_id: str, table: StatusTable) -> None:
        self.bootstrap = bootstrap
        self.topic = status_topic_name(application_id)
        self.table = table
        self.error: str | None = None

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._follow(stop)
            except (KafkaError, OSError) as exc:
                self.error = f"status topic {self.topic}: {exc}; retrying"
                log.warning("%s", self.error)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RETRY_S)

    async def _follow(self, stop: asyncio.Event) -> None:
        consumer = await started_consumer(bootstrap_servers=self.bootstrap,
                                          enable_auto_commit=False)
        try:
            tp = TopicPartition(self.topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            self.error = None
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=500)
                for records in batches.values():
                    for record in records:
                        self.apply(record.key, record.value)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        member = key.decode(errors="replace")
        if value is None:
            self.table.apply(member, None, now_ms())
            return
        try:
            decoded = msgpack.unpackb(value, raw=False)
        except Exception as exc:
            self.table.rejected += 1
            self.table.last_rejection = f"undecodable status record of {member!r}: {exc}"
            return
        self.table.apply(member, decoded, now_ms())
