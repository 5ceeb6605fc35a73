"""A stream thread: one group member's loop and its states.

Each thread is a group member (with static id ``<group_instance_id>-thread-<n>`` when one is
configured) and runs as an asyncio task. Its parts are built by
:func:`streams.runtime.factory.build_stream_thread`:

- the task manager (:mod:`streams.runtime.task_manager`) applies each assignment to the registry of
  tasks (:mod:`streams.runtime.tasks`);
- the state updater (:mod:`streams.runtime.state_updater`) restores new actives and follows copies;
- the record collector (:mod:`streams.runtime.record_collector`) ships outputs and changelog
  records;
- the committer (:mod:`streams.runtime.commit`) commits: acknowledgements, offsets, checkpoints;
- the rebalance listener (:mod:`streams.group.listener`) delegates to this thread;
- the consumer is reached through the aiokafka driver (:mod:`streams.kafka.driver`).

The thread itself fetches records and runs them through their tasks, reacts to the group
(rebalance callbacks, requests to rejoin, a join that takes too long) and publishes its
status.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import msgpack
from aiokafka.structs import TopicPartition

from assignor import MemberAssignment
from assignor.protocol import Subscription, encode_subscription, with_echo
from statestore.store import KeyValueStore
from streams.config import AppConfig
from streams.group.control import ROUND_KEY, control_topic_name, encode_round_report
from streams.group.join_watch import JoinWatch
from streams.group.learner_readiness import being_promoted
from streams.group.listener import RebalanceListener
from streams.group.partition_assignor import RelayAssignor, TaskLayout
from streams.group.predecessors import MemberFiles
from streams.group.promotion_asks import (
    PROMOTION_KEY,
    PromotionAsk,
    PromotionAsks,
    encode_ask,
    to_release,
)
from streams.group.status_topic import status_topic_name
from streams.group.warm_up import WarmUpGate
from streams.kafka.driver import GroupConsumer, producer_client
from streams.kafka.membership import leave_as_static_member
from streams.metrics import Metrics
from streams.queries.store_query import store_layouts
from streams.quirks.formed_group import wait_for_formed_group
from streams.quirks.static_followers import ControlSender, StaticFollowers
from streams.quirks.synced_round import (
    SYNC_WAIT_LIMIT_S,
    RoundReports,
    RoundView,
    may_rejoin,
    members_synced,
    sync_answer_lost,
)
from streams.runtime.commit import Committer
from streams.runtime.record_collector import RecordCollector
from streams.runtime.routing import route_by_task
from streams.runtime.state_updater import StateUpdater
from streams.runtime.task import RecordError, StreamTask, punctuate_all
from streams.runtime.task_manager import TaskManager
from streams.runtime.tasks import Tasks
from streams.runtime.transactions import TransactionalCollector, TransactionalCommitter
from streams.runtime.transitions import Role

log = logging.getLogger(__name__)

# How long a stopping thread waits for the process loop to finish its current batch.
PROCESS_LOOP_GRACE_S = 10.0
#: Rebalance callbacks that may fail in a row before the thread gives up.
MAX_REBALANCE_FAILURES = 3
#: How often a member waiting to ask for the next round looks at the others' reports.
ROUND_CHECK_INTERVAL_S = 0.05
#: How long a member waits for its ask to promote learners to be written before it rejoins.
ANNOUNCE_TIMEOUT_S = 2.0
#: How long a member running tasks that learners follow waits, as it joins, to have read the
#: control topic to its end (asks to promote those learners).
CONTROL_CATCH_UP_S = 1.0
#: Rounds whose durations a member keeps: its status gives the shortest of them.
RECENT_ROUNDS = 5


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


@dataclass(frozen=True)
class ThreadIdentity:
    index: int
    instance_id: str
    static_id: str | None
    incarnation: str = ""


class StreamThread:
    def __init__(
        self,
        config: AppConfig,
        identity: ThreadIdentity,
        layout: TaskLayout,
        *,
        assignor: RelayAssignor,
        consumer: GroupConsumer,
        producer: Any,
        tasks: Tasks,
        task_manager: TaskManager,
        state_updater: StateUpdater,
        collector: RecordCollector | TransactionalCollector,
        committer: Committer | TransactionalCommitter,
        static_followers: StaticFollowers,
        control: ControlSender | None,
        leaving: Callable[[], tuple[bool, int | None, int | None]],
        metrics: Metrics | None = None,
        round_reports: RoundReports | None = None,
        remove_departed: Callable[[], Awaitable[list[str]]] | None = None,
        leave_from_formed_group: bool = True,
        member_files: MemberFiles | None = None,
        promotion_asks: PromotionAsks | None = None,
    ) -> None:
        self.config = config
        #: The group's asks to promote ready learners (None: this member neither asks ahead
        #: of its rounds nor gives tasks up for them; see streams.group.promotion_asks).
        self._promotion_asks = promotion_asks
        #: Set by the app for a new instance: the copies to restore before the first join.
        self.warm_up_gate: WarmUpGate | None = None
        self._warming_up = False
        #: How long this thread's last rounds took, each from its join to its assignment
        #: applied: a newcomer plans its warm-up's end on the shortest (streams.group.warm_up).
        self._recent_rounds: deque[float] = deque(maxlen=RECENT_ROUNDS)
        #: Where this thread keeps its member id for a restart after a crash to remove
        #: (see :mod:`streams.group.predecessors`).
        self._member_files = member_files
        #: Leave only from a formed group (the leader-wedge quirk, streams.quirks.formed_group).
        self._leave_from_formed_group = leave_from_formed_group
        self.index = identity.index
        self.instance_id = identity.instance_id
        self.static_id = identity.static_id
        self.incarnation = identity.incarnation
        self.layout = layout
        self.assignor = assignor
        self.consumer = consumer
        self.producer = producer
        self.registry = tasks
        self.task_manager = task_manager
        self.state_updater = state_updater
        self.collector = collector
        self.committer = committer
        self._static_followers = static_followers
        self._control = control
        #: What this member does when stuck joining (see :mod:`streams.group.join_watch`).
        self.join_watch = JoinWatch(identity.static_id or f"thread {identity.index}",
                                    config.session_timeout_ms, consumer, control,
                                    remove_departed, self._lost_sync_generation)
        self._leaving = leaving
        self.listener = RebalanceListener(self.on_revoked, self.on_assigned,
                                          self.rebalance_failed, self.before_join)
        self.state = ThreadState.CREATED
        self.status = ThreadStatus()
        self.shutdown_requested = False
        self.late_records_dropped = 0
        #: Records processed while the group was rebalancing (cooperative members only).
        self.records_during_rebalance = 0
        #: Running tasks given up as the member joined a round, for ready learners to take.
        self.released_for_learners = 0
        self._lock = asyncio.Lock()
        #: Between the revocation and the assignment callbacks: fetched batches are dropped
        #: (kept partitions are sought back to their processed offset after the rebalance).
        self._awaiting_assignment = False
        self._pending_assignment: MemberAssignment | None = None
        #: The last assignment received, whose leader notes the subscription echoes.
        self._last_assignment: MemberAssignment | None = None
        self._rejoin_token = 0
        #: The token and reason of the last request whose news the subscription carries:
        #: asked for again when no round carried it (see _ask_again_if_asked_during_round).
        self._news: tuple[int, str] | None = None
        self._stop = asyncio.Event()
        self._fatal: BaseException | None = None
        self._rejoin_timer: asyncio.TimerHandle | None = None
        self._rebalance_failures = 0
        self.metrics = metrics if metrics is not None else Metrics()
        self._label = self.status_key.decode()
        #: When (monotonic) the thread stopped processing for the current round, if it did.
        self._revoked_at: float | None = None
        #: Tasks of this member that learners elsewhere follow (from the last assignment).
        self._being_learned: tuple[str, ...] = ()
        #: Which generation each member of the group has its assignment of (None: members
        #: neither report nor wait; see streams.quirks.synced_round).
        self._round_reports = round_reports
        #: Why this member will ask for the next round once its round has its assignments.
        self._deferred_rejoins: list[tuple[str, bool]] = []
        self._deferred_rejoin: asyncio.Task[None] | None = None
        self._reporting: set[asyncio.Task[None]] = set()
        #: This process's query server, published for routing (None: not serving).
        self.query_endpoint: str | None = None
        self._store_layouts: dict[str, dict[str, Any]] | None = None

    # -- views -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.static_id or f"thread {self.index}"

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
    def restorer(self) -> Any:
        return self.state_updater.restorer

    @property
    def dead_lettered(self) -> int:
        return self.collector.dead_lettered

    @property
    def failure(self) -> BaseException | None:
        """What stops the thread with an error, once something did."""
        return self._fatal

    @property
    def is_leader(self) -> bool:
        return self.assignor.is_leader

    @property
    def settled(self) -> bool:
        """Running, with no round under way and none asked for or scheduled by this member,
        and nothing restoring: what to wait for before changing the group on purpose."""
        pending = self._deferred_rejoin is not None and not self._deferred_rejoin.done()
        timer = self._rejoin_timer
        scheduled = timer is not None and not timer.cancelled() and (
            timer.when() > asyncio.get_running_loop().time())
        return (self.state is ThreadState.RUNNING and not self.consumer.rebalancing
                and not self.consumer.rejoin_pending and not pending and not scheduled
                and not self.registry.restoring)

    @property
    def received_digest(self) -> str | None:
        return self.assignor.received_digest

    @property
    def status_key(self) -> bytes:
        return (self.static_id or f"{self.instance_id}-thread-{self.index}").encode()

    # -- the subscription and the assignment (called from aiokafka's coordinator) ---------

    def subscription(self) -> Subscription:
        leaving, since, timeout = self._leaving()
        # Echoing the leader's notes of the last assignment lets any new leader rebuild the
        # memory (held lost tasks, moves under way) the previous one kept.
        return with_echo(Subscription(
            instance_id=self.instance_id,
            thread=self.index,
            pid=os.getpid(),
            active=self.registry.owned(),
            standbys=self.standbys,
            learners=self.learners,
            leaving=leaving,
            leaving_since_ms=since,
            scale_down_timeout_ms=timeout,
            rejoin_token=self._rejoin_token,
            static=self.static_id is not None,
            # The last assignment received (maybe not applied yet) says what it promoted.
            asks_promotion=self.state_updater.asks_promotion(self._promoted_by_last()),
            ready_by_assignment=tuple(sorted(self.state_updater.ready_by_assignment())),
        ), self._last_assignment)

    def _promoted_by_last(self) -> frozenset[str]:
        last = self._last_assignment
        return being_promoted(last.notes if last is not None else None,
                              (self.instance_id, self.index))

    def assignment_received(self, assignment: MemberAssignment) -> None:
        self._pending_assignment = assignment
        self._last_assignment = assignment

    def request_rejoin(self, reason: str, broadcast: bool = True, news: bool = True) -> None:
        """Ask for a rebalance: rejoin with a changed token in the metadata (and, with the
        static-follower protocol, ask the leader too: ``broadcast``). ``news``: the
        subscription changed (a leaving mark, ready learners, tasks closed), so the round
        must carry this one; False when any round serves (a follow-up, a round for another
        member)."""
        if self._stop.is_set():
            # Stopping: its leaving rebalances the group anyway, and a join sent now would
            # re-add it (as leader, maybe) to a round it will never finish.
            log.info("%s stopping; not rejoining for: %s", self.name, reason)
            return
        log.info("%s asks for a rebalance: %s", self.name, reason)
        self._rejoin_token += 1
        if news:
            self._news = (self._rejoin_token, reason)
        self._publish_subscription()
        self.consumer.request_rejoin()
        if broadcast:
            self._static_followers.ask_leader(self, reason)

    def request_rejoin_once_synced(self, reason: str, news: bool = True) -> None:
        """Ask for a rebalance once every member of this member's round has its assignment
        (bounded; see :mod:`streams.quirks.synced_round`): a request right after this member's own
        SyncGroup answer can stall the members still waiting for theirs."""
        if self._round_reports is None or not self.config.cooperative:
            # Stop-the-world members do not report their rounds (nor ask right after one).
            self.request_rejoin(reason, news=news)
            return
        self._deferred_rejoins.append((reason, news))
        if self._deferred_rejoin is None or self._deferred_rejoin.done():
            self._deferred_rejoin = asyncio.get_running_loop().create_task(
                self._rejoin_once_synced(), name=f"rejoin-{self.index}")

    def round_view(self, waited_s: float) -> RoundView:
        size = self._last_assignment.group_size if self._last_assignment is not None else 0
        return RoundView(self.status.generation, size, self.consumer.rebalancing, waited_s)

    async def _rejoin_once_synced(self) -> None:
        assert self._round_reports is not None
        asked = since = time.monotonic()
        generation = self.status.generation
        while True:
            if self._stop.is_set():
                return  # leaving rebalances the group anyway
            now = time.monotonic()
            if self.status.generation != generation:
                generation, since = self.status.generation, now
            view = self.round_view(now - since)
            if may_rejoin(view, self._round_reports.generations):
                break
            await asyncio.sleep(ROUND_CHECK_INTERVAL_S)
        await self._announce_promotion()
        deferred, self._deferred_rejoins = self._deferred_rejoins, []
        synced = members_synced(view.generation, self._round_reports.generations)
        self.request_rejoin(
            f"{'; '.join(r for r, _ in deferred)} (after {time.monotonic() - asked:.2f}s: "
            f"{synced} of {view.group_size} members have their assignment of generation "
            f"{view.generation})", news=any(n for _, n in deferred))

    async def _announce_promotion(self, tasks: frozenset[str] | None = None,
                                  generation: int | None = None, joining: bool = False,
                                  ) -> None:
        """Tell the owners of the ready learners this member is about to ask the round to
        promote, so that they give the tasks up as they join (streams.group.promotion_asks)."""
        if self._promotion_asks is None or self._leaving()[0]:
            # A leaving member's learners are not promoted: an owner giving a task up for
            # them would give it up for nobody.
            return
        if tasks is None:
            tasks = self.state_updater.asked_learners() - self._promoted_by_last()
        if not tasks:
            return
        ask = PromotionAsk(self._label,
                           self.status.generation if generation is None else generation,
                           tuple(sorted(tasks)), joining)
        try:
            await asyncio.wait_for(self.producer.send_and_wait(
                control_topic_name(self.config.application_id), key=PROMOTION_KEY,
                value=encode_ask(ask)), ANNOUNCE_TIMEOUT_S)
        except Exception as exc:
            # Unannounced, the move takes the follow-up round it took before.
            log.info("%s: could not announce its ready learners %s (%s: %s)", self.name,
                     list(ask.tasks), type(exc).__name__, exc)

    async def before_join(self) -> None:
        """As the member joins a round: give up running tasks whose ready learners are asked
        to take over in it (streams.group.promotion_asks)."""
        asks = self._promotion_asks
        if asks is None or not self.config.cooperative or not self.registry.active:
            return
        stateful = {t.task_id for t in self.layout.tasks() if t.stateful}
        if not stateful & set(self.registry.active):
            return
        if asks.read_to_end is not None:
            # An ask sent before its member rejoined (or before a newcomer joined: a warmed
            # up instance's ask may concern any stateful task) is on the topic by now.
            await asks.read_to_end(CONTROL_CATCH_UP_S)
        async with self._lock:
            generation = self.status.generation
            release = to_release(self.registry.active, self._being_learned,
                                 asks.asked(generation), asks.joining_asked(generation))
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
            self.released_for_learners += len(release)
            self._update_status()
            # A broker that keeps a static member's earlier metadata hands the leader that;
            # the leader then reads the one published on the control topic.
            self._publish_subscription()
        log.info("%s gives up %s as it joins: their ready learners take over in this round",
                 self.name, release)

    def _publish_subscription(self) -> None:
        if self.static_id is not None:
            self._static_followers.publish_subscription(
                self, encode_subscription(self.subscription()))

    # -- rebalance callbacks (through the listener) ---------------------------------------

    async def on_revoked(self) -> None:
        # Cooperative: called at join-complete with only what moved. Eager: called before
        # every rebalance with everything; stop-the-world then closes every task too.
        async with self._lock:
            self._set_state(ThreadState.REBALANCING)
            self._awaiting_assignment = True
            if self._revoked_at is None:
                self._revoked_at = time.monotonic()
            if self.registry.active:
                try:
                    await self.committer.commit(force=True)
                except Exception:
                    log.exception("%s: commit before rebalance failed", self.name)
            if not self.config.cooperative:
                self.task_manager.close_all()

    async def on_assigned(self) -> None:
        assignment, self._pending_assignment = self._pending_assignment, None
        async with self._lock:
            self._awaiting_assignment = False
            self.status.rebalances += 1
            if (self._member_files is not None
                    and self.consumer.member_id != self.status.member_id):
                self._member_files.record(self.index, self.consumer.member_id, self.static_id)
            self.status.member_id = self.consumer.member_id
            self.status.generation = self.consumer.generation
            if assignment is None:
                log.warning("%s: assignment without Relay user data", self.name)
                return
            if assignment.error:
                self._fail(FatalThreadError(assignment.error))
                return
            if self.state in (ThreadState.PENDING_SHUTDOWN, ThreadState.DEAD):
                # A round that completes while the thread closes (its consumer still in the
                # group): nothing is opened, since nothing would close it again.
                log.info("%s: stopping; not taking up the round's assignment %s", self.name,
                         list(assignment.active))
                self._report_round()
                return
            self._apply(assignment)
            self._report_round()
            self._record_round()
            self._rebalance_failures = 0
            self._set_state(ThreadState.RUNNING)
            self._publish_subscription()
            self._ask_again_if_asked_during_round()
            # A leaving static leader tells its followers once it has left (see _close).
            if not self._leaves_explicitly():
                self._static_followers.tell_followers(self, self.assignor.static_digests)

    def _ask_again_if_asked_during_round(self) -> None:
        """News asked for after this round's subscription was sent (a leaving mark, ready
        learners) is not in the round, and the client drops the request when it sends its
        SyncGroup: ask again, so the next round hears of it. A request any round serves
        (a follow-up) was served by this one."""
        if (self._news is not None and self._news[0] > self.assignor.sent_rejoin_token
                and not self.consumer.rejoin_pending and not self._stop.is_set()):
            self.request_rejoin_once_synced(
                f"asked for during the round of generation {self.status.generation}, after "
                f"its subscription was sent: {self._news[1]}")

    def rebalance_failed(self, callback: str, error: BaseException) -> None:
        """A rebalance callback failed: never swallowed. The thread drops every task and
        rejoins, so the group plans again; after several failures in a row it stops with
        the error."""
        self._rebalance_failures += 1
        log.error("%s: %s failed (%d in a row): %s: %s", self.name, callback,
                  self._rebalance_failures, type(error).__name__, error, exc_info=error)
        if self._rebalance_failures >= MAX_REBALANCE_FAILURES:
            self._fail(FatalThreadError(
                f"{self.name}: rebalance callback {callback} failed "
                f"{self._rebalance_failures} times in a row: {type(error).__name__}: {error}"))
            return
        self.task_manager.close_all()
        self._update_status()
        self.request_rejoin(f"{callback} failed; starting over")

    def _sends_leave_group(self) -> bool:
        """A dynamic member's consumer sends LeaveGroup on stop; a static one only when it
        leaves explicitly."""
        return self.static_id is None or self._leaves_explicitly()

    def _leaves_explicitly(self) -> bool:
        """A static member told to shut down sends LeaveGroup itself when it closes."""
        return self.shutdown_requested and self.static_id is not None

    def _apply(self, assignment: MemberAssignment) -> None:
        self.task_manager.handle_assignment(assignment)
        self.state_updater.learners_assigned(
            assignment.group_learners,
            being_promoted(assignment.notes, (self.instance_id, self.index)),
            self.status.generation, assignment.group_size)
        self._being_learned = tuple(assignment.being_learned)
        self._schedule_rejoin(assignment.rejoin_after_ms)
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
            self.shutdown_requested = True
            self._stop.set()
        self._update_status()
        log.info(
            "%s: active=%s restoring=%s copies=%s revoked=%s", self.name,
            sorted(self.registry.active), self.restoring,
            {t: r.value for t, r in self.registry.copy_roles.items()}, list(assignment.revoked),
        )

    async def _until_formed_and_synced(self, attempts: int = 3) -> None:
        """Before a LeaveGroup: every member of the last round has its assignment, then the
        group is formed (the leader wedge, see streams.quirks.formed_group), with nothing awaited in
        between. Waiting for the others' syncs after the formed check left a window of up
        to a second in which they started their next round; a leaving *leader* that left
        in it wedged the group on the embedded broker (a host swap joining for minutes)."""
        for _ in range(attempts):
            await self._until_round_synced()
            if not self._leave_from_formed_group:
                return
            generation = self.consumer.generation
            with contextlib.suppress(Exception):
                await wait_for_formed_group(
                    self.consumer, self.config.session_timeout_ms / 1000, self.name)
            if self.consumer.generation == generation:
                return  # formed, and no round taken part in since the others synced

    async def _until_round_synced(self, limit_s: float = SYNC_WAIT_LIMIT_S) -> None:
        """Before leaving: let every member of this member's round get its assignment (a
        LeaveGroup starts a round too, and would stall them the way a rejoin does), for at
        most ``limit_s``."""
        if self._round_reports is None or not self.config.cooperative:
            return
        started = time.monotonic()
        while time.monotonic() - started < limit_s:
            # A round under way was just taken part in (or given up on, see _close): only
            # the others' syncs are waited for here.
            view = replace(self.round_view(time.monotonic() - started), rebalancing=False)
            if may_rejoin(view, self._round_reports.generations, limit_s):
                return
            await asyncio.sleep(ROUND_CHECK_INTERVAL_S)

    def _lost_sync_generation(self) -> int | None:
        """The generation whose SyncGroup answer this member waits for although another
        member reports having its own (see
        :func:`~streams.quirks.synced_round.sync_answer_lost`)."""
        if self._round_reports is None:
            return None
        generation = self.consumer.generation
        lost = sync_answer_lost(self.consumer.member_id, generation, self.status.generation,
                                self.consumer.rebalancing, self._round_reports.generations)
        return generation if lost else None

    def _report_round(self) -> None:
        """Tell the group this member has its assignment of its generation (in the
        background: a rebalance callback does not wait for the network)."""
        if self._round_reports is None or not self.config.cooperative:
            return
        report = encode_round_report(self.status.member_id, self.status.generation)

        async def send() -> None:
            with contextlib.suppress(Exception):
                await self.producer.send(control_topic_name(self.config.application_id),
                                         key=ROUND_KEY, value=report)

        task = asyncio.get_running_loop().create_task(send())
        self._reporting.add(task)
        task.add_done_callback(self._reporting.discard)

    def _record_round(self) -> None:
        """The round's figures, once its assignment is applied: its duration, the time the
        thread processed nothing in it, and what the thread holds now."""
        now = time.monotonic()
        started = self.consumer.round_started
        revoked_at, self._revoked_at = self._revoked_at, None
        round_s = now - started if started is not None and started <= now else 0.0
        if round_s > 0:
            self._recent_rounds.append(round_s)
        revoked_s = now - revoked_at if revoked_at is not None else 0.0
        self.metrics.rebalance_done(self._label, max(round_s, revoked_s), revoked_s)
        self.metrics.set_assignment(
            self._label, [*self.registry.active, *self.registry.restoring],
            self.registry.copies_with(Role.LEARNER), self.registry.copies_with(Role.STANDBY))
        if not self.assignor.is_leader:
            self.metrics.set_hold_deadlines(self._label, {})
        self.metrics.set_scale_down_deadline(self._label, self.leaving_deadline_ms())

    def leaving_deadline_ms(self) -> int | None:
        """When this leaving member hands its tasks over whether learners are ready or not
        (the mark's time plus its timeout, else the app's scale_down_timeout_ms); None when
        it is not leaving."""
        leaving, since, timeout = self._leaving()
        if not leaving or since is None:
            return None
        return since + (self.config.scale_down_timeout_ms if timeout is None else timeout)

    def _schedule_rejoin(self, delay_ms: int | None) -> None:
        if self._rejoin_timer is not None:
            self._rejoin_timer.cancel()
            self._rejoin_timer = None
        if delay_ms is None:
            return
        loop = asyncio.get_running_loop()
        # Any round serves a follow-up: it carries no news of this member's.
        self._rejoin_timer = loop.call_later(
            max(0, delay_ms) / 1000,
            functools.partial(self.request_rejoin_once_synced, "follow-up rebalance",
                              news=False))

    def learners_ready(self, task_ids: list[str]) -> None:
        self.request_rejoin_once_synced(f"learners ready: {task_ids}")

    async def on_restored(self, task_id: str, stores: dict[str, KeyValueStore]) -> None:
        async with self._lock:
            if await self.task_manager.start_restored(task_id, stores):
                self._update_status()

    # -- status ------------------------------------------------------------------------------

    def _update_status(self) -> None:
        self.status.active = sorted(self.registry.active)
        self.status.restoring = self.restoring
        self.status.standbys = self.standbys
        self.status.learners = self.learners

    def status_record(self) -> dict[str, Any]:
        """What this member runs, as published on the app's status topic."""
        self._update_status()
        leaving, since, _timeout = self._leaving()
        return {
            "instance_id": self.instance_id,
            "thread": self.index,
            "static_id": self.static_id,
            "pid": os.getpid(),
            "incarnation": self.incarnation,
            "member_id": self.status.member_id,
            "generation": self.status.generation,
            "leader": self.assignor.is_leader,
            "state": self.state.value,
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
            "restored_records": self.state_updater.restored_records,
            #: Restoring actives whose changelog end is known: records left to restore.
            "restoring_lag": self.state_updater.restoring_lags(),
            "stateful_tasks": [t.task_id for t in self.layout.tasks() if t.stateful],
            "being_learned": list(self._being_learned),
            #: A new instance restoring its copies before it joins (streams.group.warm_up).
            "warming_up": self._warming_up,
            # The shortest of the last few: a round that waited for a crashed member's session
            # to expire says nothing of how long a join takes.
            "round_s": round(min(self._recent_rounds), 3) if self._recent_rounds else None,
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

    async def _housekeeping_loop(self) -> None:
        """Every second: publish the status, and check the member is not stuck joining."""
        topic = status_topic_name(self.config.application_id)
        key = self.status_key
        while not self._stop.is_set():
            self.join_watch.check()
            # A leaving mark arrives between rounds.
            self.metrics.set_scale_down_deadline(self._label, self.leaving_deadline_ms())
            await self._publish_status(topic, key)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 1.0)

    async def _publish_status(self, topic: str, key: bytes) -> None:
        with contextlib.suppress(Exception):
            await self.producer.send(topic, key=key, value=msgpack.packb(self.status_record()))

    # -- warming up before the first join ---------------------------------------------------

    async def _warm_up(self, gate: WarmUpGate) -> None:
        """Restore the copies this new instance expects to take before joining, then tell
        their owners, so that the tasks move in this member's first round
        (:mod:`streams.group.warm_up`)."""
        ready: frozenset[str] = frozenset()
        try:
            opened = self.task_manager.warm_up(gate.tasks_of(self.index))
            if opened:
                ready = await self._restore_warm_up(opened, gate.plan.join_lead_s)
        except Exception:
            log.exception("%s: warming up failed; joining with what it has", self.name)
        finally:
            waiting = asyncio.ensure_future(gate.done(self.index))
            stopped = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait([waiting, stopped], return_when=asyncio.FIRST_COMPLETED)
            for future in (waiting, stopped):
                future.cancel()
        if ready and not self._stop.is_set():
            await self._announce_promotion(ready, gate.plan.generation, joining=True)

    async def _restore_warm_up(self, tasks: list[str], join_lead_s: float) -> frozenset[str]:
        started = time.monotonic()
        deadline = started + self.config.warm_up_timeout_ms / 1000
        log.info("%s warms up %s before joining (for up to %.0fs)", self.name, tasks,
                 self.config.warm_up_timeout_ms / 1000)
        topic = status_topic_name(self.config.application_id)
        self._warming_up = True
        publisher = asyncio.ensure_future(self._publish_while_warming_up(topic))
        try:
            ready = await self.state_updater.warm_up(tasks, deadline, self._stop, join_lead_s)
        finally:
            self._warming_up = False
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher
        self._update_status()
        behind = sorted(set(tasks) - ready)
        finishing = sorted(self.state_updater.ready_by_assignment())
        log.info("%s warmed up %s in %.1fs%s%s", self.name, sorted(ready),
                 time.monotonic() - started,
                 f"; {finishing} catch up during the join round (about {join_lead_s:.1f}s, "
                 f"lags {[self.state_updater.copy_lag(t) for t in finishing]})"
                 if finishing else "",
                 f"; still behind, learned after joining: {behind}" if behind else "")
        return ready

    async def _publish_while_warming_up(self, topic: str) -> None:
        """Status records while warming up, so that ``relay describe`` and the web view show
        the copies' catch-up, and a second newcomer counts this one."""
        while True:
            self._update_status()
            await self._publish_status(topic, self.status_key)
            await asyncio.sleep(1.0)

    # -- processing -----------------------------------------------------------------------

    async def _process_loop(self) -> None:
        last_commit = time.monotonic()
        while not self._stop.is_set():
            started = time.perf_counter()
            batches = await self.consumer.getmany(timeout_ms=100, max_records=2000)
            async with self._lock:
                if self._awaiting_assignment:
                    continue
                await self._process(batches)
                punctuate_all(self.registry.active.values())
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

    async def _process(self, batches: dict[TopicPartition, list[Any]]) -> None:
        by_task = route_by_task(batches, self.registry.task_for)
        rebalancing = self.consumer.rebalancing
        for task, inputs in by_task:
            if rebalancing:
                self.records_during_rebalance += sum(len(i) for i in inputs)
            # Across a task's input partitions, older records first; within one partition,
            # always in offset order. Records the task already processed (a batch fetched
            # before a rebalance sought the partition back) are dropped by the task itself.
            records = inputs[0] if len(inputs) == 1 else list(
                heapq.merge(*inputs, key=lambda r: r.timestamp))
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
            self._fail(FatalThreadError(str(error)))
            # Not processed after all: it is neither committed nor skipped.
            task.processed[TopicPartition(record.topic, record.partition)] = record.offset
            raise error
        try:
            await self.collector.dead_letter(error, task.task_id)
        except BaseException as exc:
            # Not in the dead-letter topic, so not processed either: the thread stops without
            # committing past it, and a restart meets it again.
            task.processed[TopicPartition(record.topic, record.partition)] = record.offset
            self._fail(exc)
            raise

    # -- lifecycle ------------------------------------------------------------------------

    def _set_state(self, state: ThreadState) -> None:
        if self.state in (ThreadState.PENDING_SHUTDOWN, ThreadState.DEAD) and state in (
                ThreadState.RUNNING, ThreadState.REBALANCING):
            return
        if state is not self.state:
            log.debug("%s: %s -> %s", self.name, self.state.value, state.value)
            self.state = state

    def _fail(self, error: BaseException) -> None:
        if self._fatal is None:
            self._fatal = error
        self._stop.set()

    async def run(self, topics: list[str]) -> None:
        self._set_state(ThreadState.STARTING)
        await self.producer.start()
        await self.state_updater.start()
        if self.warm_up_gate is not None:
            await self._warm_up(self.warm_up_gate)
        await self.consumer.start()
        self.consumer.subscribe(topics, self.listener)
        loops = [
            asyncio.create_task(self._process_loop(), name=f"process-{self.index}"),
            asyncio.create_task(self.state_updater.restore_loop(self._stop),
                                name=f"restore-{self.index}"),
            asyncio.create_task(self.state_updater.follow_loop(self._stop, self._update_status),
                                name=f"follow-{self.index}"),
            asyncio.create_task(self._housekeeping_loop(), name=f"status-{self.index}"),
        ]
        stopper = asyncio.create_task(self._stop.wait())
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
            self._set_state(ThreadState.PENDING_SHUTDOWN)
            self._stop.set()
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
            self._set_state(ThreadState.DEAD)
        if self._fatal is not None:
            raise self._fatal

    def stop(self) -> None:
        self._stop.set()

    async def _close(self) -> None:
        if self._rejoin_timer is not None:
            self._rejoin_timer.cancel()
        if self._deferred_rejoin is not None:
            self._deferred_rejoin.cancel()
        await self.join_watch.close()
        try:
            async with self._lock:
                if self.registry.active and self._fatal is None:
                    await self.committer.commit(force=True)
        except Exception:
            log.exception("%s: final commit failed", self.name)
        self.task_manager.close_all()
        with contextlib.suppress(Exception):
            await self.collector.close()
        if self.shutdown_requested:
            await self._static_followers.settle(
                self.consumer, self.config.session_timeout_ms,
                self.config.heartbeat_interval_ms)
        if self._sends_leave_group():
            await self._until_formed_and_synced()
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
        if self._leaves_explicitly():
            # Sent once its consumer is stopped (through the producer's connection), so that
            # no join of its own can follow the leave.
            await leave_as_static_member(producer_client(self.producer),
                                         self.config.application_id, member_id,
                                         self.static_id or "")
            # Followers that rejoined for the last assignment while this leader was leaving
            # could be held in rounds led by the departed member (seen on Tansu); told now,
            # they rejoin a group without it.
            self._static_followers.tell_followers(self, self.assignor.static_digests)
        with contextlib.suppress(Exception):
            # Gone: describe and the duplicate check at start no longer see this member.
            await self.producer.send_and_wait(
                status_topic_name(self.config.application_id), key=self.status_key, value=None)
        with contextlib.suppress(Exception):
            await self.producer.stop()
