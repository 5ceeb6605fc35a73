"""The task manager: carries out the pure transition plan (:mod:`streams.runtime.transitions`) when
an assignment arrives, and owns the lifecycle of a thread's tasks and copies.

- close what the member no longer has (state stays on disk);
- demote actives that become standby or learner copies (their stores stay open);
- open new copies, and hand them to the state updater to follow: in a round that also starts
  actives, once those run (copies deferred, :mod:`streams.runtime.copy_opening`);
- start new actives: restoring first (from a copy this member held, if any), running once
  restored, at the input position their state reflects. Their committed offsets are asked
  for as soon as they are assigned: asked for later, while the member joins the next round,
  the request would wait behind the JoinGroup on the coordinator's connection (a broker
  answers a connection's requests in order), and the restored task with it;
- seek kept partitions back to where their task stopped, pause the partitions of actives that
  are still restoring, and read their input ahead once their committed offsets are known
  (fetched, held back from the thread), so that a task taken over from a standby has its
  first records at hand when it starts.

Opening a store may take long: one that bootstraps from a snapshot loads its files and may
seed its changelog (:mod:`statestore.recovery`). With ``open_off_loop`` the stores an
assignment needs are opened first, in worker threads (:meth:`TaskManager.open_ahead`), so that
the event loop goes on heartbeating and running the process's other threads meanwhile; the
assignment is then applied on the loop in one step, as before.

Stores a thread opens are registered with the process (:mod:`streams.runtime.store_handover`), so a
task moving between two threads of one process is handed over rather than clashing on its
lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.structs import TopicPartition

from assignor import MemberAssignment
from statestore.store import KeyValueStore
from streams.group.partition_assignor import TaskLayout
from streams.kafka.driver import GroupConsumer
from streams.quirks.task_positions import PositionReader
from streams.runtime.state_updater import StateUpdater
from streams.runtime.store_handover import ProcessStores
from streams.runtime.task import StreamTask
from streams.runtime.tasks import Tasks
from streams.runtime.transitions import Plan, Role, plan_transitions

log = logging.getLogger(__name__)

#: Start offsets that take longer than this to read are logged with their duration.
SLOW_OFFSETS_S = 1.0


@dataclass(frozen=True)
class StartOffsets:
    """A restored task's offsets from the broker: recorded by its transactions (broker quirk
    ``deferred-transactional-offsets``) and committed in the group."""

    recorded: dict[TopicPartition, int]
    committed: dict[TopicPartition, int]


class TaskManager:
    def __init__(
        self,
        name: str,
        layout: TaskLayout,
        tasks: Tasks,
        consumer: GroupConsumer,
        state_updater: StateUpdater,
        process_stores: ProcessStores,
        open_stores: Callable[[str], dict[str, KeyValueStore]],
        positions: PositionReader | None = None,
        *,
        open_off_loop: bool = False,
    ) -> None:
        self._name = name
        #: Each task's input positions beside the group's offsets (broker quirk
        #: ``deferred-transactional-offsets``); None where the group's offsets suffice.
        self._positions = positions
        self._layout = layout
        self.tasks = tasks
        self._consumer = consumer
        self._updater = state_updater
        self._process_stores = process_stores
        self._open_stores = open_stores
        self._open_off_loop = open_off_loop
        #: Stores opened ahead of the assignment that needs them (:meth:`open_ahead`).
        self._opened_ahead: dict[str, dict[str, KeyValueStore]] = {}
        #: The committed offsets of each restoring active, asked for when it was assigned.
        self._committed: dict[str, asyncio.Future[dict[TopicPartition, int]]] = {}
        #: Restoring actives whose input is read ahead: the offsets their partitions were
        #: sought to (:meth:`_read_ahead_of`).
        self._read_ahead: dict[str, dict[TopicPartition, int]] = {}
        #: Revived tasks that start from their committed offsets whatever input position
        #: their restored state reflects (:meth:`replay`).
        self._replaying: set[str] = set()

    # -- applying an assignment -------------------------------------------------------------

    async def open_ahead(self, assignment: MemberAssignment) -> None:
        """With ``open_off_loop``: open, each in a worker thread, the stores of the tasks
        ``assignment`` adds that no thread of this process holds; :meth:`handle_assignment`
        takes them. Whatever fails closes what was opened, and raises."""
        if not self._open_off_loop:
            return
        plan = plan_transitions(self.tasks.roles(), assignment)
        copies = [] if _defers_copies(plan) else [task_id for task_id, _role in plan.add_copies]
        new = [*copies, *(task_id for task_id in plan.start if task_id not in plan.promote)]
        try:
            for task_id in new:
                if (task_id in self._opened_ahead or task_id in self.tasks.roles()
                        or self._process_stores.held_by_another(task_id, self)):
                    continue
                self._opened_ahead[task_id] = await self._open_in_worker(task_id)
                # Held at once: another thread of this process leaves it alone meanwhile.
                self._process_stores.hold(task_id, self)
        except BaseException:
            self._close_opened_ahead()
            raise

    async def _open_in_worker(self, task_id: str) -> dict[str, KeyValueStore]:
        """``open_stores(task_id)`` in a worker thread. Cancelled meanwhile (the thread
        stops), the stores are closed once the worker has opened them: none stays locked."""
        future = asyncio.get_running_loop().run_in_executor(None, self._open_stores, task_id)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_close_opened)
            raise

    def _close_opened_ahead(self) -> None:
        """Close stores opened ahead that the assignment did not take (it changed meanwhile)."""
        for task_id, stores in self._opened_ahead.items():
            self._process_stores.release(task_id, self)
            for store in stores.values():
                store.close()
        self._opened_ahead.clear()

    def handle_assignment(self, assignment: MemberAssignment) -> Plan:
        try:
            return self._apply(assignment)
        finally:
            self._close_opened_ahead()

    def _apply(self, assignment: MemberAssignment) -> Plan:
        plan = plan_transitions(self.tasks.roles(), assignment)
        # Copies deferred by the last assignment are decided anew by this one.
        self.tasks.deferred.clear()
        defers = _defers_copies(plan)
        for task_id in plan.close:
            self.close_task(task_id)
        for task_id, role in plan.demote:
            self._add_copy(task_id, role, self._stop_active(task_id))
        for task_id, role in plan.retag:
            self.tasks.retag(task_id, role)
        for task_id, role in plan.add_copies:
            stores = self._process_stores.take_over(task_id, self)
            if stores is None and self._process_stores.held_by_another(task_id, self):
                # Another thread of this process runs it: a copy on the same instance adds
                # nothing, and its store is locked. Not held, so not reported either.
                log.warning("%s: not keeping a %s copy of %s, which another thread of this "
                            "process runs", self._name, role.value, task_id)
                continue
            if stores is None and defers and task_id not in self._opened_ahead:
                self.tasks.deferred[task_id] = role
                continue
            self._add_copy(task_id, role, self._open(task_id) if stores is None else stores)
        for task_id in plan.start:
            stores = self._remove_copy(task_id) if task_id in plan.promote else None
            if stores is None:
                stores = self._stores_for(task_id)
            self.tasks.add_restoring(task_id, stores)
            self._ask_committed(task_id)
        # Kept partitions resume where their task stopped; restoring ones wait paused, and
        # are read ahead again where their committed offsets are known.
        for task in self.tasks.active.values():
            for tp in task.partitions:
                if tp in task.processed:
                    self._consumer.seek(tp, task.processed[tp])
        for task_id in list(self._read_ahead):
            self._stop_reading_ahead(task_id)
        paused = [tp for task_id in self.tasks.restoring for tp in self.partitions_of(task_id)]
        if paused:
            self._consumer.pause(*paused)
        for task_id, future in self._committed.items():
            if future.done():
                self._read_ahead_of(task_id, future)
        self._updater.assignment_changed()
        return plan

    async def open_deferred_copy(self) -> bool:
        """Open the stores of one deferred copy (in a worker thread with ``open_off_loop``)
        and hand it to the state updater. False once none is left."""
        if not self.tasks.deferred:
            return False
        task_id = next(iter(self.tasks.deferred))
        role = self.tasks.deferred[task_id]
        stores = self._process_stores.take_over(task_id, self)
        if stores is None:
            if self._process_stores.held_by_another(task_id, self):
                del self.tasks.deferred[task_id]
                log.warning("%s: not keeping a %s copy of %s, which another thread of this "
                            "process runs", self._name, role.value, task_id)
                return True
            if self._open_off_loop:
                stores = await self._open_in_worker(task_id)
            else:
                stores = self._open_stores(task_id)
            if (self.tasks.deferred.get(task_id) is not role
                    or self._process_stores.held_by_another(task_id, self)):
                # Decided anew, or taken by another thread of this process, while its stores
                # opened in a worker thread.
                for store in stores.values():
                    store.close()
                return True
            self._process_stores.hold(task_id, self)
        del self.tasks.deferred[task_id]
        self._add_copy(task_id, role, stores)
        self._updater.assignment_changed()
        return True

    def partitions_of(self, task_id: str) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in self._layout.partitions_of(task_id)]

    def _stores_for(self, task_id: str) -> dict[str, KeyValueStore]:
        """The task's stores: taken over from another thread of this process that holds them
        as a copy, or opened."""
        stores = self._process_stores.take_over(task_id, self)
        return self._open(task_id) if stores is None else stores

    def _open(self, task_id: str) -> dict[str, KeyValueStore]:
        stores = self._opened_ahead.pop(task_id, None)
        if stores is None:
            stores = self._open_stores(task_id)
        self._process_stores.hold(task_id, self)
        return stores

    # -- restored actives become running tasks ---------------------------------------------

    def _ask_committed(self, task_id: str) -> None:
        self._forget_committed(task_id)
        with contextlib.suppress(RuntimeError):  # no running loop: asked at the start
            future = asyncio.ensure_future(self._read_committed(self.partitions_of(task_id)))
            self._committed[task_id] = future
            future.add_done_callback(lambda done: self._read_ahead_of(task_id, done))

    def _forget_committed(self, task_id: str) -> None:
        self._stop_reading_ahead(task_id)
        future = self._committed.pop(task_id, None)
        if future is not None:
            future.cancel()

    def _read_ahead_of(self, task_id: str, future: asyncio.Future[Any]) -> None:
        """Fetch a restoring task's input from its committed offsets while its state is
        restored, holding the records back (:meth:`GroupConsumer.hold`): a task taken over
        from a standby restores in a moment, and then waited a fetch or more for its first
        records. The partitions are sought where the task will start unless its restored
        state or its recorded positions say later (then sought again, the records read
        ahead dropped). Partitions with no committed offset are not read ahead."""
        if (self._committed.get(task_id) is not future or future.cancelled()
                or future.exception() is not None or task_id not in self.tasks.restoring
                or task_id in self._read_ahead):
            return
        offsets: dict[TopicPartition, int] = future.result()
        assigned = self._consumer.assignment()
        ahead = {tp: offsets[tp] for tp in self.partitions_of(task_id)
                 if tp in assigned and tp in offsets}
        if not ahead:
            return
        self._consumer.hold(*ahead)
        self._read_ahead[task_id] = ahead
        try:
            for tp, offset in ahead.items():
                self._consumer.seek(tp, offset)
            self._consumer.resume(*ahead)
        except Exception as exc:  # the consumer stopped, say: the task starts as before
            log.info("%s: not reading %s's input ahead (%s)", self._name, task_id, exc)
            self._stop_reading_ahead(task_id)

    def _stop_reading_ahead(self, task_id: str) -> None:
        ahead = self._read_ahead.pop(task_id, None)
        if ahead is not None:
            assigned = self._consumer.assignment()
            self._consumer.pause(*[tp for tp in ahead if tp in assigned])
            self._consumer.release(*ahead)

    async def _read_committed(self, partitions: list[TopicPartition],
                              ) -> dict[TopicPartition, int]:
        committed: dict[TopicPartition, int] = {}
        for tp in partitions:
            offset = await self._consumer.committed(tp)
            if offset is not None and offset >= 0:
                committed[tp] = offset
        return committed

    async def _committed_offsets(self, task_id: str, partitions: list[TopicPartition],
                                 ) -> dict[TopicPartition, int]:
        """The offsets asked for at assignment; asked again if that failed."""
        future = self._committed.pop(task_id, None)
        if future is not None:
            try:
                return dict(await future)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                # Only the request was cancelled (its task was closed meanwhile): asked
                # again, and the caller sees whether the task still restores.
            except Exception as exc:
                log.info("%s: asking for %s's committed offsets again (%s)", self._name,
                         task_id, exc)
        return await self._read_committed(partitions)

    async def start_offsets(self, task_id: str, stores: dict[str, KeyValueStore],
                            ) -> StartOffsets | None:
        """What a restored task's start needs from the broker: the offsets its committed
        transactions recorded and the group's offsets. The thread's lock need not be held:
        read after a revival, from a group coordinator that is still loading, they took over
        a minute, and the thread's other tasks would have waited with it. None if the task is
        no longer restoring these stores."""
        if self.tasks.restoring.get(task_id) is not stores:
            return None
        partitions = self.partitions_of(task_id)
        started = time.monotonic()
        recorded: dict[TopicPartition, int] = {}
        if self._positions is not None:
            recorded = await self._positions.latest(task_id, partitions)
        offsets = StartOffsets(recorded, await self._committed_offsets(task_id, partitions))
        took = time.monotonic() - started
        if took > SLOW_OFFSETS_S:
            log.info("%s: the start offsets of %s took %.1f s to read", self._name, task_id, took)
        return offsets

    async def start_restored(self, task_id: str, stores: dict[str, KeyValueStore],
                             offsets: StartOffsets | None = None) -> bool:
        """Run ``task_id`` if it is still restoring these stores; False if it was revoked.
        ``offsets``: read beforehand (:meth:`start_offsets`), or read now."""
        if offsets is None:
            offsets = await self.start_offsets(task_id, stores)
        if offsets is None or self.tasks.restoring.get(task_id) is not stores:
            return False  # revoked (or the thread closed) while its offsets were read
        # Nothing awaits from here until the task is registered as running: stores that sat
        # in neither registry across an await would be missed by whatever closes the
        # thread's tasks meanwhile, and stay open, their directory locked, for good.
        self.tasks.remove_restoring(task_id)
        for store in stores.values():
            store.end_bulk_load()  # the task reads it from now on
        task = StreamTask(task_id, self._layout.sub_of(task_id), stores)
        recorded, committed = offsets.recorded, dict(offsets.committed)
        restored_position = task.restored_input_position()
        replaying = task_id in self._replaying
        if replaying:
            # Outputs of the input past the committed offsets were lost: it is processed
            # again, over a state that may reflect part of it (duplicates, not losses).
            self._replaying.discard(task_id)
            restored_position = {}
        for tp in task.partitions:
            # The group's offset may lag the last committed transaction (see
            # streams.quirks.task_positions): the task's own record of it is then later.
            if tp in recorded and recorded[tp] > committed.get(tp, -1):
                committed[tp] = recorded[tp]
            # The state may already reflect records past the committed offset (a member that
            # died after its changelog was written but before it committed): skip those.
            if tp in restored_position and restored_position[tp] > committed.get(tp, -1):
                committed[tp] = restored_position[tp]
        self.tasks.add_running(task)
        # Partitions read ahead from where the task starts keep what was fetched meanwhile
        # (a seek drops it).
        ahead = self._read_ahead.pop(task_id, {})
        assigned = self._consumer.assignment()
        from_start = [tp for tp in task.partitions if tp in assigned and tp not in committed]
        for tp in task.partitions:
            if tp in assigned and tp in committed:
                if ahead.get(tp) != committed[tp]:
                    self._consumer.seek(tp, committed[tp])
                task.processed[tp] = committed[tp]
        if replaying:
            # The state's position says where it starts now, in its next changelog records:
            # a restoration elsewhere after those does not skip the input again.
            task.record_input_position()
        for tp in from_start:
            await self._consumer.seek_to_beginning(tp)
        if self.tasks.active.get(task_id) is not task:
            self._consumer.release(*ahead)
            return False  # closed while it sought the beginning
        assigned = self._consumer.assignment()
        self._consumer.resume(*[tp for tp in task.partitions if tp in assigned])
        self._consumer.release(*ahead)
        log.info("%s: task %s restored and running from %s", self._name, task_id,
                 {f"{tp.topic}[{tp.partition}]": committed.get(tp, "the beginning")
                  for tp in task.partitions if tp in assigned} or "no assigned partition")
        return True

    # -- stopping, demoting, closing -------------------------------------------------------

    def _stop_active(self, task_id: str) -> dict[str, KeyValueStore]:
        task = self.tasks.remove_running(task_id)
        if task is not None:
            return task.stores
        stores = self.tasks.remove_restoring(task_id) or {}
        self._updater.cancel_restore(stores)
        return stores

    def _add_copy(self, task_id: str, role: Role, stores: dict[str, KeyValueStore]) -> None:
        self.tasks.add_copy(task_id, role, stores)
        self._updater.follow(stores, task_id)

    def _remove_copy(self, task_id: str) -> dict[str, KeyValueStore] | None:
        stores = self.tasks.remove_copy(task_id)
        if stores is not None:
            self._updater.unfollow(task_id, stores)
        return stores

    def release(self, task_ids: list[str]) -> None:
        """Give running tasks up before a round, for their ready learners to take in it (see
        :mod:`streams.group.promotion_asks`). Their state stays as standby copies, and their
        partitions stay paused until the round's assignment says what becomes of them."""
        for task_id in task_ids:
            self._forget_committed(task_id)
            self._add_copy(task_id, Role.STANDBY, self._stop_active(task_id))
            self._consumer.pause(*self.partitions_of(task_id))
            log.info("%s: gave up %s for its ready learner; keeps its state as a copy",
                     self._name, task_id)

    async def warm_up(self, task_ids: Iterable[str]) -> list[str]:
        """Before the first join: open learner copies of these tasks (streams.group.warm_up),
        in worker threads with ``open_off_loop``. A task whose stores cannot be opened is left
        out, with a warning: it is learned after the join, as usual."""
        opened: list[str] = []
        for task_id in task_ids:
            try:
                if self._open_off_loop:
                    stores = await self._open_in_worker(task_id)
                    self._process_stores.hold(task_id, self)
                else:
                    stores = self._open(task_id)
                self._add_copy(task_id, Role.LEARNER, stores)
            except Exception as exc:
                log.warning("%s: not warming up %s (%s: %s)", self._name, task_id,
                            type(exc).__name__, exc)
                continue
            opened.append(task_id)
        return opened

    def give_up(self, task_id: str) -> dict[str, KeyValueStore] | None:
        """Another thread of this process takes this copy over (see ProcessStores)."""
        self.tasks.deferred.pop(task_id, None)
        if task_id not in self.tasks.copies:
            return None
        log.info("%s: hands its %s copy of %s to another thread of this process",
                 self._name, self.tasks.copy_roles[task_id].value, task_id)
        return self._remove_copy(task_id)

    def close_task(self, task_id: str) -> None:
        if self.tasks.deferred.pop(task_id, None) is not None:
            return  # nothing opened yet
        self._forget_committed(task_id)
        self._replaying.discard(task_id)
        if task_id in self.tasks.active or task_id in self.tasks.restoring:
            stores = self._stop_active(task_id)
        else:
            stores = self._remove_copy(task_id) or {}
        self._process_stores.release(task_id, self)
        for store in stores.values():
            store.close()  # commits what the changelog holds; says so and drops the rest
        log.info("%s: closed task %s (state stays on disk)", self._name, task_id)

    def revive(self, task_id: str) -> bool:
        """Stop an active task of this thread dirty (its uncommitted writes dropped) and
        start it again at once from its committed state, as a new assignment would: fenced
        anew, restored from its changelog, its input sought to its committed position. False
        (and closed) if the thread no longer holds all its partitions.

        Its stores stay open: rolled back to their last commit, which is what a closed and
        reopened store would hold too, without RocksDB's close and open (0.5 to 1 s each on
        the event loop after a broker's SIGKILL). Its committed offsets are read once it is
        restored, not now: its transaction may be undecided (a commit that timed out), and
        only the new producer's fencing, before the restoration, settles it; the restoration
        then applies what such a commit wrote past the stores' checkpoint."""
        if task_id not in self.tasks.active and task_id not in self.tasks.restoring:
            return False
        partitions = self.partitions_of(task_id)
        if not set(partitions) <= self._consumer.assignment():
            self.close_task(task_id)
            return False
        self._forget_committed(task_id)
        stores = self._stop_active(task_id)
        for store in stores.values():
            store.abort(reported=True)  # its transaction was aborted
        self._consumer.pause(*partitions)
        self.tasks.add_restoring(task_id, stores)
        self._updater.assignment_changed()
        log.info("%s: revived task %s in place from its committed state", self._name, task_id)
        return True

    def replay(self, task_id: str, committed: Mapping[TopicPartition, int]) -> bool:
        """At-least-once: some of the task's records were not delivered (see
        :mod:`streams.runtime.delivery_errors`), so its input since its last commit is
        processed again. A stateful task is rolled back in place (:meth:`_roll_back`); one
        that cannot be (no state, or a position its state does not know) is revived as by
        :meth:`revive`, and then starts from its committed offsets even where its restored
        state reflects input past them (the changelog got records whose outputs were lost).
        ``committed``: the offsets this thread last committed."""
        if self._roll_back(task_id, committed):
            return True
        if not self.revive(task_id):
            return False
        self._replaying.add(task_id)
        return True

    def _roll_back(self, task_id: str, committed: Mapping[TopicPartition, int]) -> bool:
        """Drop the task's writes since its stores' last commit and run it again at once, in
        place, from the input position that commit reflects (or, for a partition the state
        has no position of, the offset this thread committed): its outputs since repeat, its
        state stays exact, and nothing is read from the changelog (records of the failed
        commit that got there are written again by the input processed again). False, with
        nothing done, if the position of one of its partitions is not known here."""
        task = self.tasks.active.get(task_id)
        partitions = self.partitions_of(task_id)
        if task is None or not task.stores or not set(partitions) <= self._consumer.assignment():
            return False
        for store in task.stores.values():
            # Called once the commit's flush returned: every record handed has been reported.
            store.abort(reported=True)
        again = StreamTask(task_id, self._layout.sub_of(task_id), task.stores)
        position = again.restored_input_position()
        start = {tp: position[tp] if tp in position else committed.get(tp) for tp in partitions}
        if any(offset is None for offset in start.values()):
            return False
        self.tasks.remove_running(task_id)
        self.tasks.add_running(again)
        for tp, offset in start.items():
            assert offset is not None
            self._consumer.seek(tp, offset)
            again.processed[tp] = offset
        log.info("%s: rolled task %s back to its last commit, from %s", self._name, task_id,
                 {f"{tp.topic}[{tp.partition}]": offset for tp, offset in start.items()})
        return True

    def close_all(self) -> None:
        for task_id in self.tasks.ids():
            try:
                self.close_task(task_id)
            except Exception:
                log.exception("%s: closing %s failed", self._name, task_id)


def _defers_copies(plan: Plan) -> bool:
    """Whether the plan's new copies open after its started actives run: opening a copy's
    stores takes tens of milliseconds per task on the event loop, and a moved active would
    wait for all of them."""
    return bool(plan.start)


def _close_opened(future: asyncio.Future[dict[str, KeyValueStore]]) -> None:
    """Close the stores a worker opened for a caller that is gone."""
    if future.cancelled() or future.exception() is not None:
        return
    for store in future.result().values():
        with contextlib.suppress(Exception):
            store.close()
