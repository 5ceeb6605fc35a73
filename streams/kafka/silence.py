"""How long this member went without running: a process stopped (SIGSTOP, a frozen VM, a
stalled host) for longer than its session sent nothing for that long, so as far as the group
goes its membership ended, whatever the broker answers next.

The member cannot count on the broker to say so: Apache Kafka expires it, and answers its next
request UNKNOWN_MEMBER_ID, but Tansu may keep a member frozen in a forming round in the group
and answer it as if nothing happened, while the round that follows hands its partitions to
others. So the member measures its own silence: the event loop's gap, from a watch that runs
often (:func:`watch_silence`) and from every group step that asks (:meth:`SilenceWatch.tick`).
A member that ran, even slowly, sent its heartbeats: its gaps stay far below its session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: How often the watch looks at the clock: well below any session timeout.
WATCH_INTERVAL_S = 0.5


@dataclass
class SilenceWatch:
    """The event loop's last sign of life, and the session it is held against."""

    session_s: float
    #: When (monotonic seconds) the loop last ran a tick (None: not yet).
    alive_at: float | None = None

    def tick(self, now: float) -> float | None:
        """The loop runs at ``now``: the gap since it last ran, when longer than the session
        (None otherwise)."""
        gap = None if self.alive_at is None else now - self.alive_at
        self.alive_at = now if self.alive_at is None else max(self.alive_at, now)
        return gap if gap is not None and gap > self.session_s else None

    def silent(self, now: float) -> bool:
        """Whether the loop has not run for longer than the session until ``now``: it was
        stopped, and resumes now, before its watch had a turn."""
        return self.alive_at is not None and now - self.alive_at > self.session_s


async def watch_silence(watch: SilenceWatch, on_silence: Callable[[float], None],
                        interval_s: float = WATCH_INTERVAL_S) -> None:
    """Tick ``watch`` every ``interval_s`` until cancelled; ``on_silence(gap)`` on a gap
    longer than the session."""
    watch.tick(time.monotonic())
    while True:
        await asyncio.sleep(interval_s)
        gap = watch.tick(time.monotonic())
        if gap is not None:
            try:
                on_silence(gap)
            except Exception:
                log.exception("handling a silence of %.1f s failed", gap)
