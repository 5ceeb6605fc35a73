"""Helpers for end-to-end tests: create topics, produce input, read outputs, run apps."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import IO, Any

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

import streams
from statestore.topics import TopicSpec, ensure_topics
from streams.app import App
from streams.group.status_topic import read_status
from tests.conftest import on_tansu, wait_until

ROOT = Path(__file__).resolve().parents[3]

#: Copies in these tests catch up within a second: a member holding only part of the group's
#: learners asks for their promotion after 3 s rather than the default 30 s.
FAST_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000,
              "commit_interval_ms": 200, "learner_batch_wait_ms": 3000}
#: Static membership holds on the embedded broker only with sessions of about 30 s or more.
STATIC = {"session_timeout_ms": 30_000, "heartbeat_interval_ms": 2_000}
#: Apache Kafka keeps a static member's place for the session whatever its length: half
#: Tansu's, so that tests waiting for an eviction wait half as long.
STATIC_KAFKA = {"session_timeout_ms": 15_000, "heartbeat_interval_ms": 1_500}
#: Apache Kafka deletes a record older than the topic's time retention (7 days by default) at
#: its next check (every 5 minutes, the first 30 s after it starts), the whole log at once: a
#: test's records with timestamps near 1970 vanish, inputs and outputs, whenever a check falls
#: in the test. :func:`produce` refuses timestamps older than this.
OLDEST_TIMESTAMP_AGE_MS = 6 * 24 * 3_600_000
#: A day ago, on a whole minute: a base for tests' record timestamps, recent for the broker's
#: retention and far enough back that offsets of hours from it are not in the future (Apache
#: Kafka 4 refuses timestamps more than an hour ahead).
BASE_MS = (int(time.time()) // 60 - 24 * 60) * 60_000


def static_group(bootstrap: str) -> dict[str, int]:
    """Session settings for static members on the broker at ``bootstrap``."""
    return STATIC if on_tansu(bootstrap) else STATIC_KAFKA


async def list_topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, [TopicSpec(t, n) for t, n in topics.items()])
    finally:
        await admin.close()


async def produce(
    bootstrap: str, topic: str, records: Iterable[tuple[Any, Any] | tuple[Any, Any, int]],
    raw: bool = False,
) -> None:
    """Write ``records`` (key, value[, timestamp in ms]) to ``topic``; a timestamp must be
    recent (see :data:`OLDEST_TIMESTAMP_AGE_MS`, and :data:`BASE_MS` for a base)."""
    oldest_ms = int(time.time() * 1000) - OLDEST_TIMESTAMP_AGE_MS
    records = list(records)
    stale = [r for r in records if len(r) > 2 and r[2] is not None and r[2] < oldest_ms]
    if stale:
        raise ValueError(
            f"{len(stale)} records for {topic} are timestamped before {oldest_ms} (e.g. "
            f"{stale[0][2]}): the broker's time retention would delete them, and what the app "
            f"wrote from them, at its next check; offset them from BASE_MS")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        await _send(producer, topic, records, raw)
    finally:
        await producer.stop()


async def _send(producer: AIOKafkaProducer, topic: str,
                records: Iterable[tuple[Any, Any] | tuple[Any, Any, int]],
                raw: bool = False) -> None:
    """Write ``records`` with a started producer and wait until the broker has them."""
    futures = []
    for record in records:
        key, value = record[0], record[1]
        timestamp = record[2] if len(record) > 2 else None
        if not raw:
            key = None if key is None else msgpack.packb(key)
            value = None if value is None else msgpack.packb(value)
        futures.append(await producer.send(topic, value=value, key=key, timestamp_ms=timestamp))
    await asyncio.gather(*futures)


async def read_all(
    bootstrap: str, topic: str, partitions: int, raw: bool = False
) -> list[Any]:
    """Every record of a topic as (key, value[, headers]) in per-partition order."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    out: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        idle = 0
        while idle < 3:
            batch = await consumer.getmany(timeout_ms=300)
            if not any(batch.values()):
                idle += 1
                continue
            idle = 0
            for records in batch.values():
                for r in records:
                    if raw:
                        out.append((r.key, r.value, dict(r.headers)))
                    else:
                        out.append((
                            None if r.key is None else msgpack.unpackb(r.key, raw=False),
                            None if r.value is None else msgpack.unpackb(r.value, raw=False),
                        ))
    finally:
        await consumer.stop()
    return out


async def read_committed(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    """Every committed record of a topic as (key, value), msgpack-decoded, in per-partition
    order: what a read_committed consumer sees, on the embedded broker too (the public
    reader, ``streams.read_committed``)."""
    if not on_tansu(bootstrap):
        return await _read_committed_natively(bootstrap, topic, partitions)
    return await streams.read_committed(bootstrap, topic, partitions=range(partitions))


async def _read_committed_natively(bootstrap: str, topic: str,
                                   partitions: int) -> list[Any]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                isolation_level="read_committed")
    await consumer.start()
    out: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        stable = await consumer.end_offsets(tps)  # read_committed: the last stable offsets
        while [tp for tp in tps if await consumer.position(tp) < stable[tp]]:
            batch = await consumer.getmany(timeout_ms=300)
            for records in batch.values():
                out += [(None if r.key is None else msgpack.unpackb(r.key, raw=False),
                         None if r.value is None else msgpack.unpackb(r.value, raw=False))
                        for r in records]
    finally:
        await consumer.stop()
    return out


def latest(records: list[tuple[Any, Any]]) -> dict[Any, Any]:
    result: dict[Any, Any] = {}
    for key, value in records:
        k = tuple(key) if isinstance(key, list) else key
        result[k] = value
    return result


@contextlib.asynccontextmanager
async def running(app: App) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(app.run_async())
    try:
        yield task
    finally:
        app.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 60)


def make_app(app_id: str, bootstrap: str, state_dir: Path, **settings: Any) -> App:
    merged = {**FAST_GROUP, **settings}
    return App(app_id, bootstrap_servers=bootstrap, state_dir=state_dir, **merged)


def counting_app(app_id: str, bootstrap: str, state_dir: Path, source: str, sink: str,
                 instance: str | None = None, stages: int = 1, **settings: Any) -> App:
    """The tests' workhorse: counts records per key into the store ``counts``; with
    ``stages=2`` behind a repartition topic (a stateless first stage, then the count)."""
    if instance is not None:
        settings = {**static_group(bootstrap), "group_instance_id": instance, **settings}
    app = make_app(app_id, bootstrap, state_dir, **settings)
    stream = app.stream(source)
    if stages == 2:
        stream = stream.select_key(lambda key, _value: key).repartition()
    stream.group_by_key().count(store="counts").to_stream().to(sink)
    return app


class Watch:
    """Samples what apps run and learn, in the background, so that a test can say afterwards
    which tasks an app ever ran or learned: as an async context manager, or with
    :meth:`start` and :meth:`stop` (which stops sampling)."""

    def __init__(self, *apps: App) -> None:
        self.apps: list[App] = []
        self.ran: dict[int, set[str]] = {}
        self.learned: dict[int, set[str]] = {}
        for app in apps:
            self.add(app)
        self._task: asyncio.Task[None] | None = None

    def add(self, app: App) -> None:
        self.apps.append(app)
        self.ran[id(app)] = set()
        self.learned[id(app)] = set()

    def sample(self) -> None:
        for app in self.apps:
            for thread in app.threads:
                self.ran[id(app)].update(thread.tasks)
                self.learned[id(app)].update(thread.learners)

    async def _sample(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(0.02)

    def start(self) -> Watch:
        self._task = asyncio.create_task(self._sample())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.sample()

    async def __aenter__(self) -> Watch:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def tasks_of(app: App) -> set[str]:
    return {t for thread in app.threads for t in thread.tasks}


def running_tasks(*apps: App) -> dict[str, list[str]]:
    return {
        f"{a.config.group_instance_id or id(a)}-{t.index}": sorted(t.tasks)
        for a in apps for t in a.threads
    }


class Traffic:
    """Produces keyed records in the background and remembers how many per key."""

    def __init__(self, bootstrap: str, topic: str, keys: int = 17) -> None:
        self.bootstrap, self.topic, self.keys = bootstrap, topic, keys
        self.produced: dict[str, int] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _batch(self, records: int) -> list[tuple[str, int]]:
        return [(f"k{i % self.keys}", i) for i in range(records)]

    def _count(self, batch: list[tuple[str, int]]) -> None:
        for key, _ in batch:
            self.produced[key] = self.produced.get(key, 0) + 1

    async def produce(self, records: int) -> None:
        """Produce ``records`` records now (before or besides the background traffic)."""
        batch = self._batch(records)
        await produce(self.bootstrap, self.topic, batch)
        self._count(batch)

    async def _run(self) -> None:
        # One producer for the whole run: a producer per batch spends most of a loaded
        # machine's time starting, and the input then comes in bursts with long gaps (an
        # exactly-once worker's transactions are then empty most of the time).
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5)
        await producer.start()
        try:
            while not self._stop.is_set():
                batch = self._batch(50)
                await _send(producer, self.topic, batch)
                self._count(batch)
                await asyncio.sleep(0.05)
        finally:
            await producer.stop()

    def start(self) -> None:
        """Start producing in the background (again, after :meth:`stop`)."""
        self._stop.clear()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task


async def counting_topics(bootstrap: str, app_id: str, records: int = 0,
                          partitions: int = 4) -> tuple[str, str, Traffic]:
    """The counting app's input (``partitions``) and output topics, and traffic for the
    input that has already produced ``records`` records."""
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: partitions, sink: 1})
    traffic = Traffic(bootstrap, source)
    if records:
        await traffic.produce(records)
    return source, sink, traffic


async def exact_counts(bootstrap: str, sink: str, produced: dict[str, int]) -> None:
    """Wait until the sink's latest count per key is what was produced; else say how many
    keys came out over and under, and by how much."""

    async def exact() -> bool:
        return latest(await read_all(bootstrap, sink, 1)) == produced

    try:
        await wait_until(exact, timeout_s=120, message="exact counts")
    except AssertionError:
        counted = latest(await read_all(bootstrap, sink, 1))
        over = {k: counted[k] - n for k, n in produced.items() if counted.get(k, 0) > n}
        under = {k: n - counted.get(k, 0) for k, n in produced.items() if counted.get(k, 0) < n}
        raise AssertionError(
            f"{len(over)} keys counted over (by {sum(over.values())} in all) and "
            f"{len(under)} under (by {sum(under.values())}) of {len(produced)}; e.g. over "
            f"{dict(list(over.items())[:5])}, under {dict(list(under.items())[:5])}"
        ) from None



async def published(bootstrap: str, app_id: str,
                    active: dict[str, int] | Callable[[], dict[str, int]]) -> None:
    """Wait until each member (``<instance>-thread-<n>``) published its status with this many
    active tasks: the tools read the status topic. ``active`` may be a function, asked again
    at each look, for members whose tasks may still move meanwhile."""
    wanted = active if callable(active) else lambda: active

    async def seen() -> bool:
        status = await read_status(bootstrap, app_id)
        return all(len(status.get(member, {}).get("active", [])) == count
                   for member, count in wanted().items())

    await wait_until(seen, timeout_s=30, message=f"the status of {sorted(wanted())}")


async def run_relay(*args: str, bootstrap: str | None = None) -> tuple[int, str]:
    """Run the ``relay`` tool in a subprocess; returns its exit code and output."""
    command = [sys.executable, "-m", "tools.cli", *args]
    if bootstrap is not None:
        command += ["--bootstrap", bootstrap]
    python_path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    process = await asyncio.create_subprocess_exec(
        *command, cwd=tempfile.gettempdir(), env={**os.environ, "PYTHONPATH": python_path},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode or 0, out.decode()


def spawn_worker(app_id: str, bootstrap: str, state_dir: Path, source: str, sink: str,
                 stages: int = 1, log: IO[bytes] | None = None, log_level: str | None = None,
                 **settings: object) -> subprocess.Popen[bytes]:
    """The counting app as a worker process of its own (so that it can be killed); with
    ``stages=2`` it counts behind a repartition topic. Its log goes to ``log`` when given."""
    return spawn_app("tests.broker.streams.apps.counting:app",
                     {"COUNTING_INPUT": source, "COUNTING_OUTPUT": sink,
                      "COUNTING_STAGES": str(stages)},
                     app_id, bootstrap, state_dir, log, log_level, **settings)


def spawn_app(target: str, app_env: dict[str, str], app_id: str, bootstrap: str,
              state_dir: Path, log: IO[bytes] | None = None, log_level: str | None = None,
              **settings: object) -> subprocess.Popen[bytes]:
    """The app ``module:attribute`` as a worker process, ``app_env`` telling it its topics,
    ``settings`` (over the tests' fast group settings) as RELAY_* variables."""
    python_path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    env = {**os.environ, "PYTHONPATH": python_path, **app_env,
           "RELAY_APPLICATION_ID": app_id,
           "RELAY_BOOTSTRAP_SERVERS": bootstrap, "RELAY_STATE_DIR": str(state_dir)}
    for key, value in {**FAST_GROUP, **settings}.items():
        env[f"RELAY_{key.upper()}"] = str(value)
    state_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "streams", "run", target,
         "--log-level", log_level or os.environ.get("TEST_WORKER_LOG_LEVEL", "WARNING")],
        cwd=state_dir.parent, env=env, stderr=log,
    )


def end_worker(worker: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """Stop a worker process a test started, if it still runs: SIGTERM, then SIGKILL."""
    if worker.poll() is None:
        worker.terminate()
        try:
            worker.wait(timeout_s)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


class Launched:
    """Apps run as tasks, worker processes and traffic a test started."""

    def __init__(self) -> None:
        self.runs: dict[int, tuple[App, asyncio.Task[None]]] = {}
        self.workers: list[subprocess.Popen[bytes]] = []
        self.traffic: list[Traffic] = []

    def app(self, app: App) -> asyncio.Task[None]:
        """Run ``app`` until it stops (or the test ends)."""
        task = asyncio.create_task(app.run_async())
        self.runs[id(app)] = (app, task)
        return task

    async def stop(self, app: App, timeout_s: float = 60) -> None:
        """Stop ``app`` and wait for it (its error, if any, is raised)."""
        app.stop()
        await asyncio.wait_for(self.runs[id(app)][1], timeout_s)

    def worker(self, app_id: str, bootstrap: str, state_dir: Path, source: str, sink: str,
               stages: int = 1, **settings: object) -> subprocess.Popen[bytes]:
        """The counting app in a worker process of its own (so that it can be killed)."""
        process = spawn_worker(app_id, bootstrap, state_dir, source, sink, stages, **settings)
        self.workers.append(process)
        return process

    def traffic_for(self, traffic: Traffic) -> Traffic:
        self.traffic.append(traffic)
        return traffic

    async def close(self) -> None:
        for traffic in self.traffic:
            await traffic.stop()
        for app, _ in self.runs.values():
            app.stop()
        for _, task in self.runs.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 60)
        for process in self.workers:
            if process.poll() is None:
                process.kill()
            process.wait()
