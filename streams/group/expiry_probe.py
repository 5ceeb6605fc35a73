"""The expiry probe: a member hears at once that the broker ended a silent peer's session.

A member that stops without leaving the group (a crash, a SIGKILL, a SIGSTOP) stays in it
until the broker has had no heartbeat from it for a session timeout. The broker then begins
a round, and on the classic protocol the other members hear of it only at their next
heartbeat, up to a heartbeat interval later: the round, and every task the silent member
ran, waits for that too.

The peers' status records tell when a peer went silent, and so when its session ends, to
within a heartbeat interval and a status interval: it sent its last heartbeat up to a
heartbeat interval before its last status record, or up to a status interval after it.
While that moment is near, the member sends a heartbeat of its own every
:data:`PROBE_EVERY_S`; the first one answered ``REBALANCE_IN_PROGRESS`` sounds the round alarm
(:mod:`streams.group.round_alarm`), which puts every member in the round at once. Nothing
changes on the broker: the probes are the member's own heartbeats, only more of them for a
few seconds, and only while a peer is silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from aiokafka.errors import RebalanceInProgressError

log = logging.getLogger(__name__)

#: How often a member sends its heartbeat while a silent peer's session may end.
PROBE_EVERY_S = 0.1
#: How often a running member publishes its status record.
STATUS_EVERY_MS = 1_000
#: How late after its due time a broker may still end a session (its timers run late under
#: load); the member's own heartbeats take over after that.
LATE_EXPIRY_MS = 1_500
#: A broker's answer to a heartbeat when its group has begun a round (``REBALANCE_IN_PROGRESS``),
#: as the driver names it.
ROUND_BEGUN = RebalanceInProgressError.__name__


def session_may_end(silent_for_ms: int, session_timeout_ms: int,
                    heartbeat_interval_ms: int) -> bool:
    """Whether the session of a peer silent (no status record) for ``silent_for_ms`` may end
    about now: its last heartbeat came between a heartbeat interval before its last status
    record and a status interval after it, and the broker ends the session a session timeout
    after that heartbeat, or a little later."""
    earliest = session_timeout_ms - heartbeat_interval_ms
    latest = session_timeout_ms + STATUS_EVERY_MS + LATE_EXPIRY_MS
    return earliest <= silent_for_ms <= latest


def ending_sessions(silences: Mapping[str, int], session_timeout_ms: int,
                    heartbeat_interval_ms: int) -> list[str]:
    """The peers (of ``silences``: peer -> how long it has been silent, in ms) whose sessions
    may end about now."""
    return sorted(peer for peer, silent_for in silences.items()
                  if session_may_end(silent_for, session_timeout_ms, heartbeat_interval_ms))


class ProbedMember(Protocol):
    """The member's consumer, as the probe sees it."""

    @property
    def generation(self) -> int: ...

    @property
    def rebalancing(self) -> bool: ...

    async def heartbeat(self) -> str | None:
        """One heartbeat of the member's own; the broker's error name, None if none."""
        ...


class ExpiryProbe:
    """A thread's probe: :meth:`check` (at least every second, by the thread's housekeeping)
    starts probing in the background while a peer's session may end."""

    def __init__(self, name: str, member: ProbedMember, silences: Callable[[], dict[str, int]],
                 session_timeout_ms: int, heartbeat_interval_ms: int,
                 round_heard: Callable[[int], None],
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 every_s: float = PROBE_EVERY_S) -> None:
        self.name = name
        self.member = member
        #: The other members -> how long each has published no status record (ms).
        self.silences = silences
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        #: Told the generation whose round a probe heard of (the round alarm).
        self.round_heard = round_heard
        self._sleep = sleep
        self.every_s = every_s
        self._probing: asyncio.Task[None] | None = None
        #: The peers whose sessions may end now -> the member's generation when they came to
        #: that point.
        self._since: dict[str, int] = {}
        #: Rounds the probe heard of first (a metric for tests and logs).
        self.rounds_heard = 0

    def ending(self) -> list[str]:
        """The peers whose sessions may end now, but for those the group has had a round
        since they came to that point: a round that began after a peer went silent ends
        only once the peer rejoined or the broker removed it, so its end is heard already
        (probing again would only repeat its heartbeats until the window passed)."""
        peers = ending_sessions(self.silences(), self.session_timeout_ms,
                                self.heartbeat_interval_ms)
        generation = self.member.generation
        self._since = {peer: self._since.get(peer, generation) for peer in peers}
        return [peer for peer in peers if self._since[peer] >= generation]

    def _should_probe(self) -> bool:
        return self.member.generation >= 0 and not self.member.rebalancing

    def check(self) -> bool:
        """Start probing if a peer's session may end now and the member is in a formed
        group; whether it started."""
        if self._probing is not None and not self._probing.done():
            return False
        if not self._should_probe():
            return False
        peers = self.ending()
        if not peers:
            return False
        log.info("%s: the session of %s may end now: probing the group", self.name,
                 ", ".join(peers))
        self._probing = asyncio.create_task(self.probe(), name=f"expiry-probe-{self.name}")
        return True

    async def probe(self) -> None:
        """Heartbeat every :attr:`every_s` until the round is heard, the member joins one, or
        no peer's session may end any more. A failure ends the probing (the member's own
        heartbeats go on): it is logged, never raised."""
        try:
            await self._probe()
        except Exception as exc:
            log.warning("%s: probing the group failed (%s: %s); its heartbeats tell the "
                        "round", self.name, type(exc).__name__, exc)

    async def _probe(self) -> None:
        probes = 0
        answers: set[str] = set()
        while self._should_probe() and self.ending():
            generation = self.member.generation
            started = time.monotonic()
            answer = await self.member.heartbeat()
            probes += 1
            if answer == ROUND_BEGUN and self.member.generation == generation:
                self.rounds_heard += 1
                log.info("%s: its group began a round after generation %d (a silent "
                         "member's session ended), heard by probe %d", self.name, generation,
                         probes)
                self.round_heard(generation)
                return
            answers.add(answer or "none")
            await self._sleep(max(0.0, self.every_s - (time.monotonic() - started)))
        log.info("%s: probing ended after %d heartbeat(s) (answers: %s; %s)", self.name, probes,
                 ", ".join(sorted(answers)) or "none",
                 "joining a round" if self.member.rebalancing else "no session ending now")

    async def close(self) -> None:
        if self._probing is not None:
            self._probing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._probing
