"""``relay run``'s log shows the errors the Kafka client retries by itself as warnings, and
every other error as an error."""

from __future__ import annotations

import io
import logging

import pytest

from streams.kafka import client_log


@pytest.fixture
def shown() -> tuple[logging.Logger, io.StringIO]:
    root = logging.getLogger("test-client-log-root")
    root.propagate = False
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    root.handlers = [handler]
    client_log.install(root)
    client_log.install(root)  # once is enough
    assert len(handler.filters) == 1
    return root, out


def test_retried_errors_are_warnings_and_others_stay_errors(
        shown: tuple[logging.Logger, io.StringIO]) -> None:
    root, out = shown
    record = logging.LogRecord(
        "aiokafka.consumer.fetcher", logging.ERROR, __file__, 1,
        "Failed fetch offsets from %s: %s", (1, "[Error 6] NotLeaderForPartitionError: tp"),
        None)
    root.handle(record)
    root.handle(logging.LogRecord(
        "aiokafka.consumer.group_coordinator", logging.ERROR, __file__, 1,
        "OffsetCommit failed for unauthorized topics %s", ({"t"},), None))
    root.handle(logging.LogRecord(
        "streams.app", logging.ERROR, __file__, 1, "NotLeaderForPartitionError: ours", (), None))
    assert out.getvalue().splitlines() == [
        "WARNING aiokafka.consumer.fetcher Failed fetch offsets from 1: [Error 6] "
        "NotLeaderForPartitionError: tp",
        "ERROR aiokafka.consumer.group_coordinator OffsetCommit failed for unauthorized topics "
        "{'t'}",
        "ERROR streams.app NotLeaderForPartitionError: ours"]


def test_a_retried_error_is_not_shown_where_warnings_are_not(
        shown: tuple[logging.Logger, io.StringIO]) -> None:
    root, out = shown
    coordinator = logging.getLogger("aiokafka.consumer.group_coordinator")
    level = coordinator.level
    coordinator.setLevel(logging.ERROR)  # relay run --log-level ERROR
    try:
        root.handle(logging.LogRecord(
            "aiokafka.consumer.group_coordinator", logging.ERROR, __file__, 1,
            "Group Coordinator Request failed: %s",
            ("[Error 15] GroupCoordinatorNotAvailableError",), None))
    finally:
        coordinator.setLevel(level)
    assert out.getvalue() == ""
