"""The group's learners as the members' status records tell: which are still catching up,
and when each last got closer.

A member holding ready learners asks for the round that promotes them once every learner of
the group is ready, or once the rest have stopped getting closer (the ``batched`` policy of
:mod:`streams.group.learner_readiness`). It knows its own learners; the others' it reads from their
status records, which every member publishes each second with the lag of each learner it is
still learning (``learning``). :class:`GroupLearning` folds those records in (pure: clocks are
passed in or given at construction) and answers, for a member of a given round, the other
members' learners that are not ready and when each last reached a new low: a lag that
merely goes down and up again (a copy that cannot keep up with its task's input) sets no
new low, so it does not hold a batch back for long.

The answer is None, and the member falls back to waiting a fixed time, when it cannot know
every member's learners: fewer fresh records of its round than the round had members (a
member that has not published since the round, a crashed one, one too old to publish
``learning``).

The same records tell how long each member has been silent (:meth:`GroupLearning.silences`):
a member whose session is about to end is watched for the round its end begins
(:mod:`streams.group.expiry_probe`), and a broker that keeps a member silent for longer than
a session timeout (:func:`past_session`) in its rounds is told to remove it
(:mod:`streams.group.join_watch`).

The app follows the status topic only once a member first asks: a cooperative member's
expiry probe asks as its thread starts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from streams.group.member_id import parse_member_id

log = logging.getLogger(__name__)

#: A status record older than this says nothing of its member now (records come each second).
FRESH_WITHIN_MS = 5_000
#: A member whose latest status record is this old has missed three publications: it is
#: frozen (a pause, a stopped process) or gone.
SILENT_AFTER_MS = 3_000
#: A member silent this many session timeouts is long gone: any broker has ended its
#: session, so it is no longer looked for in the group.
GONE_AFTER_SESSIONS = 3


@dataclass(frozen=True)
class MemberLearning:
    """One member's learners as its last status record gave them."""

    generation: int
    updated_ms: int
    acceptable_lag: int
    #: Learners it is still learning (not the ones its last round promoted) -> lag.
    lags: Mapping[str, int]
    #: Whether it led the group's last round it took part in.
    leader: bool = False
    #: Whether it was in a round (from joining it to its assignment applied, or its tasks
    #: revoked or lost until then).
    in_round: bool = False
    #: The shortest join round it measured lately, in seconds (None: none yet).
    round_s: float | None = None
    #: Tasks it holds a copy of (standby or learner) within its acceptable lag.
    caught_up: frozenset[str] = frozenset()


def learning_from_status(value: Mapping[str, Any]) -> MemberLearning | None:
    """The learners in one status record; None for a record without them (an older member);
    raises ValueError for a malformed one."""
    lags = value.get("learning")
    if lags is None:
        return None
    generation, updated_ms, acceptable = (value.get("generation"), value.get("updated_ms"),
                                          value.get("acceptable_lag"))
    if not (isinstance(lags, Mapping) and all(
            isinstance(t, str) and _is_int(lag) for t, lag in lags.items())):
        raise ValueError(f"'learning' is not a map of task to lag: {lags!r}")
    for name, field in (("generation", generation), ("updated_ms", updated_ms),
                        ("acceptable_lag", acceptable)):
        if not _is_int(field):
            raise ValueError(f"{name!r} is not an integer: {field!r}")
    round_s = value.get("round_s")
    caught_up = frozenset(
        task for kind in ("standbys", "learners")
        if isinstance(copies := value.get(kind), Mapping)
        for task, lag in copies.items()
        if isinstance(task, str) and _is_int(lag) and lag <= acceptable)
    return MemberLearning(generation, updated_ms, acceptable, dict(lags),
                          value.get("leader") is True,
                          value.get("in_round") is True or value.get("state") == "rebalancing",
                          float(round_s) if isinstance(round_s, (int, float))
                          and not isinstance(round_s, bool) and round_s > 0 else None,
                          caught_up)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def past_session(silences: Mapping[str, int], session_timeout_ms: int) -> list[str]:
    """The members (of ``silences``: member -> how long it has been silent, ms, see
    :meth:`GroupLearning.silences`) silent for longer than a session timeout, but not yet for
    :data:`GONE_AFTER_SESSIONS` of them: gone or frozen, whatever round they were in. Every
    broker should have ended their sessions, so one that still counts them in can be told to
    remove them."""
    return sorted(member for member, silent_for in silences.items()
                  if session_timeout_ms < silent_for <= GONE_AFTER_SESSIONS * session_timeout_ms)


class LagLows:
    """When each learner's lag last reached a new low (its lowest so far): a copy whose lag
    only goes down and up again sets none."""

    def __init__(self) -> None:
        self._lows: dict[str, tuple[int, float]] = {}

    def update(self, lags: Mapping[str, int], now: float) -> None:
        """The learners' lags at ``now``; a learner not listed is forgotten, so one placed
        again starts over."""
        lows = {}
        for task, lag in lags.items():
            low = self._lows.get(task)
            lows[task] = (lag, now) if low is None or lag < low[0] else low
        self._lows = lows

    def since(self, task: str) -> float:
        """When the lag of ``task`` (a learner of the last update) last reached a new low."""
        return self._lows[task][1]


class GroupLearning:
    """The latest learners of every member, and when each of their lags last reached a new
    low (on the ``clock`` given, a monotonic one in seconds by default)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._members: dict[str, MemberLearning] = {}
        self._lows: dict[str, LagLows] = {}
        #: Status records that could not be read (counted, and the last reason kept).
        self.rejected = 0
        self.last_rejection: str | None = None
        #: Set by the app: starts following the status topic (called on first use).
        self.start_following: Callable[[], None] | None = None
        self._following = False

    def apply(self, member: str, value: Mapping[str, Any] | None, now_ms: int) -> None:
        """Fold in one status record (None: the member stopped)."""
        if value is None or not isinstance(value, Mapping):
            if value is not None:
                self._reject(f"status of {member!r} is not a map")
            self._forget(member)
            return
        try:
            learning = learning_from_status(value)
        except ValueError as exc:
            self._reject(f"status of {member!r}: {exc}")
            self._forget(member)
            return
        if learning is None:
            self._forget(member)
            return
        self._members[member] = learning
        self._lows.setdefault(member, LagLows()).update(learning.lags, self._clock())

    def _reject(self, reason: str) -> None:
        # Logged once per reason: a member publishes each second.
        if reason != self.last_rejection:
            log.warning("ignoring a status record for batching promotions (%s); that "
                        "member's learners count as unknown", reason)
        self.rejected += 1
        self.last_rejection = reason

    def _forget(self, member: str) -> None:
        self._members.pop(member, None)
        self._lows.pop(member, None)

    def silent(self, me: str, generation: int, now_ms: int,
               session_timeout_ms: int) -> list[str]:
        """The other members of the round of ``generation`` (as their latest records say)
        that have published nothing for :data:`SILENT_AFTER_MS`, but for less than a session
        timeout and a publication: the broker may still count them in, so a round asked for
        now would include them (or wait for them), and their session's end starts another
        one without them anyway. Starts following the status topic on first use."""
        self._follow()
        return sorted(member for member, learning in self._members.items()
                      if member != me and learning.generation == generation
                      and SILENT_AFTER_MS <= now_ms - learning.updated_ms
                      <= session_timeout_ms + 1_000)

    def silences(self, me: str, now_ms: int) -> dict[str, int]:
        """The other members -> how long each has published nothing (ms). Counted up to
        ``now_ms`` while the records read are fresh (the newest of them, this member's own
        included, under :data:`SILENT_AFTER_MS` old), else up to the newest: a process that
        was frozen itself reads everyone's records late, and would take them all for
        silent. Starts following the status topic on first use."""
        self._follow()
        if not self._members:
            return {}
        newest = min(now_ms, max(learning.updated_ms for learning in self._members.values()))
        if now_ms - newest < SILENT_AFTER_MS:
            newest = now_ms
        return {member: newest - learning.updated_ms
                for member, learning in self._members.items() if member != me}

    def in_round(self, instance: str, now_ms: int) -> list[str] | None:
        """The members of instances other than ``instance`` whose latest status record, fresh
        (under :data:`SILENT_AFTER_MS` old), says they are in a round; None when there are
        such members but none has a fresh record (a process that was frozen itself reads the
        records of its freeze first). Starts following the status topic on first use."""
        self._follow()
        others = {member: learning for member, learning in self._members.items()
                  if (parse_member_id(member) or ("", 0))[0] != instance}
        fresh = {member: learning for member, learning in others.items()
                 if now_ms - learning.updated_ms < SILENT_AFTER_MS}
        if others and not fresh:
            return None
        return sorted(member for member, learning in fresh.items() if learning.in_round)

    def join_round_s(self, now_ms: int) -> float | None:
        """The shortest join round the members measured lately, as their fresh records say
        (None: none says). Starts following the status topic on first use."""
        self._follow()
        rounds = [learning.round_s for learning in self._members.values()
                  if learning.round_s is not None
                  and now_ms - learning.updated_ms <= FRESH_WITHIN_MS]
        return min(rounds, default=None)

    def caught_up_copies(self, instance: str, now_ms: int) -> frozenset[str] | None:
        """Tasks of which a member of another instance than ``instance`` holds a caught-up
        copy, as their fresh records say; None when no other instance has a fresh record.
        Starts following the status topic on first use."""
        self._follow()
        others = [learning for member, learning in self._members.items()
                  if (parse_member_id(member) or ("", 0))[0] != instance
                  and now_ms - learning.updated_ms <= FRESH_WITHIN_MS]
        if not others:
            return None
        return frozenset(task for learning in others for task in learning.caught_up)

    def leads(self, member: str) -> bool:
        """Whether ``member``'s latest status record says it led its last round."""
        learning = self._members.get(member)
        return learning is not None and learning.leader

    def _follow(self) -> None:
        if not self._following:
            self._following = True
            if self.start_following is not None:
                self.start_following()

    def catching_up(self, me: str, generation: int, group_size: int,
                    now_ms: int) -> dict[str, float] | None:
        """The other members' learners that are not ready, for member ``me`` of the round of
        ``generation`` that had ``group_size`` members -> when each last reached a new low;
        None while the records do not cover every other member of that round."""
        self._follow()
        peers = {member: learning for member, learning in self._members.items()
                 if member != me and learning.generation == generation
                 and now_ms - learning.updated_ms <= FRESH_WITHIN_MS}
        if group_size <= 0 or len(peers) + 1 < group_size:
            return None
        return {task: self._lows[member].since(task)
                for member, learning in peers.items()
                for task, lag in learning.lags.items() if lag > learning.acceptable_lag}
