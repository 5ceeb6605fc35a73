"""``relay run``'s log shows the errors the Kafka client retries by itself as news (INFO) while
they heal and as warnings once they persist, and every other error as an error."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from streams.kafka import client_log


@pytest.fixture
def shown() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    root = logging.getLogger("test-client-log-root")
    root.propagate = False
    client = logging.getLogger("aiokafka")
    level = client.level
    client.setLevel(logging.INFO)  # relay run's default
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    root.handlers = [handler]
    client_log.install(root)
    client_log.install(root)  # once is enough
    assert len(handler.filters) == 1
    yield root, out
    client.setLevel(level)


def test_retried_errors_are_news_and_others_stay_errors(
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
        "INFO aiokafka.consumer.fetcher Failed fetch offsets from 1: [Error 6] "
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


def test_a_retried_error_that_keeps_coming_is_a_warning_until_it_heals() -> None:
    clock = [0.0]
    news = client_log.RetriedErrorsAsNews(clock=lambda: clock[0])

    def level_at(t: float) -> str:
        clock[0] = t
        record = logging.LogRecord(
            "aiokafka.consumer.group_coordinator", logging.WARNING, __file__, 1,
            "Marking the coordinator dead (node %s)for group %s.", (1, "g"), None)
        news.filter(record)
        return record.levelname

    assert [level_at(t) for t in (0, 10, 29.9, 30, 55)] == [
        "INFO", "INFO", "INFO", "WARNING", "WARNING"]
    # Quiet for over 30 s: healed, and the next one is news again.
    assert level_at(90) == "INFO"
