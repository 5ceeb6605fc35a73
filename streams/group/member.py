"""The thread's face to the group: its subscription, the assignment it receives, and its
requests for a round.

The rebalance path, in order: :meth:`GroupMember.subscription` (read by the assignor at each
join) -> the leader's :class:`~streams.group.partition_assignor.RelayAssignor` -> the
assignment, handed back to :meth:`GroupMember.assignment_received` -> the rebalance listener
(:mod:`streams.group.listener`) applies it to the tasks.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable

from assignor import MemberAssignment
from assignor.protocol import Subscription, encode_subscription, with_echo
from streams.config import AppConfig
from streams.group.group_learning import GroupLearning
from streams.group.learner_handover import PromotionAnnouncer
from streams.group.learner_readiness import being_promoted
from streams.group.partition_assignor import RelayAssignor
from streams.group.round_alarm import should_join
from streams.kafka.driver import GroupConsumer
from streams.quirks.hooks import RoundHooks
from streams.quirks.synced_round import RoundView
from streams.runtime.lifecycle import Lifecycle
from streams.runtime.state_updater import StateUpdater
from streams.runtime.tasks import Tasks
from streams.runtime.thread_status import Leaving, StatusReporter, ThreadIdentity
from streams.runtime.transitions import Role

log = logging.getLogger(__name__)


class GroupMember:
    """One thread's membership: what it tells the group and when it asks for a round."""

    def __init__(self, config: AppConfig, identity: ThreadIdentity, consumer: GroupConsumer,
                 assignor: RelayAssignor, registry: Tasks, state_updater: StateUpdater,
                 reporter: StatusReporter, lifecycle: Lifecycle, hooks: RoundHooks,
                 leaving: Leaving, announcer: PromotionAnnouncer,
                 group_learning: GroupLearning | None = None) -> None:
        self.config = config
        self.identity = identity
        self.static_id = identity.static_id
        self.consumer = consumer
        self.assignor = assignor
        self.registry = registry
        self.state_updater = state_updater
        self.reporter = reporter
        self.lifecycle = lifecycle
        self.hooks = hooks
        self.leaving = leaving
        self.announcer = announcer
        #: Sounds the round alarm (streams.group.round_alarm) for a round this member asks
        #: for; None: no alarm.
        self.round_asked: Callable[[int], None] | None = None
        #: The other members' status records: who has gone silent (None: not known).
        self.group_learning = group_learning
        self._pending_assignment: MemberAssignment | None = None
        #: The last assignment received, whose leader notes the subscription echoes.
        self._last_assignment: MemberAssignment | None = None
        self._rejoin_token = 0
        #: The token and reason of the last request whose news the subscription carries:
        #: asked for again when no round carried it (see ask_again_if_asked_during_round).
        self._news: tuple[int, str] | None = None
        self._rejoin_timer: asyncio.TimerHandle | None = None
        #: Why this member will ask for the next round once its round has its assignments.
        self._deferred_rejoins: list[tuple[str, bool]] = []
        self._deferred_rejoin: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.identity.name

    @property
    def is_leader(self) -> bool:
        return self.assignor.is_leader

    @property
    def received_digest(self) -> str | None:
        return self.assignor.received_digest

    @property
    def in_round(self) -> bool:
        return self.consumer.rebalancing

    @property
    def static_digests(self) -> dict[str, str]:
        return self.assignor.static_digests

    @property
    def generation(self) -> int:
        return self.reporter.status.generation

    @property
    def asking(self) -> bool:
        """A round asked for by this member, or scheduled, that has not started yet."""
        pending = self._deferred_rejoin is not None and not self._deferred_rejoin.done()
        timer = self._rejoin_timer
        scheduled = timer is not None and not timer.cancelled() and (
            timer.when() > asyncio.get_running_loop().time())
        return pending or scheduled or self.consumer.rejoin_pending

    # -- the subscription and the assignment (called by the assignor) ---------------------

    def subscription(self) -> Subscription:
        self.reporter.publish_if_changed()
        leaving, since, timeout = self.leaving.current()
        # Echoing the leader's notes of the last assignment lets any new leader rebuild the
        # memory (held lost tasks, moves under way) the previous one kept.
        return with_echo(Subscription(
            instance_id=self.identity.instance_id,
            thread=self.identity.index,
            pid=os.getpid(),
            active=self.registry.owned(),
            standbys=self.state_updater.lags(Role.STANDBY),
            learners=self.state_updater.lags(Role.LEARNER),
            leaving=leaving,
            leaving_since_ms=since,
            scale_down_timeout_ms=timeout,
            rejoin_token=self._rejoin_token,
            static=self.static_id is not None,
            # The last assignment received (maybe not applied yet) says what it promoted.
            asks_promotion=self.state_updater.asks_promotion(self.promoted_by_last()),
            ready_by_assignment=tuple(sorted(self.state_updater.ready_by_assignment())),
            slow_restores=self.state_updater.slow_restores(),
        ), self._last_assignment)

    def promoted_by_last(self) -> frozenset[str]:
        last = self._last_assignment
        return being_promoted(last.notes if last is not None else None,
                              (self.identity.instance_id, self.identity.index))

    def assignment_received(self, assignment: MemberAssignment) -> None:
        self._pending_assignment = assignment
        self._last_assignment = assignment

    def take_assignment(self) -> MemberAssignment | None:
        """The assignment received in the round that just completed (once)."""
        assignment, self._pending_assignment = self._pending_assignment, None
        return assignment

    def unsynced(self, previous_round: list[str]) -> set[str]:
        """As leader: members of its last round still without their assignment of it."""
        return self.hooks.unsynced(previous_round, self.consumer.member_id)

    def publish_subscription(self) -> None:
        if self.static_id is not None:
            self.hooks.publish_subscription(self, encode_subscription(self.subscription()))

    # -- asking for a round ------------------------------------------------------------------

    def request_rejoin(self, reason: str, broadcast: bool = True, news: bool = True) -> None:
        """Ask for a rebalance: rejoin with a changed token in the metadata (and, with the
        static-follower protocol, ask the leader too: ``broadcast``). ``news``: the
        subscription changed (a leaving mark, ready learners, tasks closed), so the round
        must carry this one; False when any round serves (a follow-up, a round for another
        member)."""
        if self.lifecycle.stopping:
            # Stopping: its leaving rebalances the group anyway, and a join sent now would
            # re-add it (as leader, maybe) to a round it will never finish.
            log.info("%s stopping; not rejoining for: %s", self.name, reason)
            return
        log.info("%s asks for a rebalance: %s", self.name, reason)
        self._rejoin_token += 1
        if news:
            self._news = (self._rejoin_token, reason)
        self.publish_subscription()
        self.consumer.request_rejoin()
        if broadcast:
            self.hooks.ask_leader(self, reason)
        if self.round_asked is not None and self.consumer.generation >= 0:
            # The others join the round this one starts at once, rather than when their next
            # heartbeat says so: a broker (Tansu) that kept this member in its forming round
            # when it froze there never said so, and the others ran on without its tasks.
            self.round_asked(self.consumer.generation)

    def request_rejoin_once_synced(self, reason: str, news: bool = True) -> None:
        """Ask for a rebalance once every member of this member's round has its assignment
        (bounded; see :mod:`streams.quirks.synced_round`): a request right after this
        member's own SyncGroup answer can stall the members still waiting for theirs."""
        if not self.hooks.waits_for_synced_round or not self.config.cooperative:
            # Stop-the-world members do not report their rounds (nor ask right after one).
            self.request_rejoin(reason, news=news)
            return
        self._deferred_rejoins.append((reason, news))
        if self._deferred_rejoin is None or self._deferred_rejoin.done():
            self._deferred_rejoin = asyncio.get_running_loop().create_task(
                self._rejoin_once_synced(), name=f"rejoin-{self.identity.index}")

    def join_begun_round(self, begun_after: int, begun: bool = True) -> bool:
        """Another member heard that the group has begun the round after ``begun_after``
        (streams.group.round_alarm): join it now rather than at the next heartbeat. The
        subscription stays as it is, so this never starts a round of its own."""
        if self.lifecycle.stopping:
            return False  # see request_rejoin
        if not should_join(self.consumer.generation, self.consumer.rebalancing, begun_after):
            # Still waiting for its assignment of that generation, it will not get one once
            # the broker has begun the next round: a broker may answer only at its timeout
            # (Tansu: 0.8 of a session), by when the others' round has gone on without it,
            # and their next one waits for it. A round only asked for begins after the
            # asker's own answer: that SyncGroup is not vain (given up, the leader's
            # assignment could still reach the others, and this member miss it).
            if not begun:
                return False
            return self.consumer.abandon_sync(begun_after, "the round after it has begun")
        self.consumer.request_rejoin()
        return True

    def learners_ready(self, task_ids: list[str]) -> None:
        """The state updater's news: learners caught up, so a round may promote them. The
        status saying so goes out first: a round can promote them within a second, and its
        readers (the web view) would otherwise never see them ready."""
        self.reporter.publish_soon()
        self.request_rejoin_once_synced(f"learners ready: {task_ids}")

    def restores_slow(self, task_ids: list[str]) -> None:
        """The state updater's news: restores that a caught-up copy elsewhere could spare
        (:mod:`streams.group.slow_restores`); the subscription names them."""
        lags = self.state_updater.slow_restores()
        left = ", ".join(f"{t}: {lags.get(t, '?')}" for t in task_ids)
        learning = self.group_learning
        copies = (learning.caught_up_copies(self.identity.instance_id, int(time.time() * 1000))
                  if learning is not None else None)
        if copies is not None and not copies & set(task_ids):
            # Its subscription names them still: a round that has a caught-up copy by then
            # hands them over all the same.
            log.info("%s: restoring %s from far behind (%s records left); no other instance "
                     "has a caught-up copy to hand them to", self.name, task_ids, left)
            return
        log.info("%s: restoring %s from far behind (%s records left): asks for a round that "
                 "can hand them to caught-up copies", self.name, task_ids, left)
        self.request_rejoin_once_synced(f"slow restores: {task_ids}")

    def join_round_s(self) -> float:
        """How long a join round takes: the shortest this thread measured lately, else the
        shortest the group's members publish, else what the broker's rounds take before any
        is measured (a group formed once and stable since has measured none)."""
        if self.reporter.recent_rounds:
            return min(self.reporter.recent_rounds)
        learning = self.group_learning
        group = (learning.join_round_s(int(time.time() * 1000)) if learning is not None
                 else None)
        if group is not None:
            return group
        return self.hooks.round_s_before_measured(self.config.session_timeout_ms)

    def round_view(self, waited_s: float) -> RoundView:
        size = self._last_assignment.group_size if self._last_assignment is not None else 0
        return RoundView(self.generation, size, self.consumer.rebalancing, waited_s)

    async def _rejoin_once_synced(self) -> None:
        asked = time.monotonic()
        while True:
            view = await self.hooks.until_round_synced(self, self.lifecycle.stopped)
            if view is None:
                return  # leaving rebalances the group anyway
            started = self.consumer.round_started
            await self.until_no_member_silent()
            await self.until_other_instances_out_of_round()
            if self.consumer.round_started == started and not self.consumer.rebalancing:
                break
            # A round began meanwhile (the silent member's session ended): its members
            # get their assignments before this member asks.
        await self.announce_promotion()
        deferred, self._deferred_rejoins = self._deferred_rejoins, []
        synced = self.hooks.members_synced(view.generation)
        self.request_rejoin(
            f"{'; '.join(r for r, _ in deferred)} (after {time.monotonic() - asked:.2f}s: "
            f"{synced} of {view.group_size} members have their assignment of generation "
            f"{view.generation})", news=any(n for _, n in deferred))

    async def until_other_instances_out_of_round(self) -> None:
        """Before asking for a round: wait (bounded, under the late-follower-sync quirk)
        while a member of another instance says it is in a round, its SyncGroup answer still
        to come; the generation reports cannot tell where the broker keeps a generation."""
        learning = self.group_learning
        if learning is None:
            return
        instance = self.identity.instance_id
        await self.hooks.until_before_asking(
            lambda: learning.in_round(instance, int(time.time() * 1000)),
            lambda: self.consumer.rebalancing)

    async def until_no_member_silent(self, poll_s: float = 0.2) -> None:
        """Before asking for a round: wait while another member of this member's round has
        gone silent (no status for seconds) but may still be in the group (a frozen process
        whose session has not ended yet). A round asked for then would include it, or wait
        for it, and its session's end starts another one without it: the tasks it held
        waited a round more (seen after a SIGSTOP in the static soak). Bounded by the
        session timeout; the round its session's end starts serves this member's news."""
        learning = self.group_learning
        if learning is None:
            return
        deadline = time.monotonic() + self.config.session_timeout_ms / 1000 + 1
        told = False
        while not self.lifecycle.stopped.is_set() and time.monotonic() < deadline:
            silent = learning.silent(self.identity.label, self.generation,
                                     int(time.time() * 1000), self.config.session_timeout_ms)
            if not silent:
                return
            if not told:
                log.info("%s: %s silent; asking for a round once the broker has ended its "
                         "session or it is back", self.name, ", ".join(silent))
                told = True
            await asyncio.sleep(poll_s)

    async def announce_promotion(self) -> None:
        """Tell the owners of the ready learners this member is about to ask the round to
        promote (streams.group.promotion_asks)."""
        if self.leaving.current()[0]:
            # A leaving member's learners are not promoted: an owner giving a task up for
            # them would give it up for nobody.
            return
        tasks = self.state_updater.asked_learners() - self.promoted_by_last()
        await self.announcer.announce(tasks, self.generation)

    def ask_again_if_asked_during_round(self) -> None:
        """News asked for after this round's subscription was sent (a leaving mark, ready
        learners) is not in the round, and the client drops the request when it sends its
        SyncGroup: ask again, so the next round hears of it. A request any round serves
        (a follow-up) was served by this one."""
        if (self._news is not None and self._news[0] > self.assignor.sent_rejoin_token
                and not self.consumer.rejoin_pending and not self.lifecycle.stopping):
            self.request_rejoin_once_synced(
                f"asked for during the round of generation {self.generation}, after "
                f"its subscription was sent: {self._news[1]}")

    def schedule_rejoin(self, delay_ms: int | None) -> None:
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

    def lost_sync_generation(self) -> int | None:
        """The generation whose SyncGroup answer this member waits for although another
        member reports having its own (see
        :func:`~streams.quirks.synced_round.sync_answer_lost`)."""
        return self.hooks.lost_sync_generation(self.consumer, self.generation)

    def close(self) -> None:
        if self._rejoin_timer is not None:
            self._rejoin_timer.cancel()
        if self._deferred_rejoin is not None:
            self._deferred_rejoin.cancel()
