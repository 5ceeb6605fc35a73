"""Fixtures of the stream tests: what a test starts (apps, worker processes, traffic) is
stopped when it ends, whether it passed or failed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.broker.streams.harness import Launched


@pytest.fixture
async def launched() -> AsyncIterator[Launched]:
    started = Launched()
    try:
        yield started
    finally:
        await started.close()
