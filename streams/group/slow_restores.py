"""Restores worth handing over: an active task its member restores from far behind.

A member that restarts without its state directory (a new disk, a wiped volume) or finds a
store corrupt gets its tasks back and restores them from their changelogs, which can take
minutes while a standby elsewhere is caught up. Once a restore has run long enough for its
rate to be trusted, the member judges it: if, at that rate, it will not have caught up
within two join rounds (what handing the task to the caught-up copy costs: the round that
revokes it and the one that assigns it), the restore is *slow*. The member says so in its
subscription and asks for a round; the leader hands the task to a caught-up copy on another
instance, if there is one, and has the member learn it back (``Member.slow_restores``).

Pure: the state updater keeps a :class:`RestoreWatch` and passes the clock in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from streams.group.warm_up import RATE_TRUSTED_AFTER_S, catches_up_within

#: What a handover costs the task, in join rounds: one revokes it, the next assigns it.
ROUNDS_TO_HAND_OVER = 2


@dataclass(frozen=True)
class _Started:
    at: float
    lag: int


@dataclass
class RestoreWatch:
    """Per restoring active whose changelog ends are known: when its lag was first seen, and
    how large; and the restores judged slow (judged once, they stay slow while they run)."""

    started: dict[str, _Started] = field(default_factory=dict)
    slow: set[str] = field(default_factory=set)

    def judge(self, lags: Mapping[str, int], now: float, round_s: float | None,
              acceptable_lag: int) -> list[str]:
        """Fold in the restoring actives' lags now; returns the restores newly judged slow.
        ``round_s``: how long a join round takes (an estimate; the handover costs two), None
        while it is not known: nothing is judged then."""
        for task in list(self.started):
            if task not in lags:
                del self.started[task]
                self.slow.discard(task)
        newly = []
        for task, lag in sorted(lags.items()):
            start = self.started.setdefault(task, _Started(now, lag))
            if task in self.slow or round_s is None:
                continue
            if is_slow(now - start.at, start.lag - lag, lag, ROUNDS_TO_HAND_OVER * round_s,
                       acceptable_lag):
                self.slow.add(task)
                newly.append(task)
        return newly

    def slow_lags(self, lags: Mapping[str, int]) -> dict[str, int]:
        """The slow restores still running, with the records each has left."""
        return {t: lags[t] for t in sorted(self.slow) if t in lags}


def is_slow(elapsed_s: float, records_read: int, records_left: int, lead_s: float,
            acceptable_lag: int) -> bool:
    """Whether a restore that read ``records_read`` in ``elapsed_s`` and has
    ``records_left`` to go is worth handing over: far behind (beyond ``acceptable_lag``),
    its rate trusted, and at that rate not done within ``lead_s``."""
    if records_left <= acceptable_lag or elapsed_s < RATE_TRUSTED_AFTER_S:
        return False
    return not catches_up_within(lead_s, elapsed_s, records_read, records_left)
