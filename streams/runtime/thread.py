"""A stream thread: one group member's loop (fetch, process, ship, commit), its states and its
lifecycle.

Each thread is a group member (its member id from :mod:`streams.group.member_id`) and runs
as an asyncio task. Its parts are built by :func:`streams.runtime.factory.build_stream_thread`,
each with one job:

- the group member (:mod:`streams.group.member`): subscription, assignment, rejoins;
- the rebalance listener (:mod:`streams.group.listener`): applies each round to the tasks
  through the task manager (:mod:`streams.runtime.task_manager`);
- the state updater (:mod:`streams.runtime.state_updater`): restores new actives and follows
  copies;
- the record collector (:mod:`streams.runtime.record_collector`): ships outputs and changelog
  records; the committer (:mod:`streams.runtime.commit`) commits;
- the status reporter (:mod:`streams.runtime.thread_status`): status records and round
  figures;
- the round hooks (:mod:`streams.quirks.hooks`): what the broker's quirks add to a round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aiokafka.structs import TopicPartition

from streams.config import AppConfig
from streams.group.expiry_probe import ExpiryProbe
from streams.group.join_watch import JoinWatch
from streams.group.listener import RebalanceListener
from streams.group.member import GroupMember
from streams.group.newcomer import WarmUp
from streams.group.partition_assignor import RelayAssignor, TaskLayout
from streams.group.predecessors import MemberFiles
from streams.kafka.driver import GroupConsumer, producer_client
from streams.kafka.membership import leave_as_static_member
from streams.metrics import Metrics
from streams.quirks.hooks import RoundHooks
from streams.runtime.commit import Committer
from streams.runtime.lifecycle import FatalThreadError, Lifecycle, ThreadState
from streams.runtime.record_collector import RecordCollector
from streams.runtime.routing import route_by_task
from streams.runtime.state_updater import StateUpdater
from streams.runtime.task import RecordError, StreamTask, punctuate_all
from streams.runtime.task_manager import TaskManager
from streams.runtime.tasks import Tasks
from streams.runtime.thread_status import StatusReporter, ThreadIdentity, ThreadStatus
from streams.runtime.transactions import TransactionalCollector, TransactionalCommitter
from streams.runtime.transitions import Role

__all__ = ["FatalThreadError", "StreamThread", "ThreadIdentity", "ThreadState", "ThreadStatus"]

log = logging.getLogger(__name__)

# How long a stopping thread waits for the process loop to finish its current batch.
PROCESS_LOOP_GRACE_S = 10.0


class StreamThread:
    def __init__(
        self,
        config: AppConfig,
        identity: ThreadIdentity,
        layout: TaskLayout,
        *,
        lifecycle: Lifecycle,
        lock: asyncio.Lock,
        assignor: RelayAssignor,
        consumer: GroupConsumer,
        producer: Any,
        tasks: Tasks,
        task_manager: TaskManager,
        state_updater: StateUpdater,
        collector: RecordCollector | TransactionalCollector,
        committer: Committer | TransactionalCommitter,
        member: GroupMember,
        listener: RebalanceListener,
        reporter: StatusReporter,
        join_watch: JoinWatch,
        hooks: RoundHooks,
        metrics: Metrics,
        member_files: MemberFiles | None = None,
        warm_up: WarmUp | None = None,
        expiry_probe: ExpiryProbe | None = None,
    ) -> None:
        self.config = config
        self.identity = identity
        self.index = identity.index
        self.instance_id = identity.instance_id
        self.static_id = identity.static_id
        self.layout = layout
        self.lifecycle = lifecycle
        #: Held by each processing pass and by every change to the tasks (rebalance
        #: callbacks, a restored task starting, tasks given up for learners).
        self._lock = lock
        self.assignor = assignor
        self.consumer = consumer
        self.producer = producer
        self.registry = tasks
        self.task_manager = task_manager
        self.state_updater = state_updater
        self.collector = collector
        self.committer = committer
        self.member = member
        self.listener = listener
        self.reporter = reporter
        #: What this member does when stuck joining (see :mod:`streams.group.join_watch`).
        self.join_watch = join_watch
        #: Hears a silent peer's session end (see :mod:`streams.group.expiry_probe`).
        self.expiry_probe = expiry_probe
        self.hooks = hooks
        self.metrics = metrics
        #: Where this thread keeps its member id for a restart after a crash to remove
        #: (see :mod:`streams.group.predecessors`).
        self._member_files = member_files
        #: A new instance's copies to restore before the first join (None: join at once).
        self.warm_up = warm_up
        self.late_records_dropped = 0
        #: Records processed while the group was rebalancing (cooperative members only).
        self.records_during_rebalance = 0
        #: Tasks that hold fetched records back for a lagging partition.
        self._holding: list[StreamTask] = []
        self._label = identity.label

    # -- views -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.identity.name

    @property
    def state(self) -> ThreadState:
        return self.lifecycle.state

    @property
    def status(self) -> ThreadStatus:
        return self.reporter.status

    @property
    def status_key(self) -> bytes:
        return self.reporter.key

    @property
    def tasks(self) -> dict[str, StreamTask]:
        """Running active tasks by id."""
        return self.registry.active

    @property
    def restoring(self) -> list[str]:
        return sorted(self.registry.restoring)

    @property
    def standbys(self) -> dict[str, int]:
        """Standby copies and their lag."""
        return self.state_updater.lags(Role.STANDBY)

    @property
    def learners(self) -> dict[str, int]:
        """Learner copies and their lag."""
        return self.state_updater.lags(Role.LEARNER)

    @property
    def failure(self) -> BaseException | None:
        """What stops the thread with an error, once something did."""
        return self.lifecycle.failure

    @property
    def shutdown_requested(self) -> bool:
        return self.lifecycle.shutdown_requested

    @property
    def is_leader(self) -> bool:
        return self.assignor.is_leader

    @property
    def settled(self) -> bool:
        """Running, with no round under way and none asked for or scheduled by this member,
        and nothing restoring: what to wait for before changing the group on purpose."""
        return (self.state is ThreadState.RUNNING and not self.consumer.rebalancing
                and not self.member.asking and not self.registry.restoring)

    # -- processing -----------------------------------------------------------------------

    async def _process_loop(self) -> None:
        last_commit = time.monotonic()
        while not self.lifecycle.stopping:
            started = time.perf_counter()
            batches = await self.consumer.getmany(timeout_ms=100, max_records=2000)
            async with self._lock:
                if self.listener.awaiting_assignment:
                    continue
                if self.consumer.membership_in_doubt:
                    # Its tasks may run elsewhere already (a process stopped past its session
                    # resumes here): nothing is processed, shipped or committed until the
                    # group tells (streams.kafka.cooperative).
                    self.consumer.give_back(batches)
                    continue
                await self.process(batches)
                punctuate_all(self.registry.active.values())
                if self.consumer.membership_in_doubt:
                    continue  # stopped in mid-pass: its outputs stay unshipped
                await self.collector.ship_outputs(self.registry.active.values())
                if time.monotonic() - last_commit >= self.config.commit_interval_ms / 1000:
                    await self.committer.commit()
                    last_commit = time.monotonic()
            if batches:
                # Passes that fetched nothing only measure the fetch's wait.
                self.metrics.observe_loop(self._label, time.perf_counter() - started)
            # With records buffered, neither the fetch nor the shipping suspends: without this
            # the loop would hold the event loop until the buffer ran dry, and restoration,
            # heartbeats and status reports would wait for it.
            await asyncio.sleep(0)

    async def process(self, batches: dict[TopicPartition, list[Any]]) -> None:
        by_task = route_by_task(batches, self.registry.task_for)
        # Tasks holding records back for a lagging partition look again at every pass.
        routed = {id(task) for task, _ in by_task}
        by_task += [(task, []) for task in self._holding
                    if id(task) not in routed and self.registry.task_for(task.partitions[0])
                    is task]
        self._holding.clear()
        rebalancing = self.consumer.rebalancing
        now_ms = time.time() * 1000
        for task, inputs in by_task:
            if rebalancing:
                self.records_during_rebalance += sum(len(i) for i in inputs)
            # Across a task's input partitions, older records first, held back while a
            # partition with nothing buffered lags (streams.runtime.partition_group); within
            # one partition, always in offset order. Records the task already processed (a
            # batch fetched before a rebalance sought the partition back) are dropped by the
            # task itself.
            if task.inputs.synchronizes:
                for part in inputs:
                    task.inputs.add(part)
                records = task.inputs.take(self.consumer.lagging, now_ms)
                if task.inputs.buffered:
                    self._holding.append(task)
            else:
                records = inputs[0]
            before = task.records_processed
            try:
                while records:
                    try:
                        task.process_batch(records)
                        break
                    except RecordError as error:
                        await self._bad_record(task, error)
                        records = records[error.index + 1:]
            finally:
                self.metrics.record_processed(self._label, task.task_id,
                                              task.records_processed - before)
            self.late_records_dropped += task.context.late_records_dropped
            task.context.late_records_dropped = 0

    async def _bad_record(self, task: StreamTask, error: RecordError) -> None:
        record = error.record
        if self.config.on_error == "stop":
            self.lifecycle.fail(FatalThreadError(str(error)))
            # Not processed after all: it is neither committed nor skipped.
            task.processed[TopicPartition(record.topic, record.partition)] = record.offset
            raise error
        try:
            await self.collector.dead_letter(error, task.task_id, task.records_processed)
        except BaseException as exc:
            # Not in the dead-letter topic, so not processed either: the thread stops without
            # committing past it, and a restart meets it again.
            task.processed[TopicPartition(record.topic, record.partition)] = record.offset
            self.lifecycle.fail(exc)
            raise

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self, topics: list[str]) -> None:
        lifecycle = self.lifecycle
        stopped = lifecycle.stopped
        lifecycle.set_state(ThreadState.STARTING)
        await self.producer.start()
        await self.state_updater.start()
        if self.warm_up is not None:
            await self.warm_up.run()
        await self.consumer.start()
        self.consumer.subscribe(topics, self.listener)
        loops = [
            asyncio.create_task(self._process_loop(), name=f"process-{self.index}"),
            asyncio.create_task(self.state_updater.restore_loop(stopped),
                                name=f"restore-{self.index}"),
            asyncio.create_task(self.state_updater.follow_loop(stopped, self.reporter.update),
                                name=f"follow-{self.index}"),
            asyncio.create_task(self.reporter.housekeeping(self.join_watch, self.expiry_probe),
                                name=f"status-{self.index}"),
        ]
        stopper = asyncio.create_task(stopped.wait())
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
            lifecycle.set_state(ThreadState.PENDING_SHUTDOWN)
            lifecycle.stop()
            self.state_updater.stopping()
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
            lifecycle.set_state(ThreadState.DEAD)
        if lifecycle.failure is not None:
            raise lifecycle.failure

    def stop(self) -> None:
        self.lifecycle.stop()

    async def _close(self) -> None:
        self.member.close()
        await self.listener.close()
        await self.join_watch.close()
        if self.expiry_probe is not None:
            await self.expiry_probe.close()
        try:
            async with self._lock:
                if self.registry.active and self.lifecycle.failure is None:
                    await self.committer.commit(force=True)
        except Exception:
            log.exception("%s: final commit failed", self.name)
        self.task_manager.close_all()
        with contextlib.suppress(Exception):
            await self.collector.close()
        await self.committer.close()
        leaves_explicitly = self.listener.leaves_explicitly
        # A dynamic member's consumer sends LeaveGroup on stop; a static one only when it
        # leaves explicitly.
        sends_leave_group = self.static_id is None or leaves_explicitly
        await self.hooks.before_leave(
            self.member, self.consumer, self.config.session_timeout_ms,
            self.config.heartbeat_interval_ms, handed_over=self.shutdown_requested,
            sends_leave_group=sends_leave_group, waits_for_syncs=self.config.cooperative,
            name=self.name)
        if sends_leave_group:
            self.task_manager.close_all()
        member_id = self.consumer.member_id
        with contextlib.suppress(Exception):
            await self.consumer.stop()
        # Whatever a callback that ran while the consumer stopped may have opened.
        self.task_manager.close_all()
        if self._member_files is not None:
            # Stopped cleanly: a dynamic member's consumer has left; a static one comes back
            # as itself. Nothing for a restart to remove.
            self._member_files.clear(self.index)
        await self.state_updater.stop()
        if leaves_explicitly:
            # Sent once its consumer is stopped (through the producer's connection), so that
            # no join of its own can follow the leave.
            await leave_as_static_member(producer_client(self.producer),
                                         self.config.application_id, member_id,
                                         self.static_id or "")
            # Followers that rejoined for the last assignment while this leader was leaving
            # could be held in rounds led by the departed member (seen on Tansu); told now,
            # they rejoin a group without it.
            self.hooks.tell_followers(self.member)
        await self.reporter.remove()
        with contextlib.suppress(Exception):
            await self.producer.stop()
