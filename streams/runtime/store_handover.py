"""Handing a task's stores from one stream thread to another of the same process.

A store's directory is locked per open file, so two threads of one process clash on it just
as two processes do. Within a rebalance the threads get their assignments one after the
other: a thread told to run a task may come first while another thread of this process still
holds a standby or learner copy of it, whose own new assignment drops the copy a moment
later. Instead of failing on the lock, the newcomer takes the open stores over: the holder
lets go of the copy (without closing its stores), and the copy's state is kept.
"""

from __future__ import annotations

import logging
from typing import Protocol

from statestore.store import KeyValueStore

log = logging.getLogger(__name__)


class StoreHolder(Protocol):
    def give_up(self, task_id: str) -> dict[str, KeyValueStore] | None:
        """Let go of a copy of ``task_id`` and return its open stores; None when the task is
        not held as a copy (an active task is never given away)."""
        ...


class ProcessStores:
    """Which thread of this process holds each task's stores open."""

    def __init__(self) -> None:
        self._holders: dict[str, StoreHolder] = {}

    def hold(self, task_id: str, holder: StoreHolder) -> None:
        self._holders[task_id] = holder

    def release(self, task_id: str, holder: StoreHolder) -> None:
        if self._holders.get(task_id) is holder:
            del self._holders[task_id]

    def held_by_another(self, task_id: str, me: StoreHolder) -> bool:
        holder = self._holders.get(task_id)
        return holder is not None and holder is not me

    def take_over(self, task_id: str, taker: StoreHolder) -> dict[str, KeyValueStore] | None:
        """The open stores of ``task_id`` if another thread of this process held them as a
        copy (they are ``taker``'s from now on); None when nobody else here holds them."""
        holder = self._holders.get(task_id)
        if holder is None or holder is taker:
            return None
        stores = holder.give_up(task_id)
        if stores is not None:
            self._holders[task_id] = taker
            log.info("task %s handed over between two threads of this process", task_id)
        return stores
