"""An app given no bootstrap servers still runs, on a broker of its own (the deprecated path), and
warns."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from streams.app import App
from streams.environment import UnreachableBrokerError, check_reachable
from streams.runtime.thread import ThreadState
from tests.broker.streams.harness import FAST_GROUP
from tests.conftest import wait_until


@pytest.mark.broker
async def test_without_bootstrap_servers_it_still_runs_on_a_broker_of_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    app = App("no-broker", state_dir=tmp_path / "state", **FAST_GROUP)
    app.topic("no-broker-in", partitions=1)
    app.topic("no-broker-out", partitions=1)
    app.stream("no-broker-in").to("no-broker-out")
    with (pytest.warns(DeprecationWarning, match="relay broker"),
          caplog.at_level(logging.WARNING, logger="streams.app")):
        task = asyncio.create_task(app.run_async())
        try:
            await wait_until(lambda: bool(app.threads) and all(
                t.state is ThreadState.RUNNING for t in app.threads), timeout_s=90,
                message="the app to run on its embedded broker")
            address = app.bootstrap_servers
            assert address is not None
        finally:
            app.stop()
            await asyncio.wait_for(task, 60)
    assert "started an embedded broker" in caplog.text and "deprecated" in caplog.text
    with pytest.raises(UnreachableBrokerError):  # stopped with the app
        await check_reachable(address, timeout_s=5)
