"""Both sides of a promotion ask (:mod:`streams.group.promotion_asks`) in a running thread:
the learner's member announces the ready learners it asks a round to promote; the owner gives
those tasks up as it joins that round."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from streams.dsl.topology import SubTopology
from streams.group.promotion_asks import (
    PROMOTION_KEY,
    PromotionAsk,
    PromotionAsks,
    encode_ask,
    to_release,
)
from streams.runtime.commit import Committer
from streams.runtime.task_manager import TaskManager
from streams.runtime.tasks import Tasks
from streams.runtime.thread_status import StatusReporter
from streams.runtime.transactions import TransactionalCommitter

log = logging.getLogger(__name__)

#: How long a member waits for its ask to promote learners to be written before it rejoins.
ANNOUNCE_TIMEOUT_S = 2.0
#: How long a member running tasks that learners follow waits, as it joins, to have read the
#: control topic to its end (asks to promote those learners).
CONTROL_CATCH_UP_S = 1.0
#: A catch-up this long (seconds) is logged: the group's round waits for it.
SLOW_CATCH_UP_S = 0.05


class PromotionAnnouncer:
    """A member's side of the asks: it tells the owners of the ready learners it is about
    to ask a round to promote, so that they give the tasks up as they join."""

    def __init__(self, asks: PromotionAsks | None, producer: Any, control_topic: str,
                 label: str, name: str) -> None:
        #: None: this member neither asks ahead of its rounds nor gives tasks up for them.
        self.asks = asks
        self.producer = producer
        self.control_topic = control_topic
        self.label = label
        self.name = name

    async def announce(self, tasks: frozenset[str], generation: int,
                       joining: bool = False) -> None:
        if self.asks is None or not tasks:
            return
        ask = PromotionAsk(self.label, generation, tuple(sorted(tasks)), joining)
        try:
            await asyncio.wait_for(self.producer.send_and_wait(
                self.control_topic, key=PROMOTION_KEY, value=encode_ask(ask)),
                ANNOUNCE_TIMEOUT_S)
        except Exception as exc:
            # Unannounced, the move takes the follow-up round it took before.
            log.info("%s: could not announce its ready learners %s (%s: %s)", self.name,
                     list(ask.tasks), type(exc).__name__, exc)


class SubscriptionPublisher(Protocol):
    def publish_subscription(self) -> None: ...


class LearnerHandover:
    """An owner's side of the asks: as the member joins a round, it gives up the running
    tasks whose ready learners are asked to take over in it."""

    def __init__(self, asks: PromotionAsks | None, cooperative: bool,
                 subs: Iterable[SubTopology], registry: Tasks, lock: asyncio.Lock,
                 committer: Committer | TransactionalCommitter, task_manager: TaskManager,
                 reporter: StatusReporter, name: str) -> None:
        self.asks = asks if cooperative else None
        self.stateful = frozenset(t for sub in subs if sub.stateful for t in sub.task_ids())
        self.registry = registry
        self.lock = lock
        self.committer = committer
        self.task_manager = task_manager
        self.reporter = reporter
        self.name = name
        #: Running tasks given up as the member joined a round, for ready learners to take.
        self.released = 0

    async def before_join(self, member: SubscriptionPublisher) -> None:
        asks = self.asks
        if asks is None or not self.stateful & set(self.registry.active):
            return
        if asks.read_to_end is not None:
            # An ask sent before its member rejoined (or before a newcomer joined: a warmed
            # up instance's ask may concern any stateful task) is on the topic by now.
            started = time.monotonic()
            caught_up = await asks.read_to_end(CONTROL_CATCH_UP_S)
            took = time.monotonic() - started
            if took >= SLOW_CATCH_UP_S or not caught_up:
                log.info("%s: read the control topic to its end in %.2fs%s", self.name, took,
                         "" if caught_up else " (not caught up; joining anyway)")
        if not self._to_release(asks):
            # Nothing to give up: the member joins at once, without waiting for the thread's
            # lock behind a batch or a commit (the whole group's round waits for it).
            return
        async with self.lock:
            generation = self.reporter.status.generation
            release = self._to_release(asks)
            if not release:
                return
            try:
                await self.committer.commit(force=True)
            except Exception:
                log.exception("%s: commit before giving up %s failed; keeping them",
                              self.name, release)
                return
            self.task_manager.release(release)
            asks.acted_on(generation, release)
            self.released += len(release)
            self.reporter.update()
            # A broker that keeps a static member's earlier metadata hands the leader that;
            # the leader then reads the one published on the control topic.
            member.publish_subscription()
        log.info("%s gives up %s as it joins: their ready learners take over in this round",
                 self.name, release)

    def _to_release(self, asks: PromotionAsks) -> list[str]:
        generation = self.reporter.status.generation
        return to_release(self.registry.active, self.reporter.being_learned,
                          asks.asked(generation), asks.joining_asked(generation))
