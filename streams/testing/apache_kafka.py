"""Apache Kafka on loopback: a KRaft broker (combined broker and controller) of the version the
Maven project beside this module pins, run as child processes of this one.

The jars come from Maven's default repository, fetched once into a cache outside the work
tree (``~/.cache/relay/kafka-<version>/``, or ``$RELAY_KAFKA_CACHE``); nothing is committed.
One node by default; ``nodes=3`` gives the cluster a fault suite needs (replication 3,
``min.insync.replicas`` 2, one log directory per node). Broker settings are Kafka's defaults,
as a user runs them, except what a cluster of that size needs (replication factors of the
internal topics) and, with ``for_tests``, ``group.initial.rebalance.delay.ms=0``.

A node's storage is formatted once per version into the cache (Kafka's ``StorageTool``), and
each new node starts from a copy with its own ``meta.properties``: formatting is a JVM start
of its own, a few seconds that every test session would otherwise pay.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import importlib.resources
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from streams.testing.loopback import (
    BrokerError,
    ChildProcess,
    cluster_view,
    free_loopback_ports,
)

log = logging.getLogger(__name__)

CACHE_ENV = "RELAY_KAFKA_CACHE"
JAVA_OPTS_ENV = "RELAY_KAFKA_JAVA_OPTS"
#: Kafka's start script's JVM settings, with a heap that grows as needed up to its 1 GiB.
JAVA_OPTS = ("-Xmx1g", "-Xms64m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
             "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
             "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")
_MARKER = ".complete"


def _maven_file(name: str) -> Path:
    return Path(str(importlib.resources.files("streams.testing").joinpath("maven", name)))


def kafka_version() -> str:
    """The Apache Kafka version the Maven project pins."""
    pom = _maven_file("pom.xml").read_text()
    found = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom)
    if found is None:
        raise BrokerError("the Maven project names no <kafka.version>")
    return found.group(1).strip()


def cache_dir() -> Path:
    """Where the jars and the formatted storage of this version live."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "relay" / f"kafka-{kafka_version()}"


def find_java() -> str:
    """The ``java`` to run the broker with: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise BrokerError("Apache Kafka needs Java 17 or newer: install a JDK or JRE (for "
                          "example `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME")
    return java


def find_maven() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError("fetching Apache Kafka's jars needs Maven: install it (for example "
                          "`apt-get install maven`), or point RELAY_KAFKA_CACHE at a cache "
                          "that holds them")
    return mvn


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One process at a time fills the cache (parallel test workers start together)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def kafka_jars() -> Path:
    """The directory of the broker's jars, fetched with Maven on first use."""
    cache = cache_dir()
    jars = cache / "jars"
    if (jars / _MARKER).exists():
        return jars
    with _locked(cache):
        if (jars / _MARKER).exists():
            return jars
        mvn = find_maven()
        version = kafka_version()
        print(f"relay: fetching Apache Kafka {version}'s jars with Maven into {jars} "
              "(once)", file=sys.stderr, flush=True)
        work = Path(tempfile.mkdtemp(prefix="fetch-", dir=cache))
        try:
            shutil.copy(_maven_file("pom.xml"), work / "pom.xml")
            fetched = work / "jars"
            result = subprocess.run(
                [mvn, "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
                 f"-DoutputDirectory={fetched}"],
                cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                stdin=subprocess.DEVNULL,
            )
            if result.returncode != 0 or not any(fetched.glob("kafka_2.13-*.jar")):
                raise BrokerError(f"Maven could not fetch Apache Kafka {version} (exit "
                                  f"{result.returncode}):\n{result.stdout[-3000:]}")
            (fetched / _MARKER).write_text(version + "\n")
            if jars.exists():
                shutil.rmtree(jars)
            fetched.rename(jars)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return jars


def _classpath(jars: Path) -> str:
    return str(jars / "*")


def _uuid_text() -> str:
    """A Kafka Uuid as Kafka prints it: 16 random bytes, URL-safe base64, no padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def formatted_storage(java: str, jars: Path) -> Path:
    """A node's storage as Kafka's StorageTool formats it for a static controller quorum,
    made once per version. It holds the metadata version and features, and no node or
    cluster id (those are in ``meta.properties``, written per node)."""
    cache = cache_dir()
    template = cache / "formatted"
    if (template / _MARKER).exists():
        return template
    with _locked(cache):
        if (template / _MARKER).exists():
            return template
        work = Path(tempfile.mkdtemp(prefix="format-", dir=cache))
        try:
            data = work / "data"
            config = work / "format.properties"
            port, controller_port = free_loopback_ports(2)
            config.write_text(_properties({
                "process.roles": "broker,controller", "node.id": "1",
                "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
                "controller.listener.names": "CONTROLLER",
                "listeners": f"PLAINTEXT://127.0.0.1:{port},"
                             f"CONTROLLER://127.0.0.1:{controller_port}",
                "log.dirs": str(data),
            }))
            result = subprocess.run(
                [java, "-cp", _classpath(jars), *_log_options(work / "format.log"),
                 "kafka.tools.StorageTool", "format", "-t", _uuid_text(), "-c", str(config)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                stdin=subprocess.DEVNULL,
            )
            if result.returncode != 0:
                raise BrokerError(f"Kafka's StorageTool could not format a log directory "
                                  f"(exit {result.returncode}):\n{result.stdout[-3000:]}")
            (data / "meta.properties").unlink()
            (data / _MARKER).write_text("\n")
            if template.exists():
                shutil.rmtree(template)
            data.rename(template)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return template


def class_archive(java: str, jars: Path) -> Path | None:
    """A class-data sharing archive of the classes a node loads to start (made once per JVM
    and version by starting a node and stopping it cleanly): it halves a JVM's start, which
    on a busy two-core machine is most of a node's start. None when it cannot be made; a
    node then starts without it."""
    real = Path(java).resolve()
    stat = real.stat()
    key = hashlib.sha1(f"{real}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    cache = cache_dir()
    archive = cache / f"classes-{key}.jsa"
    if archive.exists():
        return archive
    with _locked(cache):
        if archive.exists():
            return archive
        partial = archive.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        cluster = KafkaCluster(for_tests=True, use_class_archive=False,
                               java_options=(f"-XX:ArchiveClassesAtExit={partial}",))
        try:
            cluster.start()
            cluster.nodes[0].stop(timeout_s=60)  # the archive is written at a clean exit
        except BrokerError as exc:
            log.warning("no class archive for the broker's JVM (%s)", exc)
        finally:
            cluster.stop()
        if not partial.exists():
            return None
        partial.rename(archive)
    return archive


def _log_options(log_file: Path, level: str = "WARN") -> list[str]:
    return [f"-Dlog4j2.configurationFile={_maven_file('log4j2.properties')}",
            f"-Drelay.kafka.log={log_file}", f"-Drelay.kafka.log.level={level}"]


def _properties(settings: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in settings.items())


class KafkaNode:
    """One node of a cluster: a JVM running broker and controller, with its own ports and log
    directory. The directory outlives a restart of the node."""

    def __init__(self, node_id: int, host: str, port: int, controller_port: int,
                 work_dir: Path, settings: dict[str, str], java: str, jars: Path,
                 log_level: str, java_options: tuple[str, ...] = ()) -> None:
        self.node_id = node_id
        self.host = host
        self.port = port
        self.controller_port = controller_port
        self.work_dir = work_dir
        self.log_dir = work_dir / "data"
        self.log_path = work_dir / "server.log"
        self.settings = settings
        config = work_dir / "server.properties"
        extra = os.environ.get(JAVA_OPTS_ENV, "").split()
        command = [java, *JAVA_OPTS, *java_options, *extra, *_log_options(self.log_path, log_level),
                   "-cp", _classpath(jars), "kafka.Kafka", str(config)]
        # Its standard output (a JVM's own complaints) joins log4j's file.
        self._child = ChildProcess(f"Apache Kafka node {node_id}", command, self.log_path,
                                   cwd=work_dir)

    @property
    def bootstrap_server(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._child.pid

    @property
    def running(self) -> bool:
        return self._child.running

    def prepare(self, template: Path, cluster_id: str) -> None:
        """Its configuration, and its log directory from the formatted template."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "server.properties").write_text(_properties(self.settings))
        shutil.copytree(template, self.log_dir, ignore=shutil.ignore_patterns(_MARKER))
        (self.log_dir / "meta.properties").write_text(_properties({
            "version": "1", "node.id": str(self.node_id), "cluster.id": cluster_id,
            "directory.id": _uuid_text(),
        }))

    def spawn(self) -> None:
        self._child.spawn()

    def wait_ready(self, brokers: frozenset[int], timeout_s: float) -> None:
        """Wait until this node answers metadata listing every broker of ``brokers``."""

        def ready() -> bool:
            view = cluster_view(self.host, self.port)
            return view is not None and brokers <= view.brokers

        self._child.wait_ready(ready, timeout_s,
                               f"a metadata answer on {self.bootstrap_server} listing brokers "
                               f"{sorted(brokers)}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """A clean shutdown (SIGTERM: Kafka's controlled shutdown), killed after a timeout."""
        self._child.stop(timeout_s)

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self._child.kill()

    def pause(self) -> None:
        """SIGSTOP: the node stays connected but answers nothing, like a long GC pause."""
        self._child.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._child.signal(signal.SIGCONT)


class KafkaCluster:
    """Apache Kafka on loopback: ``nodes`` KRaft nodes in combined mode, each broker and
    controller, on free ports (``port`` fixes the first node's client port).

    Use it as a context manager, or call :meth:`start` and :meth:`stop`; :meth:`stop` kills
    the nodes and deletes their storage, so a cluster forgets everything when it stops.
    Single nodes can be stopped, killed, paused and started again through :attr:`nodes`.
    """

    def __init__(self, nodes: int = 1, port: int | None = None, host: str = "127.0.0.1",
                 for_tests: bool = False, settings: dict[str, str] | None = None,
                 startup_timeout_s: float = 120.0, log_level: str = "WARN",
                 java_options: tuple[str, ...] = (), use_class_archive: bool = True) -> None:
        self.name = f"Apache Kafka {kafka_version()}" + (f" ({nodes} nodes)" if nodes > 1 else "")
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, not {nodes}")
        self.host = host
        self.node_count = nodes
        self.port = port
        self.for_tests = for_tests
        self.extra_settings = dict(settings or {})
        self.startup_timeout_s = startup_timeout_s
        self.log_level = log_level
        self.java_options = java_options
        self.use_class_archive = use_class_archive
        self.cluster_id = _uuid_text()
        self.nodes: list[KafkaNode] = []
        self._work: Path | None = None

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.bootstrap_server for node in self.nodes)

    @property
    def running(self) -> bool:
        return bool(self.nodes) and all(node.running for node in self.nodes)

    @property
    def log_path(self) -> Path | None:
        return self.nodes[0].log_path if self.nodes else None

    def settings_for(self, node_id: int, ports: dict[int, tuple[int, int]]) -> dict[str, str]:
        """One node's server.properties."""
        port, controller_port = ports[node_id]
        replicas = str(min(self.node_count, 3))
        min_isr = "2" if self.node_count >= 3 else "1"
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(node_id),
            "controller.quorum.voters": ",".join(
                f"{n}@{self.host}:{c}" for n, (_, c) in sorted(ports.items())),
            "listeners": f"PLAINTEXT://{self.host}:{port},CONTROLLER://{self.host}:"
                         f"{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self._node_dir(node_id) / "data"),
            # Kafka's defaults are for three or more nodes; a smaller cluster cannot hold them.
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
        }
        if self.for_tests:
            settings["group.initial.rebalance.delay.ms"] = "0"
        settings.update(self.extra_settings)
        return settings

    def _node_dir(self, node_id: int) -> Path:
        assert self._work is not None
        return self._work / f"node-{node_id}"

    def start(self, wait: bool = True) -> KafkaCluster:
        """Start every node; with ``wait`` (the default) return once they all answer."""
        if self.nodes:
            return self
        java = find_java()
        jars = kafka_jars()
        template = formatted_storage(java, jars)
        options = list(self.java_options)
        archive = class_archive(java, jars) if self.use_class_archive else None
        if archive is not None:
            options.append(f"-XX:SharedArchiveFile={archive}")
        if self.for_tests:
            # Tests' brokers carry little load: the quick compiler alone starts a node faster
            # and spends less of a busy machine's CPU on compiling.
            options.append("-XX:TieredStopAtLevel=1")
        self._work = Path(tempfile.mkdtemp(prefix="relay-kafka-"))
        picked = free_loopback_ports(2 * self.node_count)
        if self.port is not None:
            picked[0] = self.port
        ids = range(1, self.node_count + 1)
        ports = {n: (picked[2 * i], picked[2 * i + 1]) for i, n in enumerate(ids)}
        self.nodes = [
            KafkaNode(n, self.host, ports[n][0], ports[n][1], self._node_dir(n),
                      self.settings_for(n, ports), java, jars, self.log_level, tuple(options))
            for n in ids
        ]
        log.info("starting Apache Kafka (%d node(s)) on %s", self.node_count,
                 self.bootstrap_servers)
        try:
            for node in self.nodes:
                node.prepare(template, self.cluster_id)
                node.spawn()
            if wait:
                self.wait_ready()
        except BaseException:
            self.stop(keep_files=True)  # the error names a node's log
            raise
        return self

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until every running node answers and sees every node as a broker."""
        everyone = frozenset(node.node_id for node in self.nodes)
        deadline = time.monotonic() + (timeout_s or self.startup_timeout_s)
        for node in self.nodes:
            node.wait_ready(everyone, max(1.0, deadline - time.monotonic()))

    def node(self, node_id: int) -> KafkaNode:
        """The node with Kafka's ``node.id`` ``node_id`` (as metadata names leaders)."""
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} in this cluster (nodes "
                       f"{[n.node_id for n in self.nodes]})")

    def restart(self, node: KafkaNode, timeout_s: float | None = None) -> None:
        """Start a stopped or killed node again on its ports and storage; wait until it is
        back in the cluster."""
        node.spawn()
        self.wait_ready(timeout_s)

    def stop(self, keep_files: bool = False) -> None:
        """Kill every node and delete the cluster's storage and logs."""
        nodes, self.nodes = self.nodes, []
        if nodes:
            with ThreadPoolExecutor(len(nodes)) as pool:
                list(pool.map(lambda n: n.kill(), nodes))
        if self._work is not None and not keep_files:
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
