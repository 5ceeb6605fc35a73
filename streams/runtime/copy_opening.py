"""Opening deferred copies: the stores of the standby and learner copies a round adds open
once the actives it starts here run.

A round that moves an active task to this thread often adds copies too (standbys placed
again, learners for the next move). Opening a copy's RocksDB stores takes tens of
milliseconds per task on a busy machine, on the event loop and under the thread's lock, and
the moved active, restored from its standby in a moment, waited for every one of them. The
task manager now leaves such copies deferred (:attr:`Tasks.deferred`), reported with an
unknown lag; this opener opens them one at a time, each under the lock, once the thread has
nothing left restoring or :data:`WAIT_FOR_ACTIVES_S` has passed, whichever comes first (a
long restoration does not keep the copies waiting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from streams.runtime.lifecycle import Lifecycle
from streams.runtime.task_manager import TaskManager
from streams.runtime.tasks import Tasks

log = logging.getLogger(__name__)

#: The longest the deferred copies wait for the round's restoring actives to run.
WAIT_FOR_ACTIVES_S = 1.0


class CopyOpener:
    def __init__(self, name: str, lock: asyncio.Lock, lifecycle: Lifecycle, registry: Tasks,
                 task_manager: TaskManager, failed: Callable[[str, BaseException], None],
                 wait_for_actives_s: float = WAIT_FOR_ACTIVES_S) -> None:
        self._name = name
        self._lock = lock
        self._lifecycle = lifecycle
        self._registry = registry
        self._task_manager = task_manager
        #: Called with what an opening raised (the listener's failure path).
        self._failed = failed
        self._wait_for_actives_s = wait_for_actives_s
        self._restoring_changed = asyncio.Event()
        self._running: asyncio.Task[None] | None = None

    def schedule(self) -> None:
        """After an assignment is applied: open its deferred copies once its actives run."""
        if not self._registry.deferred or (self._running is not None
                                           and not self._running.done()):
            return
        self._running = asyncio.ensure_future(self._open_all())

    def restoring_changed(self) -> None:
        """A restoring active started (or stopped restoring)."""
        self._restoring_changed.set()

    async def _open_all(self) -> None:
        deadline = time.monotonic() + self._wait_for_actives_s
        while self._registry.restoring and not self._lifecycle.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._restoring_changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._restoring_changed.wait(), left)
        started = time.monotonic()
        handled = 0
        while not self._lifecycle.stopping:
            try:
                async with self._lock:
                    if not await self._task_manager.open_deferred_copy():
                        break
            except Exception as exc:
                self._failed("opening deferred copies", exc)
                return
            handled += 1
        if handled:
            log.info("%s: took up %d deferred cop%s in %.2fs", self._name, handled,
                     "y" if handled == 1 else "ies", time.monotonic() - started)

    async def settled(self) -> None:
        """Once the copies deferred so far are taken up (or given up)."""
        running = self._running
        if running is not None and not running.done():
            await asyncio.shield(running)

    async def close(self) -> None:
        """Stop opening (the thread closes): what is still deferred stays unopened."""
        running, self._running = self._running, None
        if running is not None and not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
