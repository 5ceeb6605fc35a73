"""Time windows for windowed aggregations: tumbling and hopping, each with a grace period.

A windowed result is keyed by ``Windowed(key, start, end)``; a record later than its window's
end plus the grace period (by the task's stream time) is late and dropped, and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Windowed:
    """A key together with the window it was aggregated in, ``start <= t < end`` (ms)."""

    key: Any
    start: int
    end: int


@dataclass(frozen=True)
class HoppingWindows:
    """Windows of ``size_ms`` starting every ``advance_ms``; a record falls in
    ``size_ms / advance_ms`` of them. Records may arrive up to ``grace_ms`` late."""

    size_ms: int
    advance_ms: int
    grace_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise ValueError(f"window size_ms must be > 0, not {self.size_ms}")
        if not 0 < self.advance_ms <= self.size_ms:
            raise ValueError(
                f"window advance_ms must be in (0, size_ms={self.size_ms}], not {self.advance_ms}"
            )
        if self.grace_ms < 0:
            raise ValueError(f"window grace_ms must be >= 0, not {self.grace_ms}")

    def windows_for(self, timestamp_ms: int) -> list[tuple[int, int]]:
        """The (start, end) of every window that contains ``timestamp_ms``, oldest first."""
        last_start = timestamp_ms - timestamp_ms % self.advance_ms
        starts = []
        start = last_start
        while start > timestamp_ms - self.size_ms and start >= 0:
            starts.append(start)
            start -= self.advance_ms
        return [(s, s + self.size_ms) for s in reversed(starts)]

    @property
    def retention_ms(self) -> int:
        return self.size_ms + self.grace_ms


def TumblingWindows(size_ms: int, grace_ms: int = 0) -> HoppingWindows:
    """Back-to-back windows of ``size_ms``: each record falls in exactly one."""
    return HoppingWindows(size_ms=size_ms, advance_ms=size_ms, grace_ms=grace_ms)
