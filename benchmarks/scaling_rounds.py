"""The broker's join round, measured: how long a stable group takes from the moment its
members send JoinGroup until each has its SyncGroup response, so the scaling benchmark can
report every gap in join rounds as well as in seconds.

A probe group of plain aiokafka consumers (same session timeout and heartbeat as the workers)
joins once and then, round after round, every member asks to rejoin at the same moment. A
round lasts from the first member's join-prepare (its JoinGroup is sent right after) to the
last member's join-complete (its SyncGroup response arrived). On Tansu the round is paced by
the broker's coordinator (it polls a forming group with pauses of seconds); on Apache Kafka it
is a network round trip or two plus the initial rebalance delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient

from statestore.topics import TopicSpec, ensure_topics


@dataclass
class JoinRounds:
    """The rounds measured, in seconds."""

    members: int
    session_timeout_ms: int
    samples_s: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.samples_s) if self.samples_s else None


class _Timing(ConsumerRebalanceListener):  # type: ignore[misc]
    """Records when this member prepared to join and when its join completed."""

    def __init__(self) -> None:
        self.prepared: list[float] = []
        self.completed: list[float] = []

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.prepared.append(time.monotonic())

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.completed.append(time.monotonic())


async def _until(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"join probe: {what} within {timeout_s:.0f}s")
        await asyncio.sleep(0.02)


async def measure_join_rounds(bootstrap: str, rounds: int, session_timeout_ms: int,
                              members: int = 2, timeout_s: float = 120.0,
                              static: bool = False) -> JoinRounds:
    """Measure ``rounds`` join rounds of a stable group of ``members`` consumers; ``static``:
    each with a group instance id (Tansu's rounds of static members take about 3 s more:
    8.0 to 9.4 s against 5.1 to 6.4 s with 10 s sessions)."""
    result = JoinRounds(members, session_timeout_ms)
    tag = uuid.uuid4().hex[:8]
    topic = f"join-probe-{tag}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, [TopicSpec(topic, members)])
    finally:
        await admin.close()
    timings = [_Timing() for _ in range(members)]
    consumers = [AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=f"join-probe-{tag}",
                                  group_instance_id=f"join-probe-{tag}-{i}" if static else None,
                                  session_timeout_ms=session_timeout_ms,
                                  heartbeat_interval_ms=1000, enable_auto_commit=False)
                 for i in range(members)]
    pollers: list[asyncio.Task[None]] = []

    async def poll(consumer: AIOKafkaConsumer) -> None:
        while True:
            await consumer.getmany(timeout_ms=200)

    try:
        for consumer, timing in zip(consumers, timings, strict=True):
            await consumer.start()
            consumer.subscribe([topic], listener=timing)
            pollers.append(asyncio.create_task(poll(consumer)))

        def stable() -> bool:
            generations = {c._coordinator.generation for c in consumers}
            return (len(generations) == 1 and all(len(c.assignment()) == 1 for c in consumers)
                    and not any(c._coordinator.need_rejoin(c._subscription.subscription)
                                for c in consumers))

        await _until(stable, timeout_s, "the probe group did not become stable")
        for _ in range(rounds):
            done = [len(t.completed) for t in timings]
            for consumer in consumers:
                consumer._coordinator.request_rejoin()
            await _until(lambda done=done: all(len(t.completed) > n for t, n in
                                               zip(timings, done, strict=True)),
                         timeout_s, "a round did not complete")
            await _until(stable, timeout_s, "the probe group did not settle after a round")
            started = min(t.prepared[-1] for t in timings)
            ended = max(t.completed[-1] for t in timings)
            result.samples_s.append(ended - started)
            # A short pause, as between the rebalances of a real group.
            await asyncio.sleep(1.0)
    except Exception as exc:  # the figures go on without rounds; the error says why
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        for poller in pollers:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await poller
        for consumer in consumers:
            with contextlib.suppress(Exception):
                await consumer.stop()
    return result
