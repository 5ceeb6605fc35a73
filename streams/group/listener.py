"""The rebalance listener aiokafka calls: it applies each round's outcome to the thread's
tasks through the task manager, and hands any failure of a callback to
:meth:`RebalanceListener.failed` instead of letting the client log and forget it.

Beyond aiokafka's two callbacks, the cooperative coordinator calls ``before_join`` as the
member joins a round and ``on_partitions_lost`` when the broker ended its membership
(:mod:`streams.kafka.cooperative`), and the state updater calls
``start_restored`` when a new active's state is restored. Every change to the tasks happens
under the thread's lock, between two of its processing passes. Copies a round adds beside
actives it starts open once those run (:mod:`streams.runtime.copy_opening`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import ConsumerRebalanceListener

from assignor import MemberAssignment
from statestore.store import KeyValueStore
from streams.config import AppConfig
from streams.group.learner_handover import LearnerHandover
from streams.group.learner_readiness import being_promoted
from streams.group.member import GroupMember
from streams.group.predecessors import MemberFiles
from streams.kafka.driver import GroupConsumer
from streams.quirks.hooks import RoundHooks
from streams.runtime.commit import Committer
from streams.runtime.copy_opening import CopyOpener
from streams.runtime.lifecycle import FatalThreadError, Lifecycle, ThreadState
from streams.runtime.record_collector import RecordCollector
from streams.runtime.state_updater import StateUpdater
from streams.runtime.task_manager import TaskManager
from streams.runtime.tasks import Tasks
from streams.runtime.thread_status import StatusReporter
from streams.runtime.transaction_errors import revivable
from streams.runtime.transactions import TransactionalCollector, TransactionalCommitter

log = logging.getLogger(__name__)

#: Rebalance callbacks that may fail in a row before the thread gives up.
MAX_REBALANCE_FAILURES = 3
#: An assignment, or a restored task's start, that took this long or longer logs where the
#: time went.
SLOW_TAKE_UP_S = 0.05


@dataclass
class AssignmentTiming:
    """Where the time went between a round's assignment and its tasks taken up (monotonic
    seconds): the moved tasks wait on all of it."""

    received_at: float
    locked_at: float = 0.0
    opened_at: float = 0.0

    def report(self, name: str, applied_at: float) -> None:
        """Log the parts when the whole took :data:`SLOW_TAKE_UP_S` or more."""
        if applied_at - self.received_at < SLOW_TAKE_UP_S:
            return
        log.info("%s: assignment applied %.2fs after it came (%.2fs waiting for the thread's "
                 "lock, %.2fs opening stores, %.2fs taking the tasks up)", name,
                 applied_at - self.received_at, self.locked_at - self.received_at,
                 self.opened_at - self.locked_at, applied_at - self.opened_at)


class RebalanceListener(ConsumerRebalanceListener):
    def __init__(
        self, config: AppConfig, lock: asyncio.Lock, lifecycle: Lifecycle,
        consumer: GroupConsumer, producer: Any, registry: Tasks, task_manager: TaskManager,
        state_updater: StateUpdater, committer: Committer | TransactionalCommitter,
        member: GroupMember, reporter: StatusReporter, handover: LearnerHandover,
        hooks: RoundHooks, member_files: MemberFiles | None = None,
        collector: RecordCollector | TransactionalCollector | None = None,
    ) -> None:
        self.config = config
        self.lock = lock
        self.lifecycle = lifecycle
        self.consumer = consumer
        self.producer = producer
        self.registry = registry
        self.task_manager = task_manager
        self.state_updater = state_updater
        self.committer = committer
        self.member = member
        self.reporter = reporter
        self.handover = handover
        self.hooks = hooks
        #: Where this thread keeps its member id for a restart after a crash to remove
        #: (see :mod:`streams.group.predecessors`).
        self.member_files = member_files
        #: Ships the tasks' records: what lost tasks queued is dropped (None: nothing is).
        self.collector = collector
        self.name = member.name
        #: Between the revocation and the assignment callbacks: fetched batches are dropped
        #: (kept partitions are sought back to their processed offset after the rebalance).
        self.awaiting_assignment = False
        self._failures = 0
        self._reporting: set[asyncio.Task[None]] = set()
        self.copy_opener = CopyOpener(self.name, lock, lifecycle, registry, task_manager,
                                      self.failed)

    async def on_partitions_revoked(self, revoked: Any) -> None:
        try:
            await self._revoked()
        except Exception as exc:
            self.failed("on_partitions_revoked", exc)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        try:
            await self._assigned()
        except Exception as exc:
            self.failed("on_partitions_assigned", exc)

    async def on_partitions_lost(self, lost: Any) -> None:
        try:
            await self._lost()
        except Exception as exc:
            self.failed("on_partitions_lost", exc)

    async def _lost(self) -> None:
        # The broker ended this member's membership: its tasks may run elsewhere already.
        # They stop now, committing nothing (a commit would fail, and outputs or changelog
        # records written from here on would land after their new owner's); their input is
        # read again from the group's offsets by whoever gets them in the coming round.
        async with self.lock:
            self.lifecycle.set_state(ThreadState.REBALANCING)
            self.awaiting_assignment = True
            self.reporter.round_revoked()
            lost = [*self.registry.active, *self.registry.restoring]
            for task_id in lost:
                self.task_manager.close_task(task_id)
            if lost and self.collector is not None:
                # Records still queued would land after the new owner's (those queued before
                # a long stop expired already: streams.runtime.delivery).
                self.collector.discard_queued()
            if lost:
                log.warning("%s: lost %s with its membership; stopped them uncommitted",
                            self.name, sorted(lost))
                self.reporter.update()

    async def before_join(self) -> None:
        """As the member joins a round: give up running tasks whose ready learners are asked
        to take over in it (streams.group.promotion_asks)."""
        self.reporter.status.in_round = True
        self.reporter.update()
        try:
            await self.handover.before_join(self.member)
        except Exception as exc:
            self.failed("before_join", exc)

    async def _revoked(self) -> None:
        # Cooperative: called at join-complete with only what moved. Eager: called before
        # every rebalance with everything; stop-the-world then closes every task too.
        async with self.lock:
            self.lifecycle.set_state(ThreadState.REBALANCING)
            self.awaiting_assignment = True
            self.reporter.round_revoked()
            if self.registry.active:
                try:
                    await self.committer.commit(force=True)
                except Exception:
                    log.exception("%s: commit before rebalance failed", self.name)
            if not self.config.cooperative:
                self.task_manager.close_all()

    async def _assigned(self) -> None:
        assignment = self.member.take_assignment()
        status = self.reporter.status
        timing = AssignmentTiming(time.monotonic())
        async with self.lock:
            timing.locked_at = time.monotonic()
            self.awaiting_assignment = False
            status.rebalances += 1
            status.in_round = False
            if self.member_files is not None and self.consumer.member_id != status.member_id:
                self.member_files.record(self.member.identity.index, self.consumer.member_id,
                                         self.member.static_id)
            status.member_id = self.consumer.member_id
            status.generation = self.consumer.generation
            if assignment is None:
                log.warning("%s: assignment without Relay user data", self.name)
                return
            if assignment.error:
                self.lifecycle.fail(FatalThreadError(assignment.error))
                return
            if self.lifecycle.closing:
                # A round that completes while the thread closes (its consumer still in the
                # group): nothing is opened, since nothing would close it again.
                log.info("%s: stopping; not taking up the round's assignment %s", self.name,
                         list(assignment.active))
                self._round_applied(tell_followers=False)
                return
            await self.task_manager.open_ahead(assignment)
            timing.opened_at = time.monotonic()
            self._apply(assignment)
            timing.report(self.name, time.monotonic())
            self.copy_opener.schedule()
            # A leaving static leader tells its followers once it has left (see the thread's
            # close).
            self._round_applied(tell_followers=not self.leaves_explicitly)
            self.reporter.record_round(self.consumer.round_started)
            self._failures = 0
            self.lifecycle.set_state(ThreadState.RUNNING)
            self.member.publish_subscription()
            self.member.ask_again_if_asked_during_round()

    @property
    def leaves_explicitly(self) -> bool:
        """A static member told to shut down sends LeaveGroup itself when it closes."""
        return self.lifecycle.shutdown_requested and self.member.static_id is not None

    def _round_applied(self, tell_followers: bool) -> None:
        self.hooks.assignment_applied(self.member)
        if not self.config.cooperative:
            # Stop-the-world members neither report their rounds nor wait for the others'.
            if tell_followers:
                self.hooks.tell_followers(self.member)
            return
        status = self.reporter.status
        self.hooks.round_applied(self.member, self.producer, self.config.application_id,
                                 status.member_id, status.generation, tell_followers,
                                 self._reporting)

    def _apply(self, assignment: MemberAssignment) -> None:
        identity = self.member.identity
        self.task_manager.handle_assignment(assignment)
        self.state_updater.learners_assigned(
            assignment.group_learners,
            being_promoted(assignment.notes, (identity.instance_id, identity.index)),
            self.reporter.status.generation, assignment.group_size)
        self.reporter.being_learned = tuple(assignment.being_learned)
        self.member.schedule_rejoin(assignment.rejoin_after_ms)
        if assignment.shutdown and assignment.revoked:
            # A leaving member is told to shut down in the round that revokes its last tasks.
            # It still takes part in the follow-up round, which gives them to their learners:
            # leaving at once would leave them unassigned until its departure starts a round,
            # and a broker may start none for a static member's LeaveGroup until its session
            # expires.
            log.info("%s: told to shut down; leaving after the round that assigns %s",
                     self.name, list(assignment.revoked))
        elif assignment.shutdown:
            log.info("%s: told to shut down (nothing left to run)", self.name)
            self.lifecycle.shut_down()
        self.reporter.update()
        log.info(
            "%s: active=%s restoring=%s copies=%s revoked=%s", self.name,
            sorted(self.registry.active), sorted(self.registry.restoring),
            {t: r.value for t, r in self.registry.copy_roles.items()}
            | {t: f"{r.value} (opens once the actives run)"
               for t, r in self.registry.deferred.items()},
            list(assignment.revoked),
        )

    async def close(self) -> None:
        """The thread closes: deferred copies are not opened any more."""
        await self.copy_opener.close()

    def failed(self, callback: str, error: BaseException) -> None:
        """A rebalance callback failed: never swallowed. The thread drops every task and
        rejoins, so the group plans again; after several failures in a row it stops with
        the error."""
        self._failures += 1
        log.error("%s: %s failed (%d in a row): %s: %s", self.name, callback,
                  self._failures, type(error).__name__, error, exc_info=error)
        if self._failures >= MAX_REBALANCE_FAILURES:
            self.lifecycle.fail(FatalThreadError(
                f"{self.name}: rebalance callback {callback} failed "
                f"{self._failures} times in a row: {type(error).__name__}: {error}"))
            return
        self.task_manager.close_all()
        self.reporter.update()
        self.member.request_rejoin(f"{callback} failed; starting over")

    async def start_restored(self, task_id: str, stores: dict[str, KeyValueStore]) -> None:
        """The state updater's news: a new active's state is restored, so it may run. Its
        offsets are read first, without the lock: the thread's other tasks go on meanwhile."""
        began = time.monotonic()
        offsets = await self.task_manager.start_offsets(task_id, stores)
        if offsets is None:
            return
        read = time.monotonic()
        async with self.lock:
            locked = time.monotonic()
            if await self.task_manager.start_restored(task_id, stores, offsets):
                self.copy_opener.restoring_changed()
                self.reporter.update()
                started = time.monotonic()
                if started - began >= SLOW_TAKE_UP_S:
                    log.info("%s: task %s started %.2fs after its restoration (%.2fs reading "
                             "its start offsets, %.2fs waiting for the thread's lock)",
                             self.name, task_id, started - began, read - began, locked - read)


class FailedTransactions:
    """Exactly-once: a task whose transaction failed had its writes discarded. A failure
    that no other producer caused (see :mod:`streams.runtime.transaction_errors`) revives
    the task in place, without the group; after a fencing the task is closed, and reopens
    from its committed state when the group hands it back, in the round asked for."""

    def __init__(self, task_manager: TaskManager, member: GroupMember) -> None:
        self.task_manager = task_manager
        self.member = member

    def task_failed(self, task_id: str, error: BaseException) -> None:
        if revivable(error) and self.task_manager.revive(task_id):
            return
        self.task_manager.close_task(task_id)
        self.member.request_rejoin(f"the transaction of {task_id} failed: {error}")
