"""The factory of stream threads: builds a thread and its parts, with real clients or with
the fakes a test hands it.

The parts are wired here and nowhere else: the assignor reports the thread's subscription
and hands it the assignment; the state updater tells it when a restored task may run and when
learners are ready; the committer commits the thread's running tasks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from statestore.restore import ChangelogReader
from statestore.snapshot import SnapshotSettings
from statestore.store import KeyValueStore
from streams.config import AppConfig
from streams.dsl.topology import SubTopology
from streams.group.group_learning import GroupLearning
from streams.group.partition_assignor import RelayAssignor, TaskLayout
from streams.group.predecessors import MemberFiles
from streams.group.promotion_asks import PromotionAsks
from streams.kafka.driver import GroupConsumer, new_group_consumer, new_producer, producer_client
from streams.metrics import Metrics
from streams.quirks.departed_members import remove_departed_members
from streams.quirks.static_followers import ControlSender, StaticFollowers
from streams.quirks.switch import BrokerQuirks, Quirk
from streams.quirks.synced_round import RoundReports, unsynced_members
from streams.quirks.task_positions import PositionReader, TaskPositions
from streams.runtime.commit import Committer
from streams.runtime.delivery import new_data_producer
from streams.runtime.record_collector import RecordCollector
from streams.runtime.state_updater import StateUpdater
from streams.runtime.store_handover import ProcessStores
from streams.runtime.task import open_task_stores
from streams.runtime.task_manager import TaskManager
from streams.runtime.tasks import Tasks
from streams.runtime.thread import StreamThread, ThreadIdentity
from streams.runtime.transactions import (
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


def build_stream_thread(
    config: AppConfig,
    index: int,
    subs: list[SubTopology],
    *,
    bootstrap_servers: str | None = None,
    clients: ThreadClients | None = None,
    instance_id: str | None = None,
    incarnation: str = "",
    static_followers: StaticFollowers | None = None,
    control: ControlSender | None = None,
    process_stores: ProcessStores | None = None,
    leaving: Callable[[], tuple[bool, int | None, int | None]] = lambda: (False, None, None),
    metrics: Metrics | None = None,
    round_reports: RoundReports | None = None,
    quirks: BrokerQuirks | None = None,
    positions: TaskPositions | None = None,
    member_files: MemberFiles | None = None,
    promotion_asks: PromotionAsks | None = None,
    group_learning: GroupLearning | None = None,
) -> StreamThread:
    clients = clients or ThreadClients()
    needed = [clients.consumer, clients.producer, clients.restorer, clients.follower]
    if not config.exactly_once:
        needed.append(clients.data_producer)
    if bootstrap_servers is None and any(client is None for client in needed):
        raise ValueError("bootstrap_servers is needed for the clients not given")
    layout = TaskLayout(tuple(subs))
    static_id = f"{config.group_instance_id}-thread-{index}" if config.group_instance_id else None
    instance = instance_id or config.group_instance_id or f"pid-{os.getpid()}-{index}"
    identity = ThreadIdentity(index, instance, static_id, incarnation)
    # Each thread records under its status key: its static id, else one unique in the process.
    label = static_id or f"{instance}-thread-{index}"
    metrics = metrics if metrics is not None else Metrics()
    static_followers = static_followers or StaticFollowers(enabled=False)
    process_stores = process_stores or ProcessStores()
    thread: StreamThread  # bound below; the callbacks run only once the thread runs

    # Without the broker's quirks known (tests building a thread alone), assume the embedded
    # broker's.
    quirks = quirks if quirks is not None else BrokerQuirks.every()
    reports = round_reports if Quirk.LATE_FOLLOWER_SYNC in quirks else None

    def unsynced(previous_round: list[str]) -> set[str]:
        if reports is None:
            return set()
        return unsynced_members(previous_round, consumer.member_id, reports.generations)

    assignor = RelayAssignor(
        layout, config.assignor_config(),
        subscription=lambda: thread.subscription(),
        on_assigned=lambda assignment: thread.assignment_received(assignment),
        cooperative=config.cooperative,
        fresh_subscription=static_followers.fresh_subscription,
        metrics=metrics, metrics_label=label,
        unsynced=unsynced,
    )
    by_markers = Quirk.STUCK_LAST_STABLE_OFFSET in quirks
    consumer = clients.consumer or new_group_consumer(
        config, bootstrap_servers, static_id, index, assignor,  # type: ignore[arg-type]
        committed_by_markers=by_markers)
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
            clients.transactional_producer or (
                lambda tid: new_transactional_producer(bootstrap_servers or "", tid)))
    updater = StateUpdater(
        restorer, follower, tasks,
        commit_interval_ms=config.commit_interval_ms,
        acceptable_lag=config.acceptable_lag,
        learner_rejoin=config.learner_rejoin,
        learner_batch_wait_ms=config.learner_batch_wait_ms,
        group_learning=group_learning, member=label,
        on_restored=lambda task_id, stores: thread.on_restored(task_id, stores),
        on_learners_ready=lambda task_ids: thread.learners_ready(task_ids),
        metrics=metrics, metrics_label=label,
        # Exactly-once: a new active fences its previous owner before its state is read.
        before_restore=producers.start_task if producers is not None else None,
    )
    snapshots = (SnapshotSettings(config.snapshot_dir, bootstrap_servers or "")
                 if config.snapshot_dir is not None else None)

    def open_stores(task_id: str) -> dict[str, KeyValueStore]:
        # Every store a thread opens is restored or followed before anything reads it.
        return open_task_stores(layout.sub_of(task_id), task_id, config.application_id,
                                config.state_dir, snapshots, bulk_load=True)

    name = static_id or f"thread {index}"
    # Exactly-once on a broker that defers transactional offsets: each task also records
    # its input positions in its transaction, and starts from the later of the two.
    if not (config.exactly_once and Quirk.DEFERRED_TRANSACTIONAL_OFFSETS in quirks):
        positions = None
    reader = (PositionReader(positions, restorer.fetcher)
              if positions is not None and isinstance(restorer, ChangelogReader) else None)
    if reader is None:
        positions = None
    # Only a snapshot bootstrap takes long enough to matter; other stores open on the loop.
    manager = TaskManager(name, layout, tasks, consumer, updater, process_stores, open_stores,
                          reader, open_off_loop=snapshots is not None)
    collector: RecordCollector | TransactionalCollector
    committer: Committer | TransactionalCommitter
    if producers is not None:
        collector = TransactionalCollector(producers, config.dead_letters, metrics, label,
                                           config.changelog_buffer_bytes)

        def task_failed(task_id: str, error: BaseException) -> None:
            # Its writes were discarded: closed, the task reopens from its committed state
            # when the group hands it back.
            manager.close_task(task_id)
            thread.request_rejoin(f"the transaction of {task_id} failed: {error}")

        committer = TransactionalCommitter(
            collector,
            clients.group_metadata or (
                lambda: new_group_metadata(bootstrap_servers or "", config.application_id)),
            lambda: list(tasks.active.values()),
            lambda: [*tasks.active, *tasks.restoring],
            name, task_failed, metrics, label, positions)
    else:
        data_producer = (clients.data_producer if clients.data_producer is not None
                         else new_data_producer(bootstrap_servers or "", f"{label}-data"))
        collector = RecordCollector(data_producer, config.dead_letters, metrics, label,
                                    config.changelog_buffer_bytes)
        committer = Committer(collector, consumer, lambda: list(tasks.active.values()), name,
                              metrics, label)
    async def remove_departed() -> list[str]:
        client = producer_client(producer)
        if client is None or bootstrap_servers is None:
            return []
        return await remove_departed_members(client, bootstrap_servers, config.application_id,
                                             config.session_timeout_ms, static_id)

    thread = StreamThread(
        config, identity, layout,
        assignor=assignor, consumer=consumer, producer=producer, tasks=tasks,
        task_manager=manager, state_updater=updater, collector=collector,
        committer=committer, static_followers=static_followers, control=control,
        leaving=leaving, metrics=metrics,
        round_reports=reports,
        remove_departed=(remove_departed if clients.producer is None
                         and Quirk.DEPARTED_STATIC_LEADER in quirks else None),
        leave_from_formed_group=Quirk.LEADER_WEDGE in quirks,
        member_files=member_files, promotion_asks=promotion_asks,
    )
    static_followers.add_member(thread)
    return thread
