"""A stream thread's states and the lifecycle events every part of it may raise: stop, fail,
shut down when the group says so.

The thread owns one :class:`Lifecycle`; the rebalance listener and the group member share it
to move the thread's state and to stop it, without reaching into the thread.
"""

from __future__ import annotations

import asyncio
import logging
from enum import StrEnum

log = logging.getLogger(__name__)


class FatalThreadError(RuntimeError):
    """The thread cannot go on (duplicate instance id, a record error with on_error=stop,
    rebalance callbacks that keep failing)."""


class ThreadState(StrEnum):
    CREATED = "created"
    STARTING = "starting"  # clients starting, first join under way
    REBALANCING = "rebalancing"  # between a revocation (or first join) and the assignment
    RUNNING = "running"
    PENDING_SHUTDOWN = "pending_shutdown"
    DEAD = "dead"


class Lifecycle:
    """The thread's state, its stop signal and the error that stopped it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = ThreadState.CREATED
        self.stopped = asyncio.Event()
        #: Told by the group to shut down (a leaving member with nothing left to run).
        self.shutdown_requested = False
        self.failure: BaseException | None = None

    @property
    def stopping(self) -> bool:
        return self.stopped.is_set()

    @property
    def closing(self) -> bool:
        return self.state in (ThreadState.PENDING_SHUTDOWN, ThreadState.DEAD)

    def set_state(self, state: ThreadState) -> None:
        if self.closing and state in (ThreadState.RUNNING, ThreadState.REBALANCING):
            return
        if state is not self.state:
            log.debug("%s: %s -> %s", self.name, self.state.value, state.value)
            self.state = state

    def stop(self) -> None:
        self.stopped.set()

    def fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
        self.stopped.set()

    def shut_down(self) -> None:
        """The group told this member to leave: it stops, and leaves explicitly."""
        self.shutdown_requested = True
        self.stopped.set()
