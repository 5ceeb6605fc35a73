"""A worker whose state directory was written against another broker (the embedded one was
restarted with empty memory storage, say) must not run silently on that state: it discards
it with a warning and counts the new broker's records from scratch."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from streams.testing.broker import EmbeddedBroker
from tests.broker.streams.harness import (
    counting_app,
    create_topics,
    exact_counts,
    produce,
    read_all,
    running,
)

pytestmark = pytest.mark.broker

APP, SOURCE, SINK = "replaced", "replaced-in", "replaced-out"


async def count_on(bootstrap: str, state_dir: Path, records: list[tuple[str, int]],
                   expected: dict[str, int]) -> None:
    await create_topics(bootstrap, {SOURCE: 2, SINK: 1})
    app = counting_app(APP, bootstrap, state_dir, SOURCE, SINK)
    async with running(app):
        await produce(bootstrap, SOURCE, records)
        await exact_counts(bootstrap, SINK, expected)


@pytest.mark.asyncio
async def test_state_of_a_replaced_broker_is_discarded_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    keys = [f"k{i}" for i in range(10)]
    with EmbeddedBroker() as first:
        await count_on(first.bootstrap_servers, tmp_path,
                       [(k, 1) for k in keys for _ in range(30)], dict.fromkeys(keys, 30))
    with caplog.at_level(logging.WARNING), EmbeddedBroker() as second:
        # Fewer records than before: the old state's positions are past the new logs' ends.
        await count_on(second.bootstrap_servers, tmp_path,
                       [(k, 1) for k in keys for _ in range(10)], dict.fromkeys(keys, 10))
        assert len(await read_all(second.bootstrap_servers, SINK, 1)) == 100
    warnings = [r.getMessage() for r in caplog.records if "another cluster" in r.getMessage()]
    assert warnings, "no warning that the state belonged to another cluster"


