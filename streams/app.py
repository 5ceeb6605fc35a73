"""The App: where people declare their topology and configuration, and the worker that runs it.

``App.run()`` (or ``python -m streams run module:app``) starts the embedded broker when no
bootstrap address is configured, checks the source topics and creates the internal ones
(repartition, changelog, dead letters), then runs ``num_threads`` stream threads until SIGINT
or SIGTERM, and shuts down cleanly: commit, flush, close stores, leave the group (dynamic
members only; static members keep their tasks for a restart within the session timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from statestore.serdes import Serde
from statestore.store import changelog_topic_name
from statestore.topics import COMPACTED, TopicSpec, ensure_topics, existing_partition_counts
from streams.broker import EmbeddedBroker
from streams.config import AppConfig
from streams.control import ControlListener, LeavingMark, control_topic_name
from streams.dsl import Stream, Table, stream_from_topic, table_from_topic
from streams.status import read_status, status_topic_name
from streams.thread import FatalThreadError, StreamThread
from streams.topology import SubTopology, TopicDecl, Topology

log = logging.getLogger(__name__)
_APP_COUNTER = itertools.count()


class App:
    """A Relay stream application.

    >>> app = App("word-counts", bootstrap_servers="127.0.0.1:9092")
    >>> words = app.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w)
    >>> counts = words.count(store="counts")
    >>> counts.to_stream().to("word-counts")
    """

    def __init__(self, application_id: str | None = None, **settings: Any) -> None:
        self.config = AppConfig.from_env(application_id=application_id, **settings)
        self.topology = Topology(self.config.application_id)
        self.threads: list[StreamThread] = []
        self.leaving: tuple[bool, int | None, int | None] = (False, None, None)
        self.bootstrap_servers: str | None = self.config.bootstrap_servers
        self._stop: asyncio.Event | None = None
        self._broker: EmbeddedBroker | None = None
        self.on_record: Callable[[Any, Any], None] | None = None
        self._control: ControlListener | None = None
        #: The process's identity in the group: its group instance id when static, else a
        #: name of its own (``relay describe`` shows it; ``relay mark-leaving`` takes it).
        #: Tells this run apart from any other process (or earlier run) with the same ids.
        self.incarnation = uuid.uuid4().hex
        self.instance_id = self.config.group_instance_id or (
            f"{socket.gethostname()}-{os.getpid()}-{next(_APP_COUNTER)}")
        self._background: set[asyncio.Task[None]] = set()

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
    ) -> Stream:
        """A stream of ``topic``'s records; serdes default to the topic's, else msgpack."""
        return stream_from_topic(self.topology, topic, key_serde, value_serde)

    def table(
        self,
        topic: str | TopicDecl,
        store: str,
        key_serde: str | Serde | None = None,
        value_serde: str | Serde | None = None,
    ) -> Table:
        """The latest value per key of ``topic``, kept in ``store``."""
        return table_from_topic(self.topology, topic, store, key_serde, value_serde)

    # -- running --------------------------------------------------------------------------

    async def prepare(self, admin: AIOKafkaAdminClient) -> list[SubTopology]:
        """Check source topics, size the sub-topologies, create the internal topics."""
        subs = self.topology.sub_topologies()
        if not subs:
            raise ValueError("the app declares no streams or tables: nothing to run")
        external = {
            t for s in subs for t in s.sources if t not in self.topology.repartition_topics
        }
        await ensure_topics(admin, [TopicSpec(t, n) for t, n in
                                    self.topology.topics_to_create().items()])
        counts = await existing_partition_counts(admin, external)
        repartition = self.topology.assign_partitions(subs, counts, self.config.default_partitions)
        specs = [TopicSpec(topic, n) for topic, n in sorted(repartition.items())]
        for sub in subs:
            for store in sub.stores:
                specs.append(
                    TopicSpec(
                        changelog_topic_name(self.config.application_id, store),
                        sub.partitions, COMPACTED,
                    )
                )
        specs.append(TopicSpec(self.config.dead_letters, 1))
        specs.append(TopicSpec(status_topic_name(self.config.application_id), 1, COMPACTED))
        specs.append(TopicSpec(control_topic_name(self.config.application_id), 1, COMPACTED))
        await ensure_topics(admin, specs)
        return subs

    async def run_async(self) -> None:
        """Run until :meth:`stop` is called or a thread fails."""
        self._stop = asyncio.Event()
        if self.bootstrap_servers is None:
            self._broker = EmbeddedBroker().start()
            self.bootstrap_servers = self._broker.bootstrap_servers
            log.info("no bootstrap_servers: started an embedded broker at %s",
                     self.bootstrap_servers)
        try:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers)
            await admin.start()
            try:
                subs = await self.prepare(admin)
            finally:
                await admin.close()
            await self._refuse_duplicate_instance()
            topics = sorted({t for s in subs for t in s.sources})
            self.config.state_dir.mkdir(parents=True, exist_ok=True)
            self.threads = [
                StreamThread(
                    self.config, i, subs, self.bootstrap_servers,
                    leaving=lambda: self.leaving, on_record=self.on_record,
                    instance_id=self.instance_id, incarnation=self.incarnation,
                )
                for i in range(self.config.num_threads)
            ]
            control = ControlListener(
                self.bootstrap_servers, self.config.application_id,
                self.instance_id, self._on_mark, self._on_rebalance_request,
                self._on_fetch_request, self._on_subscription,
            )
            self._control = control
            for thread in self.threads:
                thread.ask_leader = self._ask_leader
                thread.tell_followers = self._tell_followers
                thread.publish_subscription = self._publish_subscription
            runs = [asyncio.create_task(t.run(topics)) for t in self.threads]
            extras = [asyncio.create_task(control.run(self._stop))]
            stopper = asyncio.create_task(self._stop.wait())
            pending = set(runs)
            error: BaseException | None = None
            while pending:
                done, _ = await asyncio.wait(
                    [*pending, stopper], return_when=asyncio.FIRST_COMPLETED
                )
                pending -= done
                failed = [d for d in done if d is not stopper and d.exception() is not None]
                if failed and error is None:
                    error = failed[0].exception()
                if stopper in done or failed:
                    for thread in self.threads:
                        thread.stop()
                # A thread told to shut down (a leaving member with nothing left) ends on
                # its own; the others keep handing over until they are told too.
            if self._background:
                # Control messages the threads sent on their way out (a leaving leader's
                # last word to its followers) go out before the control client stops.
                await asyncio.wait(set(self._background), timeout=10)
            self._stop.set()
            for extra in extras:
                with contextlib.suppress(Exception):
                    await extra
            stopper.cancel()
            if all(t.shutdown_requested for t in self.threads):
                await control.clear_mark()
                log.info("instance %s left the group after handing over its tasks",
                         self.config.group_instance_id)
            if error is not None:
                raise error
        finally:
            if self._broker is not None:
                self._broker.stop()
                self._broker = None

    async def _refuse_duplicate_instance(self, recheck_s: float = 3.0) -> None:
        """Fail fast when a live process already runs this static id.

        Some brokers do not fence a second member with the same group instance id: it would
        silently share the first one's partitions. A member is live when its status record
        (published every second) is still being updated; a stale record of a crashed process
        does not count.
        """
        gid = self.config.group_instance_id
        if gid is None or self.bootstrap_servers is None:
            return
        mine = {f"{gid}-thread-{n}" for n in range(self.config.num_threads)}
        first = {k: v for k, v in (await read_status(self.bootstrap_servers,
                                                     self.config.application_id)).items()
                 if k in mine and v.get("incarnation") != self.incarnation}
        if not first:
            return
        await asyncio.sleep(recheck_s)
        again = await read_status(self.bootstrap_servers, self.config.application_id)
        for key, record in sorted(first.items()):
            now = again.get(key)
            if now is not None and now.get("updated_ms", 0) > record.get("updated_ms", 0):
                raise FatalThreadError(
                    f"duplicate group instance id {key}: process {now.get('pid')} "
                    f"(instance {now.get('instance_id')}) is running it; give this instance "
                    f"another group_instance_id, or stop the other one first"
                )

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def _on_rebalance_request(self, reason: str) -> None:
        for thread in self.threads:
            if thread.assignor.is_leader:
                thread.request_rejoin(f"as leader, for another member: {reason}",
                                      broadcast=False)

    def _on_fetch_request(self, digests: dict[str, str]) -> None:
        for thread in self.threads:
            if thread.static_id in digests and not thread.assignor.is_leader:
                thread.fetch_assignment(digests[thread.static_id])

    def _on_subscription(self, static_id: str, data: bytes) -> None:
        for thread in self.threads:
            thread.assignor.fresh_subscriptions[static_id] = data

    def _publish_subscription(self, static_id: str, data: bytes) -> None:
        if self._control is not None:
            self._in_background(self._control.publish_subscription(static_id, data))

    def _ask_leader(self, reason: str) -> None:
        if self._control is not None:
            self._in_background(self._control.request_rebalance(reason))

    def _tell_followers(self, digests: dict[str, str]) -> None:
        if self._control is not None and digests:
            self._in_background(self._control.request_fetch(digests))

    def _in_background(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _on_mark(self, mark: LeavingMark | None) -> None:
        if mark is None:
            self.leaving = (False, None, None)
            return
        log.warning("this instance is marked as leaving (timeout %s ms): handing over",
                    mark.scale_down_timeout_ms)
        self.leaving = (True, mark.since_ms, mark.scale_down_timeout_ms)
        for thread in self.threads:
            thread.request_rejoin("marked as leaving")

    def run(self) -> None:
        """Run in the foreground until SIGINT/SIGTERM."""

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
