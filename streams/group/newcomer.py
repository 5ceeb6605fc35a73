"""A new instance's thread warming up before its first join: it restores the copies the
plan (:mod:`streams.group.warm_up`) expects it to take, waits for its sibling threads, then
asks the tasks' owners to hand them over in its first round."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from streams.group.learner_handover import PromotionAnnouncer
from streams.group.warm_up import WarmUpGate
from streams.runtime.lifecycle import Lifecycle
from streams.runtime.state_updater import StateUpdater
from streams.runtime.task_manager import TaskManager
from streams.runtime.thread_status import StatusReporter

log = logging.getLogger(__name__)


class WarmUp:
    """One thread's warm-up: restore the copies this new instance expects to take before
    joining, then tell their owners, so that the tasks move in this member's first round."""

    def __init__(self, gate: WarmUpGate, index: int, name: str, timeout_ms: int,
                 task_manager: TaskManager, state_updater: StateUpdater,
                 reporter: StatusReporter, lifecycle: Lifecycle,
                 announcer: PromotionAnnouncer) -> None:
        self.gate = gate
        self.index = index
        self.name = name
        self.timeout_ms = timeout_ms
        self.task_manager = task_manager
        self.state_updater = state_updater
        self.reporter = reporter
        self.lifecycle = lifecycle
        self.announcer = announcer

    async def run(self) -> None:
        gate, stopped = self.gate, self.lifecycle.stopped
        ready: frozenset[str] = frozenset()
        try:
            opened = await self.task_manager.warm_up(gate.tasks_of(self.index))
            if opened:
                ready = await self._restore(opened, gate.plan.join_lead_s)
        except Exception:
            log.exception("%s: warming up failed; joining with what it has", self.name)
        finally:
            waiting = asyncio.ensure_future(gate.done(self.index))
            stopping = asyncio.ensure_future(stopped.wait())
            await asyncio.wait([waiting, stopping], return_when=asyncio.FIRST_COMPLETED)
            for future in (waiting, stopping):
                future.cancel()
        if ready and not stopped.is_set():
            await self.announcer.announce(ready, gate.plan.generation, joining=True)

    async def _restore(self, tasks: list[str], join_lead_s: float) -> frozenset[str]:
        started = time.monotonic()
        deadline = started + self.timeout_ms / 1000
        log.info("%s warms up %s before joining (for up to %.0fs)", self.name, tasks,
                 self.timeout_ms / 1000)
        self.reporter.warming_up = True
        publisher = asyncio.ensure_future(self.reporter.while_warming_up())
        try:
            ready = await self.state_updater.warm_up(tasks, deadline, self.lifecycle.stopped,
                                                     join_lead_s)
        finally:
            self.reporter.warming_up = False
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher
        self.reporter.update()
        behind = sorted(set(tasks) - ready)
        finishing = sorted(self.state_updater.ready_by_assignment())
        log.info("%s warmed up %s in %.1fs%s%s", self.name, sorted(ready),
                 time.monotonic() - started,
                 f"; {finishing} catch up during the join round (about {join_lead_s:.1f}s, "
                 f"lags {[self.state_updater.copy_lag(t) for t in finishing]})"
                 if finishing else "",
                 f"; still behind, learned after joining: {behind}" if behind else "")
        return ready
