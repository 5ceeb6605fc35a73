"""The registry of a thread's tasks: running actives, actives restoring their state, and
standby and learner copies, by task id and (for running actives) by input partition; and
deferred copies, assigned but with their stores not opened yet (see
:mod:`streams.runtime.copy_opening`).

Plain bookkeeping: opening, closing and restoring stores is the task manager's and the state
updater's job.
"""

from __future__ import annotations

from aiokafka.structs import TopicPartition

from statestore.store import KeyValueStore
from streams.runtime.task import StreamTask
from streams.runtime.transitions import Role


class Tasks:
    def __init__(self) -> None:
        #: Running actives by id.
        self.active: dict[str, StreamTask] = {}
        #: Actives whose stores are being restored before they run.
        self.restoring: dict[str, dict[str, KeyValueStore]] = {}
        #: Standby and learner copies: their stores and their role.
        self.copies: dict[str, dict[str, KeyValueStore]] = {}
        self.copy_roles: dict[str, Role] = {}
        #: Copies the last assignment added whose stores open once its moved actives run.
        #: Not among :meth:`roles`: the next assignment decides them anew.
        self.deferred: dict[str, Role] = {}
        self._by_partition: dict[TopicPartition, StreamTask] = {}

    def roles(self) -> dict[str, Role]:
        """Every task this thread holds and its role (the input of the transition plan)."""
        current: dict[str, Role] = {t: Role.ACTIVE for t in self.active}
        current.update({t: Role.RESTORING for t in self.restoring})
        current.update(self.copy_roles)
        return current

    def ids(self) -> list[str]:
        return list(self.active) + list(self.restoring) + list(self.copies) + list(self.deferred)

    def running(self) -> list[StreamTask]:
        """The running actives: what a commit commits."""
        return list(self.active.values())

    def held(self) -> list[str]:
        """Actives, running or restoring, in no particular order."""
        return [*self.active, *self.restoring]

    def owned(self) -> tuple[str, ...]:
        """Actives, running or restoring: what the subscription reports as owned."""
        return tuple(sorted(set(self.active) | set(self.restoring)))

    def copies_with(self, role: Role) -> list[str]:
        """The copies with this role, deferred ones included."""
        return sorted({*(t for t, r in self.copy_roles.items() if r is role),
                       *(t for t, r in self.deferred.items() if r is role)})

    def task_for(self, tp: TopicPartition) -> StreamTask | None:
        return self._by_partition.get(tp)

    # -- changes ---------------------------------------------------------------------------

    def add_running(self, task: StreamTask) -> None:
        self.active[task.task_id] = task
        for tp in task.partitions:
            self._by_partition[tp] = task

    def add_restoring(self, task_id: str, stores: dict[str, KeyValueStore]) -> None:
        self.restoring[task_id] = stores

    def add_copy(self, task_id: str, role: Role, stores: dict[str, KeyValueStore]) -> None:
        self.copies[task_id] = stores
        self.copy_roles[task_id] = role

    def retag(self, task_id: str, role: Role) -> None:
        self.copy_roles[task_id] = role

    def remove_running(self, task_id: str) -> StreamTask | None:
        task = self.active.pop(task_id, None)
        if task is not None:
            for tp in task.partitions:
                if self._by_partition.get(tp) is task:
                    del self._by_partition[tp]
        return task

    def remove_restoring(self, task_id: str) -> dict[str, KeyValueStore] | None:
        return self.restoring.pop(task_id, None)

    def remove_copy(self, task_id: str) -> dict[str, KeyValueStore] | None:
        self.copy_roles.pop(task_id, None)
        return self.copies.pop(task_id, None)
