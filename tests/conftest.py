"""Shared fixtures: the brokers the broker tests run on, and helpers to wait on conditions.

Broker tests run on Apache Kafka (``RELAY_TEST_ENGINE=kafka``, the default): one single-node
KRaft broker for the whole run, started by the xdist controller while the workers collect
(or by the session itself without xdist), its address passed to the workers in
``RELAY_TEST_KAFKA`` (``RELAY_TEST_KAFKA_PER_WORKER=1``: one per worker instead, each
started on first use). Tests marked ``tansu`` (the smoke set on the demo's path) run on the
embedded Tansu broker too, one per worker (it starts in a fraction of a second).
``RELAY_TEST_ENGINE=tansu`` runs every broker test on Tansu instead, and
``RELAY_TEST_BOOTSTRAP`` on another Kafka-protocol broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from streams.testing.engines import ENGINES, LoopbackBroker, broker_for
from streams.testing.loopback import BrokerError, cluster_view

ENGINE_ENV = "RELAY_TEST_ENGINE"
SHARED_KAFKA_ENV = "RELAY_TEST_KAFKA"
EXTERNAL_ENV = "RELAY_TEST_BOOTSTRAP"
PER_WORKER_ENV = "RELAY_TEST_KAFKA_PER_WORKER"
#: Tests that start no broker (tests/unit/conftest.py): a run of only those starts none.
UNIT_TIER = Path(__file__).resolve().parent / "unit"
#: The broker a run's shared Kafka was started for (the xdist controller's).
_shared_kafka: LoopbackBroker | None = None
#: Brokers this process started, by engine: stopped when the session ends.
_started: dict[str, LoopbackBroker] = {}

#: The suite's tiers of examples: ``make test`` tries a third of a long simulation's cases,
#: ``make test-fast`` (RELAY_TEST_FAST) a fifth, ``make test-long`` (RELAY_TEST_LONG) all.
FAST_ENV = "RELAY_TEST_FAST"
LONG_ENV = "RELAY_TEST_LONG"

# No deadline on a hypothesis example: how long one takes says how busy the machine is, and a
# test asserts no timing (a test that sets its own deadline keeps it). Hypothesis' default of
# 100 examples holds in `make test`; `make test-fast` tries 20, `make test-long` 500.
settings.register_profile("relay", deadline=None)
settings.register_profile("relay-fast", deadline=None, max_examples=20)
settings.register_profile("relay-long", deadline=None, max_examples=500)
settings.load_profile("relay-long" if os.environ.get(LONG_ENV)
                      else "relay-fast" if os.environ.get(FAST_ENV) else "relay")


def examples(full: int) -> int:
    """How many cases a long simulation tries out of ``full``: all of them in ``make
    test-long`` (RELAY_TEST_LONG), a third in ``make test``, a fifth in ``make test-fast``
    (RELAY_TEST_FAST). Each case is seeded, so a smaller run is the first part of the full
    one, never a different draw."""
    if os.environ.get(LONG_ENV):
        return full
    return max(10, full // 5) if os.environ.get(FAST_ENV) else max(10, full // 3)


def default_engine() -> str:
    engine = os.environ.get(ENGINE_ENV, "kafka")
    if engine not in ENGINES:
        raise pytest.UsageError(f"{ENGINE_ENV}={engine}: use one of {', '.join(ENGINES)}")
    return engine


def _starts_shared_kafka(config: pytest.Config) -> bool:
    """Whether this is an xdist controller whose workers will want Apache Kafka."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return False
    if os.environ.get(EXTERNAL_ENV) or os.environ.get(SHARED_KAFKA_ENV):
        return False
    if os.environ.get(PER_WORKER_ENV):  # each worker starts its own, on first use
        return False
    if config.args and all(_in_unit_tier(arg) for arg in config.args):
        return False
    marks = getattr(config.option, "markexpr", "") or ""
    return default_engine() == "kafka" and "not broker" not in marks


def _in_unit_tier(arg: str) -> bool:
    path = Path(arg.split("::")[0]).resolve()
    return path == UNIT_TIER or UNIT_TIER in path.parents


def pytest_configure(config: pytest.Config) -> None:
    """The xdist controller starts the run's Kafka before its workers exist: they inherit its
    address and wait for it to answer, so the JVM starts while they collect."""
    global _shared_kafka
    if _starts_shared_kafka(config):
        _shared_kafka = broker_for("kafka", for_tests=True)
        try:
            _shared_kafka.start(wait=False)  # type: ignore[call-arg]
        except BrokerError as exc:
            raise pytest.UsageError(f"the broker tests run on Apache Kafka: {exc}") from None
        os.environ[SHARED_KAFKA_ENV] = _shared_kafka.bootstrap_servers


def pytest_unconfigure(config: pytest.Config) -> None:
    global _shared_kafka
    if _shared_kafka is not None:
        _shared_kafka.stop()
        _shared_kafka = None
        os.environ.pop(SHARED_KAFKA_ENV, None)
    for broker in _started.values():
        broker.stop()
    _started.clear()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A broker test marked ``tansu`` runs on Tansu as well as on the run's engine."""
    if "broker_engine" not in metafunc.fixturenames:
        return
    if metafunc.definition.get_closest_marker("tansu") is None:
        return
    engines = sorted({default_engine(), "tansu"}, key=ENGINES.index)
    if len(engines) > 1 and not os.environ.get(EXTERNAL_ENV):
        metafunc.parametrize("broker_engine", engines, indirect=True, scope="session")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` the Spark tests share one worker: one local
    Spark session (a JVM of its own) per worker would crowd a small machine. So do the
    differential tests, for their Kafka Streams oracle.

    xdist groups a test by appending ``@<group>`` to its node id, in a hook of its own that
    reads ``xdist_group`` marks. Done here instead, after it: pytest 9 builds node ids from
    a structured id that xdist 3.8 does not rename, and the group would be lost."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        if item.nodeid.startswith(SPARK_CLI_TESTS) and "spark" not in item.fixturenames:
            # The CLI's checks that never start Spark need not wait behind the shared
            # session's worker, the suite's longest chain.
            continue
        if item.nodeid.startswith("tests/broker/pipeline/") or "snapshot_restore" in item.nodeid:
            _join_group(item, "spark")
        elif item.nodeid.startswith("tests/broker/differential/"):
            # One Kafka Streams oracle (a JVM) for them all.
            _join_group(item, "kafka-streams-oracle")


#: Tests of the snapshot CLI: its builds run in-process on the shared session, its checks of
#: bad arguments in a process of their own.
SPARK_CLI_TESTS = "tests/broker/pipeline/test_cli.py"


def _join_group(item: pytest.Item, group: str) -> None:
    if item.nodeid.endswith(f"@{group}"):
        return
    nodeid = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)  # type: ignore[attr-defined]
    else:
        item._nodeid = nodeid


def session_broker(engine: str) -> str:
    """The bootstrap servers of this run's broker of ``engine``: RELAY_TEST_BOOTSTRAP, the
    controller's shared Kafka, or one this process starts on first use."""
    external = os.environ.get(EXTERNAL_ENV)
    if external:
        return external
    shared = os.environ.get(SHARED_KAFKA_ENV)
    if engine == "kafka" and shared:
        _wait_answers(shared)
        return shared
    if engine not in _started:
        _started[engine] = broker_for(engine, for_tests=True).start()
    return _started[engine].bootstrap_servers


def _wait_answers(servers: str, timeout_s: float = 180.0) -> None:
    host, _, port = servers.split(",")[0].rpartition(":")
    deadline = time.monotonic() + timeout_s
    while cluster_view(host, int(port)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the tests' Kafka at {servers} did not answer within "
                               f"{timeout_s:.0f}s")
        time.sleep(0.1)


@contextlib.contextmanager
def broker_servers(engine: str) -> Iterator[str]:
    """A broker for one module or test of its own: RELAY_TEST_BOOTSTRAP when set, else a
    fresh one of ``engine`` started for the block."""
    external = os.environ.get(EXTERNAL_ENV)
    if external:
        yield external
        return
    with broker_for(engine, for_tests=True) as broker:
        yield broker.bootstrap_servers


@pytest.fixture(scope="session")
def broker_engine(request: pytest.FixtureRequest) -> str:
    """The engine of the broker a test runs on: its parameter when it runs on several."""
    return str(getattr(request, "param", default_engine()))


@pytest.fixture(scope="session")
def bootstrap(broker_engine: str) -> str:
    return session_broker(broker_engine)


def on_tansu(bootstrap: str) -> bool:
    """Whether the broker at ``bootstrap`` is Tansu (as Relay tells it: by its cluster id)."""
    return _cluster_id(bootstrap).lower().startswith("tansu")


@functools.cache
def _cluster_id(bootstrap: str) -> str:
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    view = cluster_view(host, int(port), timeout_s=5.0)
    return (view.cluster_id if view is not None else None) or ""


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Unique names, so tests sharing the session broker never see each other's topics."""

    def make(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    return make


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    timeout_s: float = 60.0,
    interval_s: float = 0.1,
    message: str = "condition",
) -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout_s``. The first looks
    come a millisecond apart, then twice as far apart each time up to ``interval_s``: a
    condition that holds soon is seen at once, without sleeping for real."""
    deadline = time.monotonic() + timeout_s
    pause_s = min(0.001, interval_s)
    while True:
        result = condition()
        if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {message}")
        await asyncio.sleep(pause_s)
        pause_s = min(pause_s * 2, interval_s)
