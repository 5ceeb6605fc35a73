"""The aiokafka driver: the one place that reads or changes aiokafka's private state.

aiokafka 0.14 has no public API for what a stream thread needs to know about its group:
its member id and generation, whether a rebalance is under way (and since when), whether a
rejoin is already pending, or a way to ask for a rejoin. :class:`GroupConsumer` wraps the
consumer and answers those from the coordinator's internals, next to the consumer calls the
thread makes, so that the rest of the runtime speaks only to this interface (and tests can
hand the thread a fake with the same methods). The cooperative coordinator it installs is in
:mod:`streams.cooperative`. aiokafka is pinned to 0.14.* while this relies on its internals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.client import AIOKafkaClient, ConnectionGroup
from aiokafka.consumer.fetcher import OffsetResetStrategy
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaError,
    RebalanceInProgressError,
    for_code,
)
from aiokafka.protocol.group import HeartbeatRequest
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from streams import cooperative
from streams.config import AppConfig

log = logging.getLogger(__name__)

#: Errors of an offset commit that mean "a rebalance is under way": the next commit carries
#: the offsets.
COMMIT_DEFERRED_ERRORS = (CommitFailedError, RebalanceInProgressError, IllegalStateError,
                          TimeoutError)


class GroupConsumer:
    """A group member's consumer, and what the runtime needs to know about its group."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self._consumer = consumer

    # -- the consumer's public API ---------------------------------------------------------

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    def subscribe(self, topics: list[str], listener: ConsumerRebalanceListener) -> None:
        self._consumer.subscribe(topics, listener=listener)

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        return await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._consumer.seek(tp, offset)

    async def seek_to_beginning(self, tp: TopicPartition) -> None:
        """Move ``tp`` to its earliest offset. The reset is requested, not waited for: the
        fetcher does not fetch the partition before it has resolved the position, and
        waiting (up to a fetch's max wait, 0.5 s) would hold the thread's processing of its
        other tasks meanwhile."""
        fetcher = getattr(self._consumer, "_fetcher", None)
        if fetcher is None or tp not in self._consumer.assignment():
            await self._consumer.seek_to_beginning(tp)  # raises for a partition not assigned
            return
        resolved = fetcher.request_offset_reset([tp], OffsetResetStrategy.EARLIEST)
        resolved.add_done_callback(_retrieve_outcome)

    def pause(self, *tps: TopicPartition) -> None:
        self._consumer.pause(*tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._consumer.resume(*tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self._consumer.assignment())

    def highwater(self, tp: TopicPartition) -> int | None:
        """The partition's high watermark from the last fetch (None before one): its end.
        ListOffsets latest is not trusted for that (see the broker notes)."""
        if tp not in self._consumer.assignment():
            return None  # aiokafka asserts the partition is assigned
        return self._consumer.highwater(tp)

    async def committed(self, tp: TopicPartition) -> int | None:
        return await self._consumer.committed(tp)

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        await self._consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in offsets.items()})

    # -- the group, from the coordinator's internals ----------------------------------------

    @property
    def _coordinator(self) -> Any:
        return getattr(self._consumer, "_coordinator", None)

    @property
    def member_id(self) -> str:
        return str(getattr(self._coordinator, "member_id", "") or "")

    @property
    def generation(self) -> int:
        return int(getattr(self._coordinator, "generation", -1))

    @property
    def rebalancing(self) -> bool:
        """Between join-prepare and join-complete (see the cooperative coordinator)."""
        return bool(getattr(self._coordinator, "rebalancing", False))

    def rebalancing_for_s(self, now: float | None = None) -> float:
        """How long the member has been joining the current round (0 when it is not)."""
        since = getattr(self._coordinator, "rebalancing_since", None)
        if not self.rebalancing or since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - since

    @property
    def round_started(self) -> float | None:
        """When (monotonic seconds) the member entered its latest round, if it did."""
        return getattr(self._coordinator, "round_started", None)

    @property
    def rejoin_pending(self) -> bool:
        """A rejoin was asked for and has not started yet."""
        coordinator = self._coordinator
        future = getattr(coordinator, "_rejoin_needed_fut", None)
        return bool(future is not None and future.done())

    def request_rejoin(self) -> None:
        coordinator = self._coordinator
        if coordinator is not None:
            coordinator.request_rejoin()

    async def heartbeat(self) -> str | None:
        """Send one Heartbeat of this member's own and return the broker's error name (None
        when answered without error, "NOT_A_MEMBER" when the member has no member id).

        Broker quirk (Tansu 0.6, the leader wedge): in a forming group LeaveGroup removes the
        member but keeps it as the group's leader, so a leader leaving mid-round wedges the
        group. A member about to leave asks with this heartbeat whether the group is formed
        (see :mod:`streams.formed_group`). On Apache Kafka it is one extra heartbeat.
        """
        coordinator = self._coordinator
        if coordinator is None or not self.member_id:
            return "NOT_A_MEMBER"
        node = getattr(coordinator, "coordinator_id", None)
        if node is None:
            return "COORDINATOR_UNKNOWN"
        request = HeartbeatRequest(coordinator.group_id, self.generation, self.member_id)
        try:
            response = await self._consumer._client.send(
                node, request, group=ConnectionGroup.COORDINATION)
        except (KafkaError, OSError, TimeoutError) as exc:
            return type(exc).__name__
        if not response.error_code:
            return None
        return str(for_code(response.error_code).__name__)


def _retrieve_outcome(future: Any) -> None:
    # Nobody waits for the reset; an error of it is the fetcher's to retry, but unretrieved
    # it would be reported as "never retrieved".
    if not future.cancelled():
        future.exception()


def new_group_consumer(
    config: AppConfig, bootstrap_servers: str, static_id: str | None, index: int,
    assignor: AbstractPartitionAssignor,
) -> GroupConsumer:
    """A consumer in the app's group, with the cooperative coordinator installed."""
    cooperative.install()
    return GroupConsumer(AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        group_id=config.application_id,
        group_instance_id=static_id,
        client_id=f"{config.application_id}-{static_id or index}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        partition_assignment_strategy=(assignor,),
        session_timeout_ms=config.session_timeout_ms,
        heartbeat_interval_ms=config.heartbeat_interval_ms,
        max_poll_interval_ms=config.max_poll_interval_ms,
        rebalance_timeout_ms=config.max_poll_interval_ms,
        # Exactly-once: input written by transactions (repartition topics, upstream apps)
        # counts only once committed.
        isolation_level="read_committed" if config.exactly_once else "read_uncommitted",
    ))


def new_producer(bootstrap_servers: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", linger_ms=5)


def producer_client(producer: Any) -> AIOKafkaClient | None:
    """The producer's connection, for requests aiokafka has no API for (LeaveGroup v3)."""
    return getattr(producer, "client", None)


async def broker_cluster_id(bootstrap_servers: str) -> str | None:
    """The cluster id the broker reports in a Metadata response (None when it gives none)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap_servers)
    await client.bootstrap()
    try:
        nodes: Iterable[Any] = client.cluster.brokers()
        node = next(iter(nodes)).nodeId
        response = await client.send(node, MetadataRequest([]))
        return getattr(response, "cluster_id", None)
    finally:
        await client.close()
