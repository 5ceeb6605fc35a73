"""A stream thread: one consumer in the group, its tasks, and the copies of state it holds.

Each thread is a group member (with static id ``<group_instance_id>-thread-<n>`` when one is
configured) and runs as an asyncio task. Its loop fetches records, runs them through their
tasks, ships outputs and changelog records, and commits at the commit interval: first the
acknowledgement of every output and changelog record, then the input offsets, then the stores'
checkpoints (at-least-once).

On a rebalance, tasks and stores are kept open; when the assignment arrives, only what moved
changes (:mod:`streams.transitions`), kept partitions resume at their processed offsets, new
actives restore in the background before they run, and standby and learner copies follow their
changelogs. A learner that caught up reports itself ready and asks for a rebalance.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError, RebalanceInProgressError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from assignor import AssignorConfig, MemberAssignment
from assignor.protocol import Subscription, encode_subscription
from statestore.changelog import ChangelogWriter
from statestore.restore import ChangelogReader
from statestore.snapshot import SnapshotSettings
from statestore.store import KeyValueStore
from streams import cooperative
from streams.config import AppConfig
from streams.membership import leave_group
from streams.rebalance import RelayAssignor, TaskLayout
from streams.status import status_topic_name
from streams.task import RecordError, StreamTask, open_task_stores
from streams.topology import SubTopology
from streams.transitions import Role, plan_transitions

log = logging.getLogger(__name__)

UNKNOWN_LAG = 2**31 - 1
# How long a stopping thread waits for the process loop to finish its current batch.
PROCESS_LOOP_GRACE_S = 10.0




class FatalThreadError(RuntimeError):
    """The thread cannot go on (duplicate instance id, a record error with on_error=stop)."""


@dataclass
class ThreadStatus:
    """What the thread runs now, for status reports and tests."""

    member_id: str = ""
    generation: int = -1
    active: list[str] = field(default_factory=list)
    restoring: list[str] = field(default_factory=list)
    standbys: dict[str, int] = field(default_factory=dict)
    learners: dict[str, int] = field(default_factory=dict)
    rebalances: int = 0


class StreamThread:
    def __init__(
        self,
        config: AppConfig,
        index: int,
        subs: list[SubTopology],
        bootstrap_servers: str,
        leaving: Callable[[], tuple[bool, int | None, int | None]] = lambda: (False, None, None),
        on_record: Callable[[StreamTask, Any], None] | None = None,
        instance_id: str | None = None,
        incarnation: str = "",
    ) -> None:
        self.incarnation = incarnation
        self.config = config
        self.index = index
        self.subs = subs
        self.bootstrap = bootstrap_servers
        self.layout = TaskLayout(tuple(subs))
        self.instance_id = (
            instance_id or config.group_instance_id or f"pid-{os.getpid()}-{id(self):x}"
        )
        self.static_id = (
            f"{config.group_instance_id}-thread-{index}" if config.group_instance_id else None
        )
        self._leaving = leaving
        self._on_record = on_record
        self.tasks: dict[str, StreamTask] = {}
        self.restoring: dict[str, dict[str, KeyValueStore]] = {}
        self.copies: dict[str, dict[str, KeyValueStore]] = {}
        self.copy_roles: dict[str, Role] = {}
        self._by_partition: dict[TopicPartition, StreamTask] = {}
        self._lock = asyncio.Lock()
        self._rebalancing = False
        self._pending_assignment: MemberAssignment | None = None
        self._rejoin_token = 0
        self._ready_reported: set[str] = set()
        self._stop = asyncio.Event()
        self._fatal: BaseException | None = None
        self._restore_wakeup = asyncio.Event()
        self._rejoin_timer: asyncio.TimerHandle | None = None
        self.shutdown_requested = False
        self.ask_leader: Callable[[str], None] = lambda reason: None
        self.tell_followers: Callable[[dict[str, str]], None] = lambda digests: None
        self.publish_subscription: Callable[[str, bytes], None] = lambda sid, data: None
        self.status = ThreadStatus()
        self.late_records_dropped = 0
        #: Records processed while the group was rebalancing (cooperative members only).
        self.records_during_rebalance = 0
        self.dead_lettered = 0
        assignor_config = AssignorConfig(
            num_standbys=config.num_standbys,
            acceptable_lag=config.acceptable_lag,
            max_learners=config.max_learners,
            lost_task_delay_ms=config.lost_task_delay_ms,
            initial_delay_ms=config.initial_delay_ms,
            scale_down_timeout_ms=config.scale_down_timeout_ms,
            imbalance_tolerance=config.imbalance_tolerance,
        )
        self.assignor = RelayAssignor(
            self.layout, assignor_config, self._subscription, self._on_assigned
        )
        self.assignor.cooperative = config.rebalance_protocol == "cooperative"
        cooperative.install()
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_servers,
            group_id=config.application_id,
            group_instance_id=self.static_id,
            client_id=f"{config.application_id}-{self.static_id or index}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            partition_assignment_strategy=(self.assignor,),
            session_timeout_ms=config.session_timeout_ms,
            heartbeat_interval_ms=config.heartbeat_interval_ms,
            max_poll_interval_ms=config.max_poll_interval_ms,
            rebalance_timeout_ms=config.max_poll_interval_ms,
        )
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_servers, acks="all", linger_ms=5
        )
        self.changelog = ChangelogWriter(self.producer)
        self._output_futures: list[asyncio.Future[Any]] = []
        self.follower = ChangelogReader(bootstrap_servers, client_id=f"{self.instance_id}-copies")
        self.restorer = ChangelogReader(bootstrap_servers, client_id=f"{self.instance_id}-restore")

    @property
    def status_key(self) -> bytes:
        return (self.static_id or f"{self.instance_id}-thread-{self.index}").encode()

    @property
    def state_dir(self) -> Path:
        return self.config.state_dir

    # -- the subscription and the assignment (called from aiokafka's coordinator) ---------

    def _subscription(self) -> Subscription:
        leaving, since, timeout = self._leaving()
        standbys = {t: self._copy_lag(t) for t, r in self.copy_roles.items() if r is Role.STANDBY}
        learners = {t: self._copy_lag(t) for t, r in self.copy_roles.items() if r is Role.LEARNER}
        return Subscription(
            instance_id=self.instance_id,
            thread=self.index,
            pid=os.getpid(),
            active=tuple(sorted(set(self.tasks) | set(self.restoring))),
            standbys=standbys,
            learners=learners,
            leaving=leaving,
            leaving_since_ms=since,
            scale_down_timeout_ms=timeout,
            rejoin_token=self._rejoin_token,
            static=self.static_id is not None,
        )

    def _copy_lag(self, task_id: str) -> int:
        lags = [self.follower.lag(store) for store in self.copies.get(task_id, {}).values()]
        if any(lag is None for lag in lags):
            return UNKNOWN_LAG
        return max((lag for lag in lags if lag is not None), default=0)

    def _on_assigned(self, assignment: MemberAssignment) -> None:
        self._pending_assignment = assignment

    def request_rejoin(self, reason: str, broadcast: bool = True) -> None:
        """Ask for a rebalance: rejoin with a changed token in the metadata. A static member
        also asks the leader (through the control topic) to rejoin, since a broker may answer
        a static follower's rejoin with its cached assignment and no rebalance."""
        if self._stop.is_set():
            # Stopping: its leaving rebalances the group anyway, and a join sent now would
            # re-add it (as leader, maybe) to a round it will never finish.
            log.info("thread %d stopping; not rejoining for: %s", self.index, reason)
            return
        log.info("thread %d asks for a rebalance: %s", self.index, reason)
        self._publish()
        coordinator = getattr(self.consumer, "_coordinator", None)
        if coordinator is not None:
            coordinator.request_rejoin()
        if broadcast and self.static_id is not None and not self.assignor.is_leader:
            self.ask_leader(f"{self.static_id}: {reason}")

    def _publish(self, new_token: bool = True) -> None:
        """A new token (for a rejoin), and for a static member its subscription on the control
        topic."""
        if new_token:
            self._rejoin_token += 1
        if self.static_id is not None:
            self.publish_subscription(self.static_id, encode_subscription(self._subscription()))

    def fetch_assignment(self, digest: str) -> None:
        """Fetch the assignment the leader computed for this member (``digest``) if it holds
        another one: a static follower the broker did not wait for missed the round, and the
        broker may not even have moved the generation on. A plain rejoin is not enough on
        every broker (Tansu may hold the follower's join until the leader rejoins too), so
        the member asks for a rebalance the way a ready learner does."""
        if self.assignor.received_digest != digest:
            self.request_rejoin("missed the leader's last assignment")

    # -- rebalance callbacks --------------------------------------------------------------

    def listener(self) -> ConsumerRebalanceListener:
        thread = self

        class _Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: Any) -> None:
                await thread._on_revoked()

            async def on_partitions_assigned(self, assigned: Any) -> None:
                await thread._on_assigned_partitions()

        return _Listener()

    async def _on_revoked(self) -> None:
        # Cooperative: called at join-complete with only what moved. Eager: called before
        # every rebalance with everything; stop-the-world then closes every task too.
        async with self._lock:
            self._rebalancing = True
            if self.tasks:
                try:
                    await self._commit(force=True)
                except Exception:
                    log.exception("thread %d: commit before rebalance failed", self.index)
            if self.config.rebalance_protocol == "eager":
                for task_id in list(self.tasks) + list(self.restoring) + list(self.copies):
                    self._close_task(task_id)

    async def _on_assigned_partitions(self) -> None:
        assignment, self._pending_assignment = self._pending_assignment, None
        async with self._lock:
            self._rebalancing = False
            self.status.rebalances += 1
            self.status.member_id = self.consumer._coordinator.member_id  # type: ignore[union-attr]
            self.status.generation = self.consumer._coordinator.generation  # type: ignore[union-attr]
            if assignment is None:
                log.warning("thread %d: assignment without Relay user data", self.index)
                return
            if assignment.error:
                self._fatal = FatalThreadError(assignment.error)
                self._stop.set()
                return
            await self._apply(assignment)
            self._publish(new_token=False)
            # A leaving static leader tells its followers once it has left (see _close).
            if not self._leaves_explicitly():
                self._tell_followers_their_digests()

    def _leaves_explicitly(self) -> bool:
        """A static member told to shut down sends LeaveGroup itself when it closes."""
        return self.shutdown_requested and self.static_id is not None

    def _tell_followers_their_digests(self) -> None:
        if self.assignor.is_leader:
            self.tell_followers({s: d for s, d in self.assignor.static_digests.items()
                                 if s != self.static_id})

    async def _apply(self, assignment: MemberAssignment) -> None:
        current: dict[str, Role] = {t: Role.ACTIVE for t in self.tasks}
        current.update({t: Role.RESTORING for t in self.restoring})
        current.update(self.copy_roles)
        plan = plan_transitions(current, assignment)
        for task_id in plan.close:
            self._close_task(task_id)
        for task_id, role in plan.demote:
            stores = self._stop_active(task_id)
            self._add_copy(task_id, role, stores)
        for task_id, role in plan.retag:
            self.copy_roles[task_id] = role
        for task_id, role in plan.add_copies:
            self._add_copy(task_id, role, None)
        for task_id in plan.start:
            stores = self._remove_copy(task_id) if task_id in plan.promote else None
            if stores is None:
                stores = self._open_stores(task_id)
            self.restoring[task_id] = stores
        # Kept partitions resume where their task stopped; restoring ones wait paused.
        for task in self.tasks.values():
            for tp in task.partitions:
                if tp in task.processed:
                    self.consumer.seek(tp, task.processed[tp])
        paused = [
            tp for task_id in self.restoring for tp in self._task_partitions(task_id)
        ]
        if paused:
            self.consumer.pause(*paused)
        self._ready_reported &= set(self.copy_roles)
        self._restore_wakeup.set()
        self._schedule_rejoin(assignment.rejoin_after_ms)
        if assignment.shutdown:
            log.info("thread %d: told to shut down (nothing left to run)", self.index)
            self.shutdown_requested = True
            self._stop.set()
        self._update_status()
        log.info(
            "%s: active=%s restoring=%s copies=%s revoked=%s",
            self.static_id or f"thread {self.index}", sorted(self.tasks), sorted(self.restoring),
            {t: r.value for t, r in self.copy_roles.items()}, list(assignment.revoked),
        )

    def _schedule_rejoin(self, delay_ms: int | None) -> None:
        if self._rejoin_timer is not None:
            self._rejoin_timer.cancel()
            self._rejoin_timer = None
        if delay_ms is None:
            return
        loop = asyncio.get_running_loop()
        self._rejoin_timer = loop.call_later(
            max(0, delay_ms) / 1000, self.request_rejoin, "follow-up rebalance"
        )

    def _task_partitions(self, task_id: str) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in self.layout.partitions_of(task_id)]

    def _sub_of(self, task_id: str) -> SubTopology:
        return self.subs[int(task_id.split("_")[0])]

    def _open_stores(self, task_id: str) -> dict[str, KeyValueStore]:
        snapshots = None
        if self.config.snapshot_dir is not None:
            snapshots = SnapshotSettings(self.config.snapshot_dir, self.bootstrap)
        # Every store a thread opens is restored or followed before anything reads it.
        return open_task_stores(
            self._sub_of(task_id), task_id, self.config.application_id, self.state_dir,
            snapshots, bulk_load=True,
        )

    def _stop_active(self, task_id: str) -> dict[str, KeyValueStore]:
        task = self.tasks.pop(task_id, None)
        if task is not None:
            for tp in task.partitions:
                self._by_partition.pop(tp, None)
            return task.stores
        stores = self.restoring.pop(task_id)
        for store in stores.values():
            self.restorer.unregister(store)
        return stores

    def _add_copy(
        self, task_id: str, role: Role, stores: dict[str, KeyValueStore] | None
    ) -> None:
        if stores is None:
            stores = self._open_stores(task_id)
        self.copies[task_id] = stores
        self.copy_roles[task_id] = role
        for store in stores.values():
            self.follower.register(store)

    def _remove_copy(self, task_id: str) -> dict[str, KeyValueStore]:
        stores = self.copies.pop(task_id)
        self.copy_roles.pop(task_id, None)
        self._ready_reported.discard(task_id)
        for store in stores.values():
            self.follower.unregister(store)
        return stores

    def _close_task(self, task_id: str) -> None:
        if task_id in self.tasks or task_id in self.restoring:
            stores = self._stop_active(task_id)
        else:
            stores = self._remove_copy(task_id)
        for store in stores.values():
            store.close()  # commits what the changelog holds; says so and drops the rest
        log.info("thread %d: closed task %s (state stays on disk)", self.index, task_id)

    def _update_status(self) -> None:
        self.status.active = sorted(self.tasks)
        self.status.restoring = sorted(self.restoring)
        self.status.standbys = {
            t: self._copy_lag(t) for t, r in self.copy_roles.items() if r is Role.STANDBY
        }
        self.status.learners = {
            t: self._copy_lag(t) for t, r in self.copy_roles.items() if r is Role.LEARNER
        }

    # -- restoring actives and following copies -------------------------------------------

    async def _restore_loop(self) -> None:
        while not self._stop.is_set():
            await self._restore_wakeup.wait()
            self._restore_wakeup.clear()
            while self.restoring and not self._stop.is_set():
                task_id = sorted(self.restoring)[0]
                stores = self.restoring[task_id]
                await self.restorer.restore(list(stores.values()))
                async with self._lock:
                    if self.restoring.get(task_id) is not stores:
                        continue  # revoked while restoring
                    await self._start_task(task_id, self.restoring.pop(task_id))

    async def _start_task(self, task_id: str, stores: dict[str, KeyValueStore]) -> None:
        for store in stores.values():
            store.end_bulk_load()  # the task reads it from now on
        task = StreamTask(task_id, self._sub_of(task_id), stores)
        committed: dict[TopicPartition, int] = {}
        restored_position = task.restored_input_position()
        for tp in task.partitions:
            offset = await self.consumer.committed(tp)
            if offset is not None and offset >= 0:
                committed[tp] = offset
            # The state may already reflect records past the committed offset (a member that
            # died after its changelog was written but before it committed): skip those.
            if tp in restored_position and restored_position[tp] > committed.get(tp, -1):
                committed[tp] = restored_position[tp]
        assigned = self.consumer.assignment()
        for tp in task.partitions:
            if tp not in assigned:
                continue
            if tp in committed:
                self.consumer.seek(tp, committed[tp])
                task.processed[tp] = committed[tp]
            else:
                await self.consumer.seek_to_beginning(tp)
        self.tasks[task_id] = task
        for tp in task.partitions:
            self._by_partition[tp] = task
        self.consumer.resume(*[tp for tp in task.partitions if tp in assigned])
        self._update_status()
        log.info("thread %d: task %s restored and running", self.index, task_id)

    def status_record(self) -> dict[str, Any]:
        """What this member runs, as published on the app's status topic."""
        self._update_status()
        leaving, since, _timeout = self._leaving()
        return {
            "instance_id": self.instance_id,
            "thread": self.index,
            "static_id": self.static_id,
            "pid": os.getpid(),
            "incarnation": self.incarnation,
            "member_id": self.status.member_id,
            "generation": self.status.generation,
            "leader": self.assignor.is_leader,
            "active": self.status.active,
            "restoring": self.status.restoring,
            "standbys": self.status.standbys,
            "learners": self.status.learners,
            "acceptable_lag": self.config.acceptable_lag,
            "leaving": leaving,
            "leaving_since_ms": since,
            "rebalances": self.status.rebalances,
            "processed": sum(t.records_processed for t in self.tasks.values()),
            "restored_records": self.restorer.stats.records + self.follower.stats.records,
            "updated_ms": int(time.time() * 1000),
        }

    async def _status_loop(self) -> None:
        topic = status_topic_name(self.config.application_id)
        key = self.status_key
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                await self.producer.send(
                    topic, key=key, value=msgpack.packb(self.status_record())
                )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 1.0)
        with contextlib.suppress(Exception):
            await self.producer.send_and_wait(topic, key=key, value=None)

    async def _follow_loop(self) -> None:
        last_checkpoint = time.monotonic()
        while not self._stop.is_set():
            if not self.copies:
                await asyncio.sleep(0.1)
                continue
            await self.follower.poll(timeout_ms=200)
            self._check_learners_ready()
            if time.monotonic() - last_checkpoint > self.config.commit_interval_ms / 1000:
                last_checkpoint = time.monotonic()
                for stores in self.copies.values():
                    for store in stores.values():
                        store.commit()
            self._update_status()

    def _check_learners_ready(self) -> None:
        learners = [t for t, r in self.copy_roles.items() if r is Role.LEARNER]
        ready = {t for t in learners if self._copy_lag(t) <= self.config.acceptable_lag}
        newly = ready - self._ready_reported
        if not newly:
            return
        if self.config.learner_rejoin == "eager" or ready == set(learners):
            self._ready_reported |= ready
            self.request_rejoin(f"learners ready: {sorted(newly)}")

    # -- processing -----------------------------------------------------------------------

    async def _process_loop(self) -> None:
        last_commit = time.monotonic()
        while not self._stop.is_set():
            batches = await self.consumer.getmany(timeout_ms=100, max_records=2000)
            async with self._lock:
                if self._rebalancing:
                    continue  # dropped; kept partitions are sought back after the rebalance
                by_task: dict[str, list[list[Any]]] = {}
                for tp, records in batches.items():
                    task = self._by_partition.get(tp)
                    if task is not None and records:
                        by_task.setdefault(task.task_id, []).append(records)
                for task_id, inputs in by_task.items():
                    task = self.tasks[task_id]
                    # Across a task's input partitions, older records first; within one
                    # partition, always in offset order.
                    if getattr(self.consumer._coordinator, "rebalancing", False):
                        self.records_during_rebalance += sum(len(i) for i in inputs)
                    for record in heapq.merge(*inputs, key=lambda r: r.timestamp):
                        try:
                            task.process(record)
                        except RecordError as error:
                            await self._bad_record(error)
                        if self._on_record is not None:
                            self._on_record(task, record)
                    self.late_records_dropped += task.context.late_records_dropped
                    task.context.late_records_dropped = 0
                await self._ship()
                if time.monotonic() - last_commit >= self.config.commit_interval_ms / 1000:
                    await self._commit()
                    last_commit = time.monotonic()

    async def _bad_record(self, error: RecordError) -> None:
        record = error.record
        if self.config.on_error == "stop":
            self._fatal = FatalThreadError(str(error))
            self._stop.set()
            # Not processed after all: it is neither committed nor skipped.
            task = self._by_partition.get(TopicPartition(record.topic, record.partition))
            if task is not None:
                task.processed[TopicPartition(record.topic, record.partition)] = record.offset
            raise error
        log.warning("%s; sent to %s", error, self.config.dead_letters)
        headers = [
            ("relay.error", f"{type(error.cause).__name__}: {error.cause}".encode()),
            ("relay.stage", error.stage.encode()),
            ("relay.topic", record.topic.encode()),
            ("relay.partition", str(record.partition).encode()),
            ("relay.offset", str(record.offset).encode()),
        ]
        future = await self.producer.send(
            self.config.dead_letters, value=record.value, key=record.key, headers=headers
        )
        self._output_futures.append(future)
        self.dead_lettered += 1

    async def _ship(self) -> None:
        for task in self.tasks.values():
            task.record_input_position()
            outputs = task.take_outputs()
            handed = 0
            try:
                for output in outputs:
                    future = await self.producer.send(
                        output.topic, value=output.value, key=output.key,
                        timestamp_ms=output.timestamp_ms,
                    )
                    self._output_futures.append(future)
                    handed += 1
            finally:
                # Cancelled while the producer's buffer was full: what was not handed over
                # is shipped by the final commit instead of being dropped.
                task.context.outputs[:0] = outputs[handed:]
            await self.changelog.send_pending(task.stores.values())

    async def _commit(self, force: bool = False) -> None:
        """Outputs and changelogs acknowledged, then input offsets, then checkpoints."""
        await self._ship()
        futures, self._output_futures = self._output_futures, []
        if futures:
            await asyncio.gather(*futures)
        await self.changelog.wait_acknowledged()
        offsets = {
            tp: OffsetAndMetadata(offset, "")
            for task in self.tasks.values()
            for tp, offset in task.processed.items()
        }
        rebalancing = getattr(self.consumer._coordinator, "rebalancing", False)
        if offsets and rebalancing and not force:
            # The group is rebalancing: a commit now would wait for the join to complete,
            # while the join's callbacks wait for this commit. The next commit carries them.
            log.debug("thread %d: offset commit deferred during a rebalance", self.index)
        elif offsets:
            try:
                await asyncio.wait_for(self.consumer.commit(offsets), 15)
            except (CommitFailedError, RebalanceInProgressError, IllegalStateError,
                    TimeoutError) as exc:
                # A rebalance is under way (cooperative members keep processing through
                # it); the next commit carries these offsets. The stores' input position
                # keeps the state exact meanwhile.
                log.info("thread %d: offset commit deferred: %s", self.index, exc)
        for task in self.tasks.values():
            task.purge_expired_windows()
            await self.changelog.send_pending(task.stores.values())
        await self.changelog.wait_acknowledged()
        for task in self.tasks.values():
            for store in task.stores.values():
                store.commit()

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self, topics: list[str]) -> None:
        await self.producer.start()
        await self.follower.start()
        await self.restorer.start()
        await self.consumer.start()
        self.consumer.subscribe(topics, listener=self.listener())
        loops = [
            asyncio.create_task(self._process_loop(), name=f"process-{self.index}"),
            asyncio.create_task(self._restore_loop(), name=f"restore-{self.index}"),
            asyncio.create_task(self._follow_loop(), name=f"follow-{self.index}"),
            asyncio.create_task(self._status_loop(), name=f"status-{self.index}"),
        ]
        stopper = asyncio.create_task(self._stop.wait())
        try:
            done, _ = await asyncio.wait(
                [*loops, stopper], return_when=asyncio.FIRST_COMPLETED
            )
            for finished in done:
                if finished is not stopper and finished.exception() is not None:
                    exc = finished.exception()
                    if not isinstance(exc, RecordError):
                        raise exc  # type: ignore[misc]
        finally:
            self._stop.set()
            self._restore_wakeup.set()
            # The process loop sees the stop between two batches; letting it get there keeps
            # a batch from being cut off halfway through shipping.
            await asyncio.wait([loops[0]], timeout=PROCESS_LOOP_GRACE_S)
            for loop in loops:
                loop.cancel()
            for loop in loops:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await loop
            stopper.cancel()
            await self._close()
        if self._fatal is not None:
            raise self._fatal

    def stop(self) -> None:
        self._stop.set()

    async def _leave_as_static_member(self, member_id: str) -> None:
        """A static member never sends LeaveGroup on close; one that handed everything over
        leaves explicitly so the group does not wait a session timeout for it. Sent once its
        consumer is stopped (through the producer's connection), so that no join of its own
        can follow the leave."""
        if not member_id:
            return
        try:
            errors = await leave_group(
                self.producer.client, self.config.application_id,
                [(member_id, self.static_id or "")],
            )
            log.info("thread %d left the group as %s: %s", self.index, self.static_id, errors)
        except Exception as exc:
            log.warning("thread %d: LeaveGroup failed (%s); the session timeout will do",
                        self.index, exc)

    async def _wait_for_a_settled_group(self) -> None:
        """A member that hands over and leaves lets a round under way finish first: on Tansu
        a leader that left during a round left the others joining rounds led by the departed
        member (seen in the host swap test). Bounded by the session timeout."""
        coordinator = getattr(self.consumer, "_coordinator", None)
        if coordinator is None:
            return
        deadline = time.monotonic() + self.config.session_timeout_ms / 1000
        # A round another member started shows at this member's next heartbeat.
        await asyncio.sleep(self.config.heartbeat_interval_ms / 1000)
        while time.monotonic() < deadline and (
            getattr(coordinator, "rebalancing", False)
            or coordinator._rejoin_needed_fut.done()
        ):
            await asyncio.sleep(0.1)

    async def _close(self) -> None:
        if self._rejoin_timer is not None:
            self._rejoin_timer.cancel()
        try:
            async with self._lock:
                if self.tasks and self._fatal is None:
                    await self._commit(force=True)
        except Exception:
            log.exception("thread %d: final commit failed", self.index)
        for task_id in list(self.tasks) + list(self.restoring) + list(self.copies):
            with contextlib.suppress(Exception):
                self._close_task(task_id)
        if self.shutdown_requested:
            await self._wait_for_a_settled_group()
        member_id = getattr(getattr(self.consumer, "_coordinator", None), "member_id", "")
        for client in (self.consumer, self.follower, self.restorer):
            with contextlib.suppress(Exception):
                await client.stop()
        if self._leaves_explicitly():
            await self._leave_as_static_member(member_id)
            # Followers that rejoined to fetch the last assignment while this leader was
            # leaving could be held in rounds led by the departed member (seen on Tansu);
            # told now, they rejoin a group without it.
            self._tell_followers_their_digests()
        with contextlib.suppress(Exception):
            # Gone: describe and the duplicate check at start no longer see this member.
            await self.producer.send_and_wait(
                status_topic_name(self.config.application_id), key=self.status_key, value=None)
        with contextlib.suppress(Exception):
            await self.producer.stop()
