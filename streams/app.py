"""The App: where people declare their topology and configuration, and the worker that runs it.

``App.run()`` (or ``relay run module:app``) checks that a broker answers at
``bootstrap_servers``, checks the source topics and creates the internal ones (repartition,
changelog, dead letters), then runs ``num_threads`` stream threads until SIGINT or SIGTERM,
and shuts down cleanly: commit, flush, close stores, leave the group (dynamic members only;
static members keep their tasks for a restart within the session timeout).

An App needs no broker to be built or tested (the topology test driver runs it alone), but
running one needs a broker address. Run without one, it still starts an embedded broker of
its own, with a :class:`DeprecationWarning`: that goes in the next release.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Never

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaConnectionError

from statestore.serdes import Serde
from statestore.store import changelog_topic_name
from statestore.topics import (
    existing_partition_counts,
)
from streams.config import AppConfig, ConfigError, UnknownSettingError
from streams.dsl.describe import TopologyDescription, describe
from streams.dsl.global_tables import GlobalTable
from streams.dsl.stream import Stream, Table, stream_from_topic, table_from_topic
from streams.dsl.topology import SubTopology, TopicDecl, Topology, TopologyError
from streams.environment import (
    UnreachableBrokerError,
    check_reachable,
    check_state_dir,
    check_topic_names,
)
from streams.group.control import (
    ControlChannel,
    ControlListener,
    LeavingMark,
    LeavingState,
    control_topic_name,
)
from streams.group.group_learning import GroupLearning
from streams.group.member_id import instance_member_ids
from streams.group.partition_assignor import TaskLayout
from streams.group.predecessors import (
    MemberFiles,
    MemberRecord,
    StateDirectoryInUse,
    evict_predecessors,
    possible_leaders,
    stale_members,
)
from streams.group.promotion_asks import PromotionAsks
from streams.group.round_alarm import RoundAlarm
from streams.group.status_topic import read_status, status_topic_name
from streams.group.topology_record import encode_topology_record
from streams.group.warm_up import (
    WARM_UP_PLAN_WAIT_S,
    WarmUpGate,
    WarmUpPlan,
    group_settled,
    plan_warm_up,
)
from streams.metrics import Metrics, MetricsServer, serve_metrics
from streams.queries.routing import RoutingTable, StatusFollower
from streams.queries.store_query import (
    GlobalStoreQuery,
    LocalStores,
    StoreQuery,
    UnknownStoreError,
)
from streams.quirks.detect import broker_quirks
from streams.quirks.hooks import RoundHooks, hooks_for
from streams.quirks.switch import static_session_warning
from streams.quirks.task_positions import TaskPositions, positions_topic_name
from streams.runtime.app_topics import prepare_topics
from streams.runtime.factory import build_stream_thread
from streams.runtime.global_tables import GlobalTables
from streams.runtime.store_handover import ProcessStores
from streams.runtime.supervision import supervise
from streams.runtime.thread import StreamThread
from streams.runtime.transactions import OffsetsEvidence

# The deprecated path of an app given no bootstrap servers (an embedded broker of its own).
from streams.testing.broker import EmbeddedBroker

if TYPE_CHECKING:
    from streams.queries.server import QueryServer

log = logging.getLogger(__name__)

#: The shortest wait before a duplicate static id's status is looked at again: members
#: publish every second, so a live one has published again by then.
DUPLICATE_RECHECK_MIN_S = 1.5


def written_by_the_dead(first: dict[str, dict[str, Any]], predecessors: list[MemberRecord],
                        now_ms: float) -> bool:
    """Whether the newest status records of this static id were all written by processes
    this one knows are dead, long enough ago that a live duplicate would have written since.

    A predecessor in the member files ran on this state directory, so on this machine: its
    records' times are on this clock, and it is dead (its file's lock was free). Each key's
    newest record being one of its, at least :data:`DUPLICATE_RECHECK_MIN_S` old, means no
    other process published that key for longer than a publication takes, whatever its own
    clock says (a newer record would have replaced it): no second look is needed."""
    dead = {(p.member_id, p.pid) for p in predecessors}
    return bool(first) and all(
        (record.get("member_id"), record.get("pid")) in dead
        and now_ms - int(record.get("updated_ms", 0) or 0) >= DUPLICATE_RECHECK_MIN_S * 1000
        for record in first.values())


def duplicate_recheck_wait_s(updated_ms: int, now_ms: float, recheck_s: float) -> float:
    """How long to wait before looking again at a status record of this static id written
    at ``updated_ms``: until ``recheck_s`` after it was written, and at least
    :data:`DUPLICATE_RECHECK_MIN_S` (clocks of two machines may disagree)."""
    age_s = max(0.0, (now_ms - updated_ms) / 1000)
    return max(DUPLICATE_RECHECK_MIN_S, recheck_s - age_s)
_APP_COUNTER = itertools.count()

#: The deprecation of running an App without a broker address.
EMBEDDED_BROKER_DEPRECATED = (
    "running an App without bootstrap_servers starts an embedded broker of its own; this "
    "goes in the next release: pass bootstrap_servers (or set RELAY_BOOTSTRAP_SERVERS), and "
    "for development run `relay broker` and point the app at it")


class App:
    """A Relay stream application.

    >>> app = App("word-counts", bootstrap_servers="127.0.0.1:9092")
    >>> words = app.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w)
    >>> counts = words.count(store="counts")
    >>> counts.to_stream().to("word-counts")

    Every setting is a keyword argument (see the table in docs/configuration.md); one left at
    None comes from its ``RELAY_<SETTING>`` environment variable, else its default. The
    configuration, the assignor's included, is validated here: a wrong value raises
    :class:`streams.config.ConfigError` naming the setting.
    """

    def __init__(
        self,
        application_id: str | None = None,
        *,
        bootstrap_servers: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        snapshot_dir: str | os.PathLike[str] | None = None,
        num_threads: int | None = None,
        group_instance_id: str | None = None,
        commit_interval_ms: int | None = None,
        repartition_purge_interval_ms: int | None = None,
        changelog_buffer_bytes: int | None = None,
        session_timeout_ms: int | None = None,
        heartbeat_interval_ms: int | None = None,
        max_poll_interval_ms: int | None = None,
        num_standbys: int | None = None,
        acceptable_lag: int | None = None,
        max_learners: int | None = None,
        learner_rejoin: str | None = None,
        learner_batch_wait_ms: int | None = None,
        rebalance_protocol: str | None = None,
        lost_task_delay_ms: int | None = None,
        initial_delay_ms: int | None = None,
        scale_down_timeout_ms: int | None = None,
        warm_up_timeout_ms: int | None = None,
        imbalance_tolerance: int | None = None,
        on_error: str | None = None,
        dead_letter_topic: str | None = None,
        default_partitions: int | None = None,
        static_follower_digests: bool | None = None,
        broker_quirks: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str | None = None,
        processing_guarantee: str | None = None,
        query_port: int | None = None,
        query_host: str | None = None,
        query_advertised_host: str | None = None,
        **misspelt: Never,
    ) -> None:
        if misspelt:
            raise UnknownSettingError(misspelt)
        self.config = AppConfig.from_env(
            application_id=application_id, bootstrap_servers=bootstrap_servers,
            state_dir=state_dir, snapshot_dir=snapshot_dir, num_threads=num_threads,
            group_instance_id=group_instance_id, commit_interval_ms=commit_interval_ms,
            repartition_purge_interval_ms=repartition_purge_interval_ms,
            changelog_buffer_bytes=changelog_buffer_bytes,
            session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=heartbeat_interval_ms,
            max_poll_interval_ms=max_poll_interval_ms, num_standbys=num_standbys,
            acceptable_lag=acceptable_lag, max_learners=max_learners,
            learner_rejoin=learner_rejoin, learner_batch_wait_ms=learner_batch_wait_ms,
            rebalance_protocol=rebalance_protocol,
            lost_task_delay_ms=lost_task_delay_ms, initial_delay_ms=initial_delay_ms,
            scale_down_timeout_ms=scale_down_timeout_ms, warm_up_timeout_ms=warm_up_timeout_ms,
            imbalance_tolerance=imbalance_tolerance, on_error=on_error,
            dead_letter_topic=dead_letter_topic, default_partitions=default_partitions,
            static_follower_digests=static_follower_digests,
            broker_quirks=broker_quirks,
            metrics_port=metrics_port, metrics_host=metrics_host,
            processing_guarantee=processing_guarantee,
            query_port=query_port, query_host=query_host,
            query_advertised_host=query_advertised_host,
        )
        self.topology = Topology(self.config.application_id)
        #: The app's global tables (``global_table``), held whole by every instance.
        self.global_tables: list[GlobalTable] = []
        self.threads: list[StreamThread] = []
        #: Whether this instance is marked as leaving (read by its threads).
        self.leaving = LeavingState()
        self.bootstrap_servers: str | None = self.config.bootstrap_servers
        self._stop: asyncio.Event | None = None
        #: stop() came before run_async() made its event: the run is over before it starts
        self._stop_before_run = False
        self._global_tables: GlobalTables | None = None
        self._broker: Any = None
        self._warned_embedded = False
        #: The process's identity in the group: its group instance id when static, else a
        #: name of its own (``relay describe`` shows it; ``relay mark-leaving`` takes it).
        #: Tells this run apart from any other process (or earlier run) with the same ids.
        self.incarnation = uuid.uuid4().hex
        self.instance_id = self.config.group_instance_id or (
            f"{socket.gethostname()}-{os.getpid()}-{next(_APP_COUNTER)}")
        #: What the broker's quirks add to a round (streams.quirks.hooks), once known.
        self.hooks = RoundHooks()
        #: Where exactly-once tasks record their input positions (broker quirk
        #: ``deferred-transactional-offsets``); None when not needed.
        self.task_positions: TaskPositions | None = None
        #: The app's Prometheus metrics, recorded by its threads (one registry per app).
        self.metrics = Metrics()
        #: Serving them while the app runs with ``metrics_port`` set.
        self.metrics_server: MetricsServer | None = None
        #: What the threads hold, for interactive queries (``store``).
        self.local_stores = LocalStores(lambda: self.threads, lambda: self.global_tables)
        #: Serving queries while the app runs with ``query_port`` set.
        self.query_server: QueryServer | None = None
        #: Where the group's members hold their tasks, followed while queries are served.
        self.routing = RoutingTable()

    # -- the DSL's entry points -----------------------------------------------------------

    def topic(
        self,
        name: str,
        key_serde: str | Serde | None = None,
        value_serde: str | Serde | None = None,
        partitions: int | None = None,
    ) -> TopicDecl:
        """Declare a topic once: its serdes serve every ``stream``, ``table`` and ``to`` of it
        that names none; with ``partitions`` the app creates it when it is missing."""
        return self.topology.declare_topic(TopicDecl(name, key_serde, value_serde, partitions))

    def stream(
        self,
        topic: str | TopicDecl,
        key_serde: str | Serde | None = None,
        value_serde: str | Serde | None = None,
        timestamp: Callable[[Any, Any, int], int] | None = None,
    ) -> Stream:
        """A stream of ``topic``'s records; serdes default to the topic's, else msgpack.
        ``timestamp(key, value, record_timestamp_ms) -> ms``: the timestamp windows, joins
        and outputs go by (the record's own by default)."""
        return stream_from_topic(self.topology, topic, key_serde, value_serde, timestamp)

    def table(
        self,
        topic: str | TopicDecl,
        store: str,
        key_serde: str | Serde | None = None,
        value_serde: str | Serde | None = None,
    ) -> Table:
        """The latest value per key of ``topic``, kept in ``store``."""
        return table_from_topic(self.topology, topic, store, key_serde, value_serde)

    def global_table(
        self,
        topic: str | TopicDecl,
        store: str,
        key_serde: str | Serde | None = None,
        value_serde: str | Serde | None = None,
    ) -> GlobalTable:
        """Every partition of ``topic`` in ``store``, held whole by every instance: restored
        from the topic at start (it has no changelog) and kept up to date while the app runs.
        Join a stream with it by ``stream.join(table, key_selector, joiner)``."""
        name = topic.name if isinstance(topic, TopicDecl) else topic
        keys, values = self.topology.serdes_for(name, key_serde, value_serde)
        if any(t.store == store for t in self.global_tables) or store in self.topology.stores:
            raise TopologyError(f"store {store!r} is declared twice; store names are unique")
        table = GlobalTable(name, store, keys, values)
        self.global_tables.append(table)
        return table

    def describe(self) -> TopologyDescription:
        """The topology as Kafka Streams' ``Topology.describe()`` shows it: sub-topologies,
        their sources, processors with their stores, and sinks; then the internal topics.
        ``print(app.describe())``."""
        return describe(self.topology, tuple(f"{t.store} (topic: {t.topic})"
                                             for t in self.global_tables))

    def store(self, name: str) -> StoreQuery | GlobalStoreQuery:
        """Interactive queries of store ``name`` held by this process: ``get(key)``,
        ``read(key)`` (with the copy that answered and its lag) and ``range(start, end)``
        over committed state (see :mod:`streams.queries.store_query`); a global table's
        store answers every key in every process. An unknown name raises
        :class:`streams.queries.store_query.UnknownStoreError`."""
        table = self.local_stores.global_table(name)
        if table is not None:
            return GlobalStoreQuery(table)
        if name not in self.topology.stores:
            known = ", ".join(sorted([*self.topology.stores,
                                      *(t.store for t in self.global_tables)])) or "none"
            raise UnknownStoreError(f"the app declares no store {name!r} (stores: {known})")
        return StoreQuery(name, self.local_stores)

    # -- running --------------------------------------------------------------------------

    async def prepare(self, admin: AIOKafkaAdminClient,
                      hooks: RoundHooks | None = None) -> list[SubTopology]:
        """Make the app's topics ready (:mod:`streams.runtime.app_topics`); returns the
        sized sub-topologies."""
        records_positions = (self.config.exactly_once and hooks is not None
                             and hooks.records_positions)
        prepared = await prepare_topics(self.topology, self.config, admin, records_positions)
        if prepared.task_positions is not None and hooks is not None:
            self.task_positions = hooks.positions = prepared.task_positions
        return prepared.subs

    def check_environment(self) -> None:
        """Before anything starts: the internal topics' names are legal and ``state_dir`` can
        be written (else a :class:`ConfigError` naming the setting)."""
        app = self.config.application_id
        check_topic_names(app, [
            *self.topology.repartition_topics,
            *(changelog_topic_name(app, store) for store in self.topology.stores),
            self.config.dead_letters, status_topic_name(app), control_topic_name(app),
            positions_topic_name(app),
        ])
        check_state_dir(self.config.state_dir)

    def _claim_member_files(self) -> MemberFiles:
        """Lock this run's member files (:mod:`streams.group.predecessors`), or a
        :class:`ConfigError` when another live process runs the app from this state
        directory."""
        try:
            return MemberFiles.claim(self.config.state_dir, self.config.application_id,
                                     self.config.num_threads)
        except StateDirectoryInUse as exc:
            raise ConfigError(str(exc)) from None

    def _warn_embedded_broker(self, stacklevel: int) -> None:
        if not self._warned_embedded:
            self._warned_embedded = True
            warnings.warn(EMBEDDED_BROKER_DEPRECATED, DeprecationWarning,
                          stacklevel=stacklevel + 1)

    def _start_embedded_broker(self) -> str:
        self._broker = EmbeddedBroker().start()
        # Also logged: a DeprecationWarning is hidden by default outside ``__main__``.
        log.warning("no bootstrap_servers: started an embedded broker at %s (deprecated: %s)",
                    self._broker.bootstrap_servers, EMBEDDED_BROKER_DEPRECATED)
        return str(self._broker.bootstrap_servers)

    async def run_async(self) -> None:
        """Run until :meth:`stop` is called or a thread fails; at once, without starting,
        if :meth:`stop` was called before."""
        if self._stop_before_run:
            self._stop_before_run = False
            log.info("stopped before it ran: not starting")
            return
        self._stop = asyncio.Event()
        embedded = self.bootstrap_servers is None
        if embedded:
            self._warn_embedded_broker(stacklevel=2)
        self.check_environment()
        # Before anything else, and held for the whole run: a second process of the app on
        # this state directory is refused here, not at the first store both would open.
        member_files = self._claim_member_files()
        try:
            if embedded:
                self.bootstrap_servers = self._start_embedded_broker()
            else:
                await check_reachable(str(self.bootstrap_servers))
        except BaseException:
            member_files.release()
            raise
        bootstrap = str(self.bootstrap_servers)
        control: ControlChannel | None = None
        try:
            self.metrics_server = serve_metrics(self.metrics, self.config.metrics_port,
                                                self.config.metrics_host)
            if self.metrics_server is not None:
                log.info("serving metrics at %s", self.metrics_server.url)
            # Before any Kafka client is made: a query port in use stops the app here,
            # cleanly, with nothing left unclosed.
            follower = await self._serve_queries(bootstrap)
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            try:
                await admin.start()
            except KafkaConnectionError as exc:
                # Reachable a moment ago (or answering, but not as a Kafka broker).
                raise UnreachableBrokerError(
                    f"bootstrap_servers {bootstrap!r}: no Kafka broker answers ({exc})") from None
            quirks = await broker_quirks(self.config.broker_quirks,
                                         self.config.static_follower_digests, bootstrap, embedded)
            advice = static_session_warning(quirks, self.config.group_instance_id,
                                            self.config.session_timeout_ms)
            if advice is not None:
                log.warning("%s", advice)
            control_listener = ControlListener(
                bootstrap, self.config.application_id, self.instance_id, self._on_mark,
                self._on_rebalance_request)
            control = ControlChannel(control_listener)
            # The one switch: what the broker's quirks add to every round of every thread.
            self.hooks = hooks = hooks_for(quirks, control)
            try:
                # First of all: a crashed run's tasks wait for this (streams.group.predecessors).
                await self._remove_predecessors(bootstrap, member_files, hooks)
                subs = await self.prepare(admin, hooks)
            finally:
                await admin.close()
            # Once per start, for `relay web` to draw (streams.group.topology_record).
            control.publish_topology(encode_topology_record(
                self.describe(), self.instance_id, int(time.time() * 1000)))
            restarted = await self._refuse_duplicate_instance(member_files.predecessors)
            # A restart never warms up, its state directory lost or not: the group holds its
            # tasks for it, and a restore too slow to wait for goes to a caught-up copy
            # (streams.group.slow_restores).
            warm_up = None if restarted else await self._plan_warm_up(subs, member_files)
            topics = sorted({t for s in subs for t in s.sources})
            self.config.state_dir.mkdir(parents=True, exist_ok=True)
            global_tables = await self._restore_global_tables(bootstrap)
            # Which ready learners members ask rounds to promote (streams.group.promotion_asks).
            promotion_asks = PromotionAsks()
            listener = control_listener
            listener.listen(hooks, promotion_asks)
            promotion_asks.read_to_end = listener.read_to_end
            # A round one member heard of, every member joins (streams.group.round_alarm).
            round_alarm = RoundAlarm()
            listener.on_round_begun = round_alarm.wake
            # The other members' learners, for batching promotions (streams.group.group_learning):
            # the status topic is followed from the first time a thread asks.
            extras: list[asyncio.Task[None]] = []
            group_learning = GroupLearning()
            group_learning.start_following = lambda: extras.append(asyncio.create_task(
                StatusFollower(bootstrap, self.config.application_id,
                               group_learning).run(self._stop)))
            process_stores = ProcessStores()
            # Exactly-once: what one thread saw tells the others' hung sendings of offsets.
            offsets_evidence = OffsetsEvidence()
            gate = WarmUpGate(warm_up, self.config.num_threads) if warm_up is not None else None
            self.threads = [
                build_stream_thread(
                    self.config, i, subs, bootstrap_servers=bootstrap,
                    instance_id=self.instance_id, incarnation=self.incarnation,
                    hooks=hooks, control=control, process_stores=process_stores,
                    leaving=self.leaving, metrics=self.metrics, member_files=member_files,
                    promotion_asks=promotion_asks, group_learning=group_learning,
                    warm_up_gate=gate, round_alarm=round_alarm,
                    offsets_evidence=offsets_evidence,
                )
                for i in range(self.config.num_threads)
            ]
            if self.query_server is not None:
                for thread in self.threads:
                    thread.reporter.query_endpoint = self.query_server.url
            extras.append(asyncio.create_task(listener.run(self._stop)))
            extras.append(asyncio.create_task(global_tables.follow(self._stop)))
            if follower is not None:
                extras.append(asyncio.create_task(follower.run(self._stop)))
            runs = [asyncio.create_task(t.run(topics)) for t in self.threads]
            if restarted:
                hooks.restarted(f"{self.config.group_instance_id} restarted")
            stopper = asyncio.create_task(self._stop.wait())
            try:
                error = await supervise(runs, stopper, self._stop_threads)
            except asyncio.CancelledError:
                # Cancelled rather than stopped (a caller's timeout): the threads and the
                # helpers still stop cleanly, so that none runs on without its app.
                self._stop.set()
                self._stop_threads()
                await asyncio.wait([*runs, *extras, stopper])
                raise
            await control.drain()
            self._stop.set()
            for extra in extras:
                with contextlib.suppress(Exception):
                    await extra
            stopper.cancel()
            if all(t.shutdown_requested for t in self.threads):
                await listener.clear_mark()
                log.info("instance %s left the group after handing over its tasks",
                         self.instance_id)
            if error is not None:
                raise error
        finally:
            if control is not None:
                # A start that failed after the topology was sent: its send ends first.
                await control.drain(timeout_s=2.0)
            if self._global_tables is not None:
                await self._global_tables.close()
                self._global_tables = None
            member_files.release()
            if self.query_server is not None:
                await self.query_server.close()
                self.query_server = None
            if self.metrics_server is not None:
                self.metrics_server.close()
                self.metrics_server = None
            if self._broker is not None:
                self._broker.stop()
                self._broker = None

    async def _restore_global_tables(self, bootstrap: str) -> GlobalTables:
        """Open and restore the global tables before any task runs."""
        self._global_tables = GlobalTables(self.global_tables)
        if self.global_tables:
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await admin.start()
            try:
                counts = await existing_partition_counts(
                    admin, {t.topic for t in self.global_tables})
            finally:
                await admin.close()
            missing = sorted({t.topic for t in self.global_tables} - set(counts))
            if missing:
                raise TopologyError(f"global table topics {missing} do not exist; create them "
                                    f"first")
            self._global_tables.open(self.config.state_dir, self.config.application_id)
            await self._global_tables.restore(bootstrap, counts)
        return self._global_tables

    async def _remove_predecessors(self, bootstrap: str, files: MemberFiles,
                                   hooks: RoundHooks) -> None:
        """Remove from the group the members a crashed earlier run on this state directory
        left there, before this run joins (see :mod:`streams.group.predecessors`)."""
        own = (instance_member_ids(self.config.group_instance_id, self.config.num_threads)
               if self.config.group_instance_id else set())
        stale = stale_members(files.predecessors, own)
        if not stale:
            return
        client = AIOKafkaClient(bootstrap_servers=bootstrap)
        try:
            leaders: set[str] = set()
            if hooks.leave_from_formed_group:
                statuses = await read_status(bootstrap, self.config.application_id)
                leaders = possible_leaders(stale, statuses.values())
            await client.bootstrap()
            await evict_predecessors(client, self.config.application_id, stale,
                                     hooks.leave_from_formed_group,
                                     self.config.session_timeout_ms / 1000, leaders)
        except Exception as exc:
            log.warning("could not look for the members a crashed earlier run left in the "
                        "group (%s: %s)", type(exc).__name__, exc)
        finally:
            await client.close()

    async def _serve_queries(self, bootstrap: str) -> StatusFollower | None:
        """With ``query_port`` set, start the query server (the threads publish its
        endpoint); returns the status follower that keeps its routing table."""
        if self.config.query_port is None:
            return None
        # Imported only when serving: the HTTP server's imports are half of the process's
        # start, which a static member restarting within its session keeps its tasks waiting
        # for.
        from streams.queries.server import QueryServer, QueryService

        service = QueryService(self.routing, self.local_stores, instance_id=self.instance_id,
                               endpoint=lambda: None if self.query_server is None
                               else self.query_server.url)
        self.query_server = QueryServer(service)
        url = await self.query_server.start(self.config.query_host, self.config.query_port,
                                            self.config.query_endpoint_host)
        log.info("serving interactive queries at %s/stores/<store>/<key>", url)
        return StatusFollower(bootstrap, self.config.application_id, self.routing)

    async def _plan_warm_up(self, subs: list[SubTopology],
                            member_files: MemberFiles) -> WarmUpPlan | None:
        """What this instance restores before it joins, if it is new to a running group
        (:mod:`streams.group.warm_up`); None to join at once."""
        config = self.config
        if (not config.cooperative or config.warm_up_timeout_ms == 0
                or member_files.predecessors or self._has_own_state()):
            return None
        deadline = time.monotonic() + WARM_UP_PLAN_WAIT_S
        try:
            while True:
                statuses = await read_status(str(self.bootstrap_servers),
                                             config.application_id)
                now_ms = int(time.time() * 1000)
                # Members publish their status every second: a group in the middle of a
                # round would be predicted from what it ran before the round.
                if group_settled(statuses, now_ms, config.session_timeout_ms):
                    break
                if time.monotonic() >= deadline:
                    log.info("no settled group to warm up for; joining at once")
                    return None
                await asyncio.sleep(1.0)
            plan = plan_warm_up(
                statuses, self.instance_id, config.num_threads, TaskLayout(tuple(subs)).tasks(),
                config.assignor_config(), now_ms, stale_after_ms=config.session_timeout_ms)
        except Exception as exc:
            log.warning("could not plan a warm-up; joining at once (%s: %s)",
                        type(exc).__name__, exc)
            return None
        if plan is not None:
            log.info("instance %s is new to the group: warming up %s before it joins",
                     self.instance_id, dict(plan.by_thread))
        return plan

    def _has_own_state(self) -> bool:
        """Task state of this app on disk: a restart, which rejoins at once."""
        app_dir = self.config.state_dir / self.config.application_id
        try:
            return any(not entry.name.startswith(".") for entry in app_dir.iterdir())
        except OSError:
            return False

    async def _refuse_duplicate_instance(self, predecessors: list[MemberRecord],
                                         recheck_s: float = 3.0) -> bool:
        """Fail fast when a live process already runs this static id; True when an earlier
        process of this static id left status records (this one is its restart).

        Some brokers do not fence a second member with the same group instance id: it would
        silently share the first one's partitions. A member is live when its status record
        (published every second) is still being updated; a stale record of a crashed process
        does not count. The second look comes ``recheck_s`` after the record was written,
        and at least a publication and a margin after the first look: a restart after a
        crash then waits for nothing, as its tasks wait for it. No second look at all when
        the records are those of this state directory's dead predecessor and a publication
        old (see :func:`written_by_the_dead`): the restart of a crashed static member joins
        at once.
        """
        gid = self.config.group_instance_id
        if gid is None or self.bootstrap_servers is None:
            return False
        mine = instance_member_ids(gid, self.config.num_threads)
        first = {k: v for k, v in (await read_status(self.bootstrap_servers,
                                                     self.config.application_id)).items()
                 if k in mine and v.get("incarnation") != self.incarnation}
        if not first:
            return False
        if written_by_the_dead(first, predecessors, time.time() * 1000):
            return True
        newest_ms = max(int(v.get("updated_ms", 0) or 0) for v in first.values())
        await asyncio.sleep(duplicate_recheck_wait_s(newest_ms, time.time() * 1000, recheck_s))
        again = await read_status(self.bootstrap_servers, self.config.application_id)
        for key, record in sorted(first.items()):
            now = again.get(key)
            if now is not None and now.get("updated_ms", 0) > record.get("updated_ms", 0):
                # A configuration error: restarting as it is meets the same live process.
                raise ConfigError(
                    f"duplicate group instance id {key}: process {now.get('pid')} "
                    f"(instance {now.get('instance_id')}) is running it; give this instance "
                    f"another group_instance_id, or stop the other one first"
                )
        return True

    def stop(self) -> None:
        """Stop the run (a clean shutdown); called before the run starts, the run does not
        start."""
        if self._stop is not None:
            self._stop.set()
        else:
            self._stop_before_run = True

    def _stop_threads(self) -> None:
        for thread in self.threads:
            thread.stop()

    # -- the control topic ------------------------------------------------------------------

    def _on_rebalance_request(self, reason: str) -> None:
        """Another member asks the leader to rejoin."""
        for thread in self.threads:
            if thread.is_leader:
                thread.member.request_rejoin(f"as leader, for another member: {reason}",
                                             broadcast=False, news=False)

    def _on_mark(self, mark: LeavingMark | None) -> None:
        was_leaving, self.leaving.mark = self.leaving.mark is not None, mark
        if mark is None:
            if was_leaving and not any(t.shutdown_requested for t in self.threads):
                # Taken back (relay unmark-leaving): the group hears in the next round that
                # this instance stays, and stops handing its tasks to learners elsewhere.
                log.warning("this instance's leaving mark was taken back: staying")
                for thread in self.threads:
                    thread.member.request_rejoin("leaving mark taken back")
            return
        timeout = (mark.scale_down_timeout_ms if mark.scale_down_timeout_ms is not None
                   else self.config.scale_down_timeout_ms)
        log.warning("this instance is marked as leaving (timeout %s ms): handing over",
                    timeout)
        for thread in self.threads:
            thread.member.request_rejoin("marked as leaving")

    def run(self) -> None:
        """Run in the foreground until SIGINT/SIGTERM."""
        if self.bootstrap_servers is None:
            self._warn_embedded_broker(stacklevel=2)  # at the caller's line

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError):
                    loop.add_signal_handler(sig, self.stop)
            await self.run_async()

        asyncio.run(main())

    @property
    def state_dir(self) -> Path:
        return self.config.state_dir
