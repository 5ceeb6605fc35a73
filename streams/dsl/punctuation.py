"""Punctuation: callbacks a custom processor schedules with ``context.schedule(interval_ms,
PunctuationType.STREAM_TIME or WALL_CLOCK_TIME, callback)``, one set per task.

Kafka Streams' semantics (PunctuationQueue, PunctuationSchedule):

- stream time: the first punctuation is due at 0, so it fires with the first record; then
  every ``interval_ms`` of stream time, aligned to multiples of the interval. Stream time
  that jumps over several intervals fires once, not once per interval missed. Unlike Kafka
  Streams, the next due time travels with the task's state (its stores' input position), so
  a restarted or moved task never fires twice for one interval;
- wall-clock time: first due ``interval_ms`` after the schedule, then every ``interval_ms``;
  fired from the stream thread's loop (``StreamTask.punctuate``), also while no records come.

The callback gets the time it fires at (stream time or wall-clock ms); records it forwards
carry that time as their timestamp.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streams.dsl.processors import ProcessorContext

log = logging.getLogger(__name__)

#: Entries of a store's input position that hold a schedule's next due stream time.
POSITION_PREFIX = "punctuation/"


class PunctuationType(enum.Enum):
    STREAM_TIME = "stream-time"
    WALL_CLOCK_TIME = "wall-clock-time"


class PunctuationError(RuntimeError):
    """A punctuation callback raised: the task cannot go on (as in Kafka Streams)."""


@dataclass
class Schedule:
    """One scheduled punctuation; ``cancel()`` stops it."""

    key: str
    interval_ms: int
    type: PunctuationType
    callback: Callable[[int], None]
    next_ms: int
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True

    def advance(self, now_ms: int) -> None:
        """The next due time after firing at ``now_ms``: one interval on, or past ``now_ms``
        when intervals were missed (never a burst of catch-up punctuations)."""
        following = self.next_ms + self.interval_ms
        if now_ms >= following:
            missed = (now_ms - self.next_ms) // self.interval_ms
            following = self.next_ms + (missed + 1) * self.interval_ms
        self.next_ms = following


@dataclass
class Punctuations:
    """A task's schedules, and the next due stream times restored with its state."""

    schedules: list[Schedule] = field(default_factory=list)
    restored: dict[str, int] = field(default_factory=dict)

    def add(self, node: str, interval_ms: int, type_: PunctuationType,
            callback: Callable[[int], None], wall_clock_ms: int) -> Schedule:
        if interval_ms < 1:
            raise ValueError(f"a punctuation interval must be >= 1 ms, not {interval_ms}")
        if not isinstance(type_, PunctuationType):
            raise ValueError(f"a punctuation type is a PunctuationType, not {type_!r}")
        ordinal = sum(1 for s in self.schedules if s.key.startswith(f"{node}/"))
        key = f"{node}/{ordinal}"
        if type_ is PunctuationType.STREAM_TIME:
            first = self.restored.get(key, 0)
        else:
            first = wall_clock_ms + interval_ms
        schedule = Schedule(key, interval_ms, type_, callback, first)
        self.schedules.append(schedule)
        return schedule

    def fire(self, ctx: ProcessorContext, type_: PunctuationType, now_ms: int) -> int:
        """Fire the due schedules of ``type_``; returns how many fired."""
        fired = 0
        previous = ctx.timestamp_ms
        try:
            for schedule in list(self.schedules):
                if schedule.cancelled or schedule.type is not type_ or now_ms < schedule.next_ms:
                    continue
                ctx.timestamp_ms = now_ms
                try:
                    schedule.callback(now_ms)
                except Exception as exc:
                    raise PunctuationError(
                        f"task {ctx.task_id}: punctuation {schedule.key} failed: "
                        f"{type(exc).__name__}: {exc}") from exc
                schedule.advance(now_ms)
                fired += 1
        finally:
            ctx.timestamp_ms = previous
        self.schedules = [s for s in self.schedules if not s.cancelled]
        return fired

    def positions(self) -> dict[str, int]:
        """The next due stream time of each stream-time schedule, for the input position."""
        due = dict(self.restored)
        due.update({s.key: s.next_ms for s in self.schedules
                    if s.type is PunctuationType.STREAM_TIME})
        return {POSITION_PREFIX + key: next_ms for key, next_ms in due.items()}
