"""What a stream thread runs, as it publishes it: its status record on the app's status topic
(every second, at once when what its readers act on changes, and while it warms up), and its
round figures in the app's metrics.

The status record is what ``relay describe``, the web view, query routing, a newcomer's
warm-up plan and the other members' batching of promotions read of this member. A change they
act on (tasks gained or given up, copies added or dropped, a task started after its restore, a
learner ready) is published at once rather than at the next tick: rounds can
promote a learner within a second of its catching up, and a reader seeing one record a second
would miss that it was ready. Bursts are coalesced (:data:`MIN_GAP_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from streams.config import AppConfig
from streams.group.expiry_probe import ExpiryProbe
from streams.group.join_watch import JoinWatch
from streams.group.partition_assignor import RelayAssignor, TaskLayout
from streams.group.status_topic import status_topic_name
from streams.metrics import Metrics
from streams.queries.store_layout import store_layouts
from streams.runtime.lifecycle import Lifecycle
from streams.runtime.state_updater import StateUpdater
from streams.runtime.task import status_figures
from streams.runtime.tasks import Tasks
from streams.runtime.transitions import Role

#: Rounds whose durations a member keeps: its status gives the shortest of them.
RECENT_ROUNDS = 5


class Leaving(Protocol):
    """Whether this instance is marked as leaving: ``(leaving, since_ms, timeout_ms)``."""

    def current(self) -> tuple[bool, int | None, int | None]: ...


class NotLeaving:
    """An instance nobody marks as leaving (a thread built alone)."""

    def current(self) -> tuple[bool, int | None, int | None]:
        return (False, None, None)


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
    #: In a round: from joining it to its assignment applied.
    in_round: bool = False


#: The status is published at least this often (seconds)...
TICK_S = 1.0
#: ...and soon after a change its readers act on, but never twice within this (seconds).
MIN_GAP_S = 0.2

@dataclass(frozen=True)
class Shape:
    """The parts of a status its readers act on (not the lags' every move)."""

    active: tuple[str, ...]
    restoring: tuple[str, ...]
    standbys: tuple[str, ...]
    learners: tuple[str, ...]
    #: Learners at or under the acceptable lag.
    ready: tuple[str, ...]
    rebalances: int
    leaving: bool
    in_round: bool = False


def shape(status: ThreadStatus, acceptable_lag: int, leaving: bool) -> Shape:
    return Shape(
        tuple(status.active), tuple(status.restoring), tuple(sorted(status.standbys)),
        tuple(sorted(status.learners)),
        tuple(sorted(t for t, lag in status.learners.items() if lag <= acceptable_lag)),
        status.rebalances, leaving, status.in_round)


def publish_delay(now: float, last: float | None, changed: bool,
                  tick_s: float = TICK_S, min_gap_s: float = MIN_GAP_S) -> float:
    """How long (seconds) until the next status record: a first one at once, a change once
    ``min_gap_s`` has passed since the last one, else at the tick."""
    if last is None:
        return 0.0
    return max(0.0, (min_gap_s if changed else tick_s) - (now - last))


@dataclass(frozen=True)
class ThreadIdentity:
    index: int
    instance_id: str
    static_id: str | None
    incarnation: str = ""
    #: The key of its status record and its metrics label: its member id.
    label: str = ""

    @property
    def name(self) -> str:
        return self.static_id or f"thread {self.index}"


class StatusReporter:
    """Keeps the thread's :class:`ThreadStatus` and publishes it."""

    def __init__(self, config: AppConfig, identity: ThreadIdentity, layout: TaskLayout,
                 registry: Tasks, state_updater: StateUpdater, assignor: RelayAssignor,
                 lifecycle: Lifecycle, leaving: Leaving, metrics: Metrics,
                 producer: Any) -> None:
        self.config = config
        self.identity = identity
        self.layout = layout
        self.registry = registry
        self.state_updater = state_updater
        self.assignor = assignor
        self.lifecycle = lifecycle
        self.leaving = leaving
        self.metrics = metrics
        self.producer = producer
        self.status = ThreadStatus()
        self.topic = status_topic_name(config.application_id)
        self.key = identity.label.encode()
        #: A new instance restoring its copies before it joins (streams.group.warm_up).
        self.warming_up = False
        #: Tasks of this member that learners elsewhere follow (from the last assignment).
        self.being_learned: tuple[str, ...] = ()
        #: This process's query server, published for routing (None: not serving).
        self.query_endpoint: str | None = None
        #: How long this thread's last rounds took, each from its join to its assignment
        #: applied: a newcomer plans its warm-up's end on the shortest (streams.group.warm_up).
        #: The thread's first round is left out: it waited for the group to form (the other
        #: members starting, the broker's initial delay), which says nothing of how long a
        #: newcomer's join takes, and a newcomer that counts on a long round hands its tasks
        #: over before their learners caught up.
        self.recent_rounds: deque[float] = deque(maxlen=RECENT_ROUNDS)
        self._rounds_seen = 0
        #: When (monotonic) the thread stopped processing for the current round, if it did.
        self._revoked_at: float | None = None
        self._store_layouts: dict[str, dict[str, Any]] | None = None
        #: What the last record published showed its readers, and when (monotonic).
        self._published: Shape | None = None
        self._published_at: float | None = None
        #: Set when what the status shows its readers differs from the last record.
        self._changed = asyncio.Event()
        self._publishing: set[asyncio.Task[None]] = set()
        self._removed = False
        #: The least time between two records of the housekeeping (seconds).
        self.min_gap_s = MIN_GAP_S

    def update(self) -> None:
        """Read what the thread runs now (called wherever that changes, and after every poll
        of the copies); a change its readers act on wakes the housekeeping to publish it."""
        self.status.active = sorted(self.registry.active)
        self.status.restoring = sorted(self.registry.restoring)
        self.status.standbys = self.state_updater.lags(Role.STANDBY)
        self.status.learners = self.state_updater.lags(Role.LEARNER)
        if self._shape() != self._published:
            self._changed.set()

    def _shape(self) -> Shape:
        return shape(self.status, self.config.acceptable_lag, self.leaving.current()[0])

    def status_record(self) -> dict[str, Any]:
        """What this member runs, as published on the app's status topic."""
        self.update()
        leaving, since, _timeout = self.leaving.current()
        identity = self.identity
        return {
            "instance_id": identity.instance_id,
            "thread": identity.index,
            "static_id": identity.static_id,
            "pid": os.getpid(),
            "incarnation": identity.incarnation,
            "member_id": self.status.member_id,
            "generation": self.status.generation,
            "leader": self.assignor.is_leader,
            "state": self.lifecycle.state.value,
            #: In a round (a cooperative member runs its tasks through it, so its state may
            #: say running): a member frozen past its session waits for the others' round
            #: before it joins (streams.quirks.synced_round.may_join_after_loss).
            "in_round": self.status.in_round,
            "active": self.status.active,
            "restoring": self.status.restoring,
            "standbys": self.status.standbys,
            "learners": self.status.learners,
            #: The learners it still learns, for the other members' batching of promotions
            #: (streams.group.group_learning).
            "learning": self.state_updater.learning_lags(),
            "acceptable_lag": self.config.acceptable_lag,
            "leaving": leaving,
            "leaving_since_ms": since,
            "leaving_deadline_ms": self.leaving_deadline_ms(),
            "rebalances": self.status.rebalances,
            "processed": sum(t.records_processed for t in self.registry.active.values()),
            **status_figures(self.registry.active.values()),
            "restored_records": self.state_updater.restored_records,
            #: Restoring actives whose changelog end is known: records left to restore.
            "restoring_lag": self.state_updater.restoring_lags(),
            "stateful_tasks": [t.task_id for t in self.layout.tasks() if t.stateful],
            "being_learned": list(self.being_learned),
            "warming_up": self.warming_up,
            # The shortest of the last few: a round that waited for a crashed member's session
            # to expire says nothing of how long a join takes.
            "round_s": round(min(self.recent_rounds), 3) if self.recent_rounds else None,
            #: The last round alone (how long the broker's rounds take, for benchmarks).
            "last_round_s": round(self.recent_rounds[-1], 3) if self.recent_rounds else None,
            #: Every task of the app, so that tools can tell which ones nobody runs.
            "app_tasks": self.layout.task_ids(),
            #: Where queries reach this member, and where each store's keys live.
            "query_endpoint": self.query_endpoint,
            "stores": self.store_layouts(),
            "updated_ms": int(time.time() * 1000),
        }

    def store_layouts(self) -> dict[str, dict[str, Any]]:
        if self._store_layouts is None:
            self._store_layouts = {name: layout.to_status() for name, layout
                                   in store_layouts(self.layout.subs).items()}
        return self._store_layouts

    def leaving_deadline_ms(self) -> int | None:
        """When this leaving member hands its tasks over whether learners are ready or not
        (the mark's time plus its timeout, else the app's scale_down_timeout_ms); None when
        it is not leaving."""
        leaving, since, timeout = self.leaving.current()
        if not leaving or since is None:
            return None
        return since + (self.config.scale_down_timeout_ms if timeout is None else timeout)

    async def publish(self) -> None:
        if self._removed:
            return  # a record after the tombstone would bring the member back
        record = self.status_record()
        self._published, self._published_at = self._shape(), time.monotonic()
        self._changed.clear()
        with contextlib.suppress(Exception):
            await self.producer.send(self.topic, key=self.key, value=msgpack.packb(record))

    def publish_soon(self) -> None:
        """Publish now, outside the housekeeping's pace: news its readers must have before
        what follows it (a ready learner, before the round that promotes it). The record is
        handed to the producer in the loop's next turn, before the round asked for next can
        have been joined."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: no producer to publish with either (a subscription read alone)
        task = loop.create_task(self.publish())
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    def publish_if_changed(self) -> None:
        """As the member joins a round: what it tells the round (a learner ready since the
        last record) is on the status topic before the round's outcome."""
        self.update()
        if self._changed.is_set():
            self.publish_soon()

    async def remove(self) -> None:
        """Gone: describe and the duplicate check at start no longer see this member."""
        self._removed = True
        with contextlib.suppress(Exception):
            await self.producer.send_and_wait(self.topic, key=self.key, value=None)

    async def housekeeping(self, join_watch: JoinWatch,
                           expiry_probe: ExpiryProbe | None = None) -> None:
        """Publish the status every second and soon after a change its readers act on, check
        the member is not stuck joining, and probe the group while a silent peer's session
        may end."""
        stopped = self.lifecycle.stopped
        while not stopped.is_set():
            join_watch.check()
            if expiry_probe is not None:
                expiry_probe.check()
            # A leaving mark arrives between rounds.
            self.metrics.set_scale_down_deadline(self.identity.label,
                                                 self.leaving_deadline_ms())
            # The next look is timed from the check, not after the publish: a silence that
            # passes the session while the record is sent is looked at then, not a tick later.
            look_in_s = join_watch.next_look_in_s()
            look_at = None if look_in_s is None else time.monotonic() + look_in_s
            await self.publish()
            await self._until_next(stopped, look_at)

    async def _until_next(self, stopped: asyncio.Event, look_at: float | None = None) -> None:
        """Until the next record is due (see :func:`publish_delay`), the join watch's next
        look (``look_at``, on the monotonic clock) or the thread stops."""
        while not stopped.is_set():
            changed = self._changed.is_set()
            now = time.monotonic()
            delay = publish_delay(now, self._published_at, changed, min_gap_s=self.min_gap_s)
            if look_at is not None:
                delay = min(delay, look_at - now)
            if delay <= 0:
                return
            waits = [asyncio.ensure_future(stopped.wait())]
            if not changed:
                waits.append(asyncio.ensure_future(self._changed.wait()))
            try:
                await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

    async def while_warming_up(self) -> None:
        """Status records while warming up, so that ``relay describe`` and the web view show
        the copies' catch-up, and a second newcomer counts this one."""
        while True:
            self.update()
            await self.publish()
            await asyncio.sleep(1.0)

    def round_revoked(self) -> None:
        if self._revoked_at is None:
            self._revoked_at = time.monotonic()

    def record_round(self, round_started: float | None) -> None:
        """The round's figures, once its assignment is applied: its duration, the time the
        thread processed nothing in it, and what the thread holds now."""
        now = time.monotonic()
        label = self.identity.label
        revoked_at, self._revoked_at = self._revoked_at, None
        round_s = (now - round_started if round_started is not None and round_started <= now
                   else 0.0)
        self._rounds_seen += 1
        if round_s > 0 and self._rounds_seen > 1:
            self.recent_rounds.append(round_s)
        revoked_s = now - revoked_at if revoked_at is not None else 0.0
        self.metrics.rebalance_done(label, max(round_s, revoked_s), revoked_s)
        self.metrics.set_assignment(
            label, [*self.registry.active, *self.registry.restoring],
            self.registry.copies_with(Role.LEARNER), self.registry.copies_with(Role.STANDBY))
        if not self.assignor.is_leader:
            self.metrics.set_hold_deadlines(label, {})
        self.metrics.set_scale_down_deadline(label, self.leaving_deadline_ms())
