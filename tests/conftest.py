"""Shared fixtures: the embedded broker (one per test session, so one per xdist worker) and helpers
to wait on conditions.

Set RELAY_TEST_BOOTSTRAP to run the broker tests against another Kafka-protocol broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator

import pytest

from streams.testing.broker import EmbeddedBroker


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
        if item.nodeid.startswith("tests/pipeline/") or "snapshot_restore" in item.nodeid:
            _join_group(item, "spark")
        elif item.nodeid.startswith("tests/differential/"):
            # One Kafka Streams oracle (a JVM) for them all.
            _join_group(item, "kafka-streams-oracle")


def _join_group(item: pytest.Item, group: str) -> None:
    if item.nodeid.endswith(f"@{group}"):
        return
    nodeid = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)  # type: ignore[attr-defined]
    else:
        item._nodeid = nodeid


@contextlib.contextmanager
def broker_servers() -> Iterator[str]:
    """The bootstrap servers of RELAY_TEST_BOOTSTRAP, else of an embedded broker started for
    the block."""
    external = os.environ.get("RELAY_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    with EmbeddedBroker() as broker:
        yield broker.bootstrap_servers


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    with broker_servers() as servers:
        yield servers


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
    """Poll ``condition`` until it holds; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {message}")
        await asyncio.sleep(interval_s)
