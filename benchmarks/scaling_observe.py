"""What the scaling benchmark sees of a running app, followed live from the broker: its outputs
(one per input record: task, process, time, the input's sequence number) and its members'
status records (generation, what each runs, changelog records restored).

Relay members publish status on ``<app>-status``; the faust and Kafka Streams apps publish the
same facts on a topic of their own (neither framework has such records). All are read into
:class:`MemberStatus`, so everything downstream treats the strategies alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition


@dataclass(frozen=True)
class Output:
    task: str
    pid: int
    t: float
    seq: int


@dataclass(frozen=True)
class MemberStatus:
    """One status record of one group member (a Relay thread, a faust worker)."""

    key: str
    pid: int
    generation: int
    tasks: frozenset[str]
    #: Restoring actives, learners or a leaving mark: the member is still moving work.
    moving: bool
    restored_records: int
    updated_ms: int


def relay_status(key: str, record: dict[str, Any]) -> MemberStatus:
    return MemberStatus(
        key, record["pid"], record["generation"], frozenset(record["active"]),
        bool(record["restoring"] or record["learners"] or record["leaving"]),
        record.get("restored_records", 0), record["updated_ms"])


def faust_status(key: str, record: dict[str, Any]) -> MemberStatus:
    return MemberStatus(
        key, record["pid"], record["generation"],
        frozenset(f"0_{p}" for p in record["assigned"]), False,
        record.get("restored_records", 0), record["updated_ms"])


def kafka_streams_status(key: str, record: dict[str, Any]) -> MemberStatus:
    """A status record of the Kafka Streams app (``relay.peers.ScalingApp``). It is moving
    while an active task restores or the client is not RUNNING, and, without configured
    standbys, while it holds any standby task: those are the warm-up replicas of the
    HighAvailabilityTaskAssignor (Kafka Streams does not tell a warm-up from a standby, so with
    standbys configured a warm-up shows only as uneven load, which the balance check sees)."""
    warming_up = record["standbys_configured"] == 0 and bool(record["standby"])
    return MemberStatus(
        key, record["pid"], record["generation"], frozenset(record["active"]),
        bool(record["restoring"]) or record["state"] != "RUNNING" or warming_up,
        record.get("restored_records", 0), record["updated_ms"])


class _TopicTail:
    """Reads partition 0 of a topic from its beginning, in the background."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False,
            max_partition_fetch_bytes=8 * 1024 * 1024)
        self._tp = TopicPartition(topic, 0)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.assign([self._tp])
        await self._consumer.seek_to_beginning(self._tp)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=200, max_records=20_000)
            for records in batches.values():
                for record in records:
                    self.handle(record)

    def handle(self, record: Any) -> None:
        raise NotImplementedError

    async def caught_up(self, timeout_s: float = 10.0) -> None:
        """Wait until everything written so far has been read."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            highwater = self._consumer.highwater(self._tp)
            if highwater is not None and await self._consumer.position(self._tp) >= highwater:
                return
            await asyncio.sleep(0.2)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._consumer.stop()


class OutputFollower(_TopicTail):
    """Every output of the app, in the order they were written."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(bootstrap, topic)
        self.outputs: list[Output] = []
        #: The input records processed at least once, by sequence number.
        self.processed: set[int] = set()

    def handle(self, record: Any) -> None:
        v = msgpack.unpackb(record.value, raw=False)
        output = Output(v["task"], v["pid"], v["t"], v.get("seq", -1))
        self.outputs.append(output)
        self.processed.add(output.seq)

    def owners(self, since: float, until: float) -> dict[str, set[int]]:
        """The processes that produced outputs of each task between two times."""
        found: dict[str, set[int]] = {}
        # Outputs arrive nearly in time order; processes' batches overlap by well under the
        # slack, so the scan can stop early.
        slack = 10.0
        for output in reversed(self.outputs):
            if output.t < since - slack:
                break
            if since <= output.t <= until:
                found.setdefault(output.task, set()).add(output.pid)
        return found


    def run_starts(self, since: float, until: float, pause_s: float) -> dict[str, float]:
        """When each task's current run of outputs began: its first output after the last
        change of process or pause longer than ``pause_s`` (at the earliest ``since``)."""
        starts: dict[str, float] = {}
        pids: dict[str, int] = {}
        ended: set[str] = set()
        for output in reversed(self.outputs):
            if output.t < since:
                break
            if output.t > until or output.task in ended:
                continue
            task = output.task
            if task in pids and (output.pid != pids[task] or starts[task] - output.t > pause_s):
                ended.add(task)
                continue
            pids[task] = output.pid
            starts[task] = output.t
        return {task: max(since, t) for task, t in starts.items()}


class StatusFollower(_TopicTail):
    """The latest status of every member, and every status record seen."""

    def __init__(self, bootstrap: str, topic: str,
                 parse: Callable[[str, dict[str, Any]], MemberStatus]) -> None:
        super().__init__(bootstrap, topic)
        self._parse = parse
        self.latest: dict[str, MemberStatus] = {}
        self.history: list[MemberStatus] = []

    def handle(self, record: Any) -> None:
        key = record.key.decode(errors="replace") if record.key else "?"
        if key.startswith("__"):
            return
        if record.value is None:
            self.latest.pop(key, None)
            return
        status = self._parse(key, msgpack.unpackb(record.value, raw=False))
        self.latest[key] = status
        self.history.append(status)

    def live(self, fresh_ms: float = 3000) -> list[MemberStatus]:
        """Members that published recently (a killed process leaves a stale record)."""
        now_ms = time.time() * 1000
        return [s for s in self.latest.values() if now_ms - s.updated_ms < fresh_ms]
