"""The README's word-count app on the real runtime and broker gives what the topology test
driver gives for the same input: the app creates its declared source topic, words go through
repartition topics, and windowed counts reach a topic with their default key serde.

The DSL, windows, joins and serdes themselves are tested on the driver (test_dsl.py); this
test is what only the runtime can show.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from streams.testing import TopologyTestDriver
from tests.broker.streams.harness import FAST_GROUP, create_topics, latest, read_all, running
from tests.conftest import wait_until
from tests.unit.streams.test_readme import block_named

pytestmark = pytest.mark.broker

#: An hour ago, on a whole minute: records older than a broker's time retention (7 days on
#: Apache Kafka) would leave the topics at its next check.
BASE_MS = (int(time.time()) // 60 - 60) * 60_000
LINES = [
    ("the cat and the hat", BASE_MS + 1_000),
    ("the end", BASE_MS + 61_000),
    ("a cat", BASE_MS + 62_000),
    ("late the", BASE_MS + 2_000),  # in grace: the first minute takes records until 65 s
]


def readme_app(prefix: str, monkeypatch: pytest.MonkeyPatch, **env: Any) -> Any:
    """The README's wordcount.py, with its names prefixed so that runs never share topics."""
    code = block_named("wordcount.py")
    for name in ('"word-counts"', '"lines"', '"word-totals"', '"words-per-minute"'):
        code = code.replace(name, f'"{prefix}-{name[1:]}')
    for key, value in env.items():
        monkeypatch.setenv(f"RELAY_{key.upper()}", str(value))
    namespace: dict[str, Any] = {}
    exec(compile(code, "wordcount.py", "exec"), namespace)
    return namespace["app"]


@pytest.mark.tansu
async def test_the_readme_word_count_on_the_runtime_equals_the_driver(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefix = unique("wc")
    with TopologyTestDriver(readme_app(prefix, monkeypatch)) as driver:
        for text, timestamp in LINES:
            driver.pipe(f"{prefix}-lines", None, text, timestamp_ms=timestamp)
        expected_totals = driver.read_key_value_map(f"{prefix}-word-totals")
        expected_windows = {
            (w.key, w.start, w.end): n for w, n in driver.read_key_value_map(
                f"{prefix}-words-per-minute", key_serde="windowed").items()}
    # The late line was within grace.
    assert expected_windows[("the", BASE_MS, BASE_MS + 60_000)] == 3

    # Sink topics are not the app's to create; its declared source topic is.
    totals, windows = f"{prefix}-word-totals", f"{prefix}-words-per-minute"
    await create_topics(bootstrap, {totals: 1, windows: 1})
    app = readme_app(prefix, monkeypatch, bootstrap_servers=bootstrap, state_dir=tmp_path,
                     **FAST_GROUP)
    async with running(app) as run:
        async def lines_created() -> bool:
            if run.done():
                run.result()  # the app failed: its error, not a timeout
            return bool(app.threads) and all(t.tasks for t in app.threads)

        await wait_until(lines_created, timeout_s=90, message="the app to create lines and run")
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for text, timestamp in LINES:
                await producer.send_and_wait(f"{prefix}-lines", text.encode(),
                                             timestamp_ms=timestamp)
        finally:
            await producer.stop()

        async def counted() -> bool:
            return latest(await read_all(bootstrap, totals, 1)) == expected_totals

        await wait_until(counted, timeout_s=90, message="the word totals")

        async def windowed() -> bool:
            return latest(await read_all(bootstrap, windows, 1)) == expected_windows

        await wait_until(windowed, timeout_s=30, message="the windowed counts")
