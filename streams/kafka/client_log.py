"""The Kafka client's log as ``relay run`` shows it: the errors aiokafka retries by itself
(a partition whose leader is being elected, a group coordinator not found yet, loading or
moved) are news while they heal, not alarms. A fresh app meets a score of them while its
internal topics elect their leaders, and a line at ERROR or WARNING that heals a second later
trips an operator's alerting and worries a newcomer. So they are shown at INFO, and at
WARNING only once the same kind has kept coming for :data:`PERSISTS_S`: then it is not
healing."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

#: aiokafka's names of errors it retries by itself, and its line when it looks for the group
#: coordinator again.
RETRIED_BY_THE_CLIENT = (
    "NotLeaderForPartitionError", "LeaderNotAvailableError",
    "GroupCoordinatorNotAvailableError", "NotCoordinatorForGroupError",
    "CoordinatorLoadInProgressError", "Marking the coordinator dead",
)
#: A kind of retried error that keeps coming this long (seconds) is shown as a warning.
PERSISTS_S = 30.0
#: A kind not seen for this long has healed: the next one starts its count again.
HEALED_AFTER_S = 30.0


class RetriedErrorsAsNews(logging.Filter):
    """A handler filter that shows the client's retried errors at INFO while they heal, and at
    WARNING once one kind has kept coming for :data:`PERSISTS_S`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        #: Per kind: since when it keeps coming, and when it came last.
        self._seen: dict[str, tuple[float, float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith("aiokafka."):
            return True
        message = record.getMessage()
        kind = next((name for name in RETRIED_BY_THE_CLIENT if name in message), None)
        if kind is None:
            return True
        now = self._clock()
        since, last = self._seen.get(kind, (now, now))
        if now - last > HEALED_AFTER_S:
            since = now
        self._seen[kind] = (since, now)
        level = logging.WARNING if now - since >= PERSISTS_S else logging.INFO
        record.levelno, record.levelname = level, logging.getLevelName(level)
        # The logger let it through at its own level: at this one it must pass the level too.
        return logging.getLogger(record.name).isEnabledFor(level)


def install(root: logging.Logger | None = None) -> None:
    """Put the filter on every handler of ``root`` (the root logger by default)."""
    for handler in (root or logging.getLogger()).handlers:
        if not any(isinstance(f, RetriedErrorsAsNews) for f in handler.filters):
            handler.addFilter(RetriedErrorsAsNews())
