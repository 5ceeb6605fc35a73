"""The Kafka client's log as ``relay run`` shows it: the errors aiokafka retries by itself
(a partition whose leader is being elected, a group coordinator not found yet or loading)
are warnings, not errors. A fresh app meets them while its internal topics elect their
leaders, and an ERROR line that heals a second later trips an operator's alerting."""

from __future__ import annotations

import logging

#: aiokafka's names of errors it retries by itself.
RETRIED_BY_THE_CLIENT = (
    "NotLeaderForPartitionError", "LeaderNotAvailableError",
    "GroupCoordinatorNotAvailableError", "NotCoordinatorForGroupError",
    "CoordinatorLoadInProgressError",
)


class RetriedErrorsAsWarnings(logging.Filter):
    """A handler filter that logs the client's retried errors at WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.levelno == logging.ERROR and record.name.startswith("aiokafka.")
                and any(name in record.getMessage() for name in RETRIED_BY_THE_CLIENT)):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            # The logger let it through as an error; as a warning it must pass its level too.
            return logging.getLogger(record.name).isEnabledFor(logging.WARNING)
        return True


def install(root: logging.Logger | None = None) -> None:
    """Put the filter on every handler of ``root`` (the root logger by default)."""
    for handler in (root or logging.getLogger()).handlers:
        if not any(isinstance(f, RetriedErrorsAsWarnings) for f in handler.filters):
            handler.addFilter(RetriedErrorsAsWarnings())
