"""The factory of stream threads: builds a thread and its parts, with real clients or with
the fakes a test hands it.

The parts are wired here and nowhere else, each handed the objects it calls: the assignor
serves the group member (its subscription, its assignment); the state updater tells the
rebalance listener when a restored task may run and the member when learners are ready; the
committer commits the registry's running tasks. The broker's quirks reach the parts as one
:class:`~streams.quirks.hooks.RoundHooks` (from :func:`~streams.quirks.hooks.hooks_for`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from statestore.restore import ChangelogReader
from statestore.snapshot import SnapshotSettings
from statestore.store import KeyValueStore
from streams.config import AppConfig
from streams.dsl.topology import SubTopology
from streams.group.control import control_topic_name
from streams.group.expiry_probe import ExpiryProbe
from streams.group.group_learning import GroupLearning
from streams.group.join_watch import JoinWatch, RebalanceAsker
from streams.group.learner_handover import LearnerHandover, PromotionAnnouncer
from streams.group.listener import FailedTransactions, RebalanceListener
from streams.group.member import GroupMember
from streams.group.member_id import thread_id_in, thread_member_id
from streams.group.newcomer import WarmUp
from streams.group.partition_assignor import RelayAssignor, TaskLayout
from streams.group.predecessors import MemberFiles
from streams.group.promotion_asks import PromotionAsks
from streams.group.round_alarm import RoundAlarm, RoundAnnouncer
from streams.group.warm_up import WarmUpGate
from streams.kafka.delete_records import RecordDeleter
from streams.kafka.driver import GroupConsumer, new_group_consumer, new_producer
from streams.metrics import Metrics
from streams.quirks.hooks import RoundHooks
from streams.quirks.synced_round import rejoin_limit_s
from streams.quirks.task_positions import PositionReader
from streams.runtime.commit import Committer
from streams.runtime.delivery import flush_timeout_s, message_timeout_ms, new_data_producer
from streams.runtime.lifecycle import Lifecycle
from streams.runtime.record_collector import RecordCollector
from streams.runtime.repartition_purge import Deleter, RepartitionPurger
from streams.runtime.state_updater import StateUpdater
from streams.runtime.store_handover import ProcessStores
from streams.runtime.task import open_task_stores
from streams.runtime.task_manager import TaskManager
from streams.runtime.tasks import Tasks
from streams.runtime.thread import StreamThread, ThreadIdentity
from streams.runtime.thread_status import Leaving, NotLeaving, StatusReporter
from streams.runtime.transactions import (
    OffsetsEvidence,
    TaskProducers,
    TransactionalCollector,
    TransactionalCommitter,
    new_group_metadata,
    new_transactional_producer,
)


@dataclass
class ThreadClients:
    """The clients a thread talks to the broker with. Each one left out is built for real
    from ``bootstrap_servers``."""

    consumer: GroupConsumer | None = None
    #: Status, control and group requests (aiokafka's interface).
    producer: Any = None
    #: Restores new actives' stores.
    restorer: Any = None
    #: Follows standby and learner copies.
    follower: Any = None
    #: Exactly-once only: makes a task's transactional producer from its transactional id.
    transactional_producer: Callable[[str], Any] | None = None
    #: Exactly-once only: the group metadata transactions commit offsets with.
    group_metadata: Callable[[], Any] | None = None
    #: At-least-once outputs, dead letters and changelog records (confluent-kafka's
    #: interface; see :mod:`streams.runtime.delivery`).
    data_producer: Any = None
    #: Deletes committed records of repartition topics (left out and no
    #: ``bootstrap_servers``: nothing does).
    record_deleter: Deleter | None = None


def build_stream_thread(
    config: AppConfig,
    index: int,
    subs: list[SubTopology],
    *,
    bootstrap_servers: str | None = None,
    clients: ThreadClients | None = None,
    instance_id: str | None = None,
    incarnation: str = "",
    hooks: RoundHooks | None = None,
    control: RebalanceAsker | None = None,
    process_stores: ProcessStores | None = None,
    leaving: Leaving | None = None,
    metrics: Metrics | None = None,
    member_files: MemberFiles | None = None,
    promotion_asks: PromotionAsks | None = None,
    group_learning: GroupLearning | None = None,
    warm_up_gate: WarmUpGate | None = None,
    round_alarm: RoundAlarm | None = None,
    offsets_evidence: OffsetsEvidence | None = None,
) -> StreamThread:
    """A thread and its parts. ``hooks``: what the broker's quirks add to its rounds (left
    out: nothing); ``control``: the process's control channel, which a member stuck joining
    asks the leader through; ``offsets_evidence``: what the process's threads saw of their
    sendings of exactly-once offsets and of the group's coordinator (left out: the
    thread's own)."""
    clients = clients or ThreadClients()
    needed = [clients.consumer, clients.producer, clients.restorer, clients.follower]
    if not config.exactly_once:
        needed.append(clients.data_producer)
    if bootstrap_servers is None and any(client is None for client in needed):
        raise ValueError("bootstrap_servers is needed for the clients not given")
    hooks = hooks if hooks is not None else RoundHooks()
    layout = TaskLayout(tuple(subs))
    static_id = (thread_member_id(config.group_instance_id, index) if config.group_instance_id
                 else None)
    instance = instance_id or config.group_instance_id or f"pid-{os.getpid()}-{index}"
    # Each thread records under its status key: its static id, else one unique in the process.
    label = static_id or thread_member_id(instance, index)
    identity = ThreadIdentity(index, instance, static_id, incarnation, label)
    name = identity.name
    metrics = metrics if metrics is not None else Metrics()
    process_stores = process_stores or ProcessStores()
    leaving = leaving if leaving is not None else NotLeaving()
    lifecycle = Lifecycle(name)
    lock = asyncio.Lock()

    assignor = RelayAssignor(
        layout, config.assignor_config(), cooperative=config.cooperative,
        fresh_subscription=hooks.fresh_subscription, metrics=metrics, metrics_label=label)
    by_markers = hooks.committed_by_markers
    consumer = clients.consumer or new_group_consumer(
        config, bootstrap_servers, static_id, index, assignor,  # type: ignore[arg-type]
        committed_by_markers=by_markers, refetch_skipped=hooks.refetch_skipped)
    # Checked against None: a producer with an empty queue has length 0.
    producer = (clients.producer if clients.producer is not None
                else new_producer(bootstrap_servers))  # type: ignore[arg-type]
    restorer = clients.restorer or ChangelogReader(
        bootstrap_servers, client_id=f"{instance}-restore",  # type: ignore[arg-type]
        committed_by_markers=by_markers)
    follower = clients.follower or ChangelogReader(
        bootstrap_servers, client_id=f"{instance}-copies",  # type: ignore[arg-type]
        committed_by_markers=by_markers)

    tasks = Tasks()
    producers: TaskProducers | None = None
    if config.exactly_once:
        producers = TaskProducers(
            config.application_id,
            clients.transactional_producer or TransactionalProducers(bootstrap_servers).new)
    updater = StateUpdater(
        restorer, follower, tasks,
        commit_interval_ms=config.commit_interval_ms,
        acceptable_lag=config.acceptable_lag,
        learner_rejoin=config.learner_rejoin,
        learner_batch_wait_ms=config.learner_batch_wait_ms,
        group_learning=group_learning, member=label,
        metrics=metrics, metrics_label=label,
        # Exactly-once: a new active fences its previous owner before its state is read.
        before_restore=producers.start_task if producers is not None else None,
    )
    reporter = StatusReporter(config, identity, layout, tasks, updater, assignor, lifecycle,
                              leaving, metrics, producer)
    announcer = PromotionAnnouncer(promotion_asks, producer,
                                   control_topic_name(config.application_id), label, name)
    member = GroupMember(config, identity, consumer, assignor, tasks, updater, reporter,
                         lifecycle, hooks, leaving, announcer, group_learning=group_learning)
    assignor.serve(member)
    hooks.add_member(member)
    if group_learning is not None:
        # late-follower-sync (the hook waits only with it on): a member frozen past its
        # session joins again only once the others' round ended
        # (streams.quirks.synced_round.may_join_after_loss).
        def others_in_round() -> list[str] | None:
            return group_learning.in_round(instance, int(time.time() * 1000))

        limit_s = rejoin_limit_s(config.session_timeout_ms)
        consumer.before_rejoin_after_silence(
            lambda: hooks.until_others_out_of_round(others_in_round, limit_s))
    if round_alarm is not None and config.cooperative:
        round_alarm.register(member)
        consumer.on_round_heard(round_alarm.heard)
        member.round_asked = round_alarm.asked
        if round_alarm.announce is None:
            round_alarm.announce = RoundAnnouncer(producer,
                                                  control_topic_name(config.application_id))
    snapshots = (SnapshotSettings(config.snapshot_dir, bootstrap_servers or "")
                 if config.snapshot_dir is not None else None)
    stores = TaskStores(layout, config, snapshots)

    # Exactly-once on a broker that defers transactional offsets: each task also records
    # its input positions in its transaction, and starts from the later of the two.
    positions = hooks.positions if config.exactly_once and hooks.records_positions else None
    reader = (PositionReader(positions, restorer.fetcher)
              if positions is not None and isinstance(restorer, ChangelogReader) else None)
    if reader is None:
        positions = None
    # Only a snapshot bootstrap takes long enough to matter; other stores open on the loop.
    manager = TaskManager(name, layout, tasks, consumer, updater, process_stores, stores.open,
                          reader, open_off_loop=snapshots is not None)
    purger = repartition_purger(config, subs, hooks, clients, bootstrap_servers, label)
    collector: RecordCollector | TransactionalCollector
    committer: Committer | TransactionalCommitter
    if producers is not None:
        collector = TransactionalCollector(producers, config.dead_letters, metrics, label,
                                           config.changelog_buffer_bytes)
        committer = TransactionalCommitter(
            collector,
            clients.group_metadata or GroupMetadata(bootstrap_servers,
                                                    config.application_id).fetch,
            tasks.running, tasks.held, name,
            FailedTransactions(manager, member).task_failed, metrics, label, positions, purger,
            getattr(consumer, "coordinator_known_since", None), offsets_evidence,
            consumer if hasattr(consumer, "coordinator_lost_at") else None)
    else:
        # Records queued before a stop that cost the member its partitions expire unsent.
        timeout_ms = message_timeout_ms(config.session_timeout_ms,
                                        config.heartbeat_interval_ms)
        def data_producer() -> Any:
            return new_data_producer(bootstrap_servers or "", f"{label}-data", timeout_ms)

        given = clients.data_producer
        collector = RecordCollector(given if given is not None else data_producer(),
                                    config.dead_letters, metrics, label,
                                    config.changelog_buffer_bytes, flush_timeout_s(timeout_ms),
                                    data_producer if given is None else None)
        committer = Committer(collector, consumer, tasks.running, name, metrics, label, purger,
                              manager.replay)
    handover = LearnerHandover(promotion_asks, config.cooperative, subs, tasks, lock,
                               committer, manager, reporter, name)
    listener = RebalanceListener(config, lock, lifecycle, consumer, producer, tasks, manager,
                                 updater, committer, member, reporter, handover, hooks,
                                 member_files, collector)
    # Only a copy elsewhere can spare a slow restore: without standbys there is rarely one.
    updater.report_to(restored=listener, ready=member,
                      slow=member if config.cooperative and config.num_standbys else None)
    # Test clients reach no broker: nothing to look for departed members on.
    remover = (hooks.departed_remover(producer, bootstrap_servers, config.application_id,
                                      config.session_timeout_ms, static_id)
               if clients.producer is None else None)
    join_watch = JoinWatch(name, config.session_timeout_ms, consumer, control,
                           remover.remove if remover is not None else None,
                           member.lost_sync_generation,
                           silences_of(group_learning, label)
                           if remover is not None and group_learning is not None else None,
                           (lambda: round_alarm.began(consumer.generation))
                           if round_alarm is not None and config.cooperative else None,
                           (lambda member: remover.removable_after_ms(
                               group_learning.leads(member)))
                           if remover is not None and group_learning is not None else None,
                           (lambda member_id: thread_id_in(member_id, config.application_id)
                            or member_id)
                           if remover is not None and group_learning is not None else None)
    probe: ExpiryProbe | None = None
    if (group_learning is not None and round_alarm is not None and config.cooperative
            and clients.producer is None):
        probe = ExpiryProbe(name, consumer, silences_of(group_learning, label),
                            config.session_timeout_ms, config.heartbeat_interval_ms,
                            round_alarm.began)
    warm_up = (WarmUp(warm_up_gate, index, name, config.warm_up_timeout_ms, manager, updater,
                      reporter, lifecycle, announcer)
               if warm_up_gate is not None else None)
    return StreamThread(
        config, identity, layout,
        lifecycle=lifecycle, lock=lock, assignor=assignor, consumer=consumer,
        producer=producer, tasks=tasks, task_manager=manager, state_updater=updater,
        collector=collector, committer=committer, member=member, listener=listener,
        reporter=reporter, join_watch=join_watch, hooks=hooks, metrics=metrics,
        member_files=member_files, warm_up=warm_up, expiry_probe=probe,
    )


def silences_of(group_learning: GroupLearning, label: str) -> Callable[[], dict[str, int]]:
    """What the expiry probe and the join watch ask of the group's status records: the other
    members -> how long each has been silent (ms)."""
    return lambda: group_learning.silences(label, int(time.time() * 1000))


def repartition_purger(config: AppConfig, subs: list[SubTopology], hooks: RoundHooks,
                       clients: ThreadClients, bootstrap_servers: str | None, label: str,
                       ) -> RepartitionPurger | None:
    """What purges the thread's repartition topics after commits: none for a topology
    without them, or on a broker without DeleteRecords (quirk ``no-delete-records``)."""
    if hooks.keeps_repartition_records or not any(sub.repartition_sources for sub in subs):
        return None
    deleter = clients.record_deleter
    if deleter is None and bootstrap_servers is not None:
        deleter = RecordDeleter(bootstrap_servers, f"{label}-purge")
    if deleter is None:
        return None
    return RepartitionPurger(deleter, config.repartition_purge_interval_ms, label)


@dataclass
class TaskStores:
    """Opens a task's stores: every store a thread opens is restored or followed before
    anything reads it."""

    layout: TaskLayout
    config: AppConfig
    snapshots: SnapshotSettings | None

    def open(self, task_id: str) -> dict[str, KeyValueStore]:
        return open_task_stores(self.layout.sub_of(task_id), task_id,
                                self.config.application_id, self.config.state_dir,
                                self.snapshots, bulk_load=True)


@dataclass
class TransactionalProducers:
    """Exactly-once: makes a task's transactional producer from its transactional id."""

    bootstrap_servers: str | None

    def new(self, transactional_id: str) -> Any:
        return new_transactional_producer(self.bootstrap_servers or "", transactional_id)


@dataclass
class GroupMetadata:
    """Exactly-once: the group metadata transactions commit offsets with."""

    bootstrap_servers: str | None
    application_id: str

    def fetch(self) -> Any:
        return new_group_metadata(self.bootstrap_servers or "", self.application_id)
