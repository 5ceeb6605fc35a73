"""The stream unit tests drive real threads over fake clients: the runtime's polls of its own
state (a round's reports, a formed group) look every millisecond here,
so that a test waits on what it checks, never on a poll interval."""

from __future__ import annotations

import pytest

from streams.quirks import formed_group, hooks

#: A poll interval under the unit tier's sleep limit (tests/unit/conftest.py).
QUICK_POLL_S = 0.001


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "ROUND_CHECK_INTERVAL_S", QUICK_POLL_S)
    monkeypatch.setattr(formed_group, "POLL_S", QUICK_POLL_S)
