"""When a member asks for the round that promotes its ready learners.

A learner is ready when its lag is at or under ``acceptable_lag``; its task moves only in a
rebalance, which some member must ask for. Rounds cost seconds on the broker, and every
round that promotes is followed by one that assigns what it revoked, so the number of
rounds a big move takes is about twice the number of promotion rounds. The leader promotes
every ready learner of the group in one round and refills the freed slots in that round:
what matters is that a promotion round finds as many learners ready as possible.

Policies (the ``learner_rejoin`` setting):

- ``eager``: ask as soon as one learner is ready. Copies that catch up at different times
  each bring their own promotion round (a host swap of 20 tasks with four learners took 44
  rounds with uneven lags).
- ``conservative``: ask once all of this member's learners are ready (a slow copy delays the
  others without bound; members holding one learner each still ask one by one).
- ``batched`` (the default): ask once every learner of the group is ready. A member knows
  the other members' learners from their status records (:mod:`streams.group.group_learning`):
  while any learner of the group keeps catching up (its lag reached a new low within
  ``wait``), the member waits for it, however long that takes; a learner whose lag has not
  gone down for ``wait`` (a stalled copy, one that cannot keep up with its task's input)
  holds nobody back. Each promotion round then finds every learner of the group ready, and
  a move of m tasks takes about 2 * ceil(m / max_learners) rounds plus the first and the
  last, whatever the lags. When the member does not know every member's learners (a status
  missing, stale or of another round), it falls back to what it knows: it asks at once when
  it holds every learner of the group and all are ready, else once its first ready learner
  has waited ``wait``.

A ready learner's task moves only in a round some member asked for (its subscription says
so: ``asks_promotion``); a round that happens for another reason (the follow-up of a
promotion, a member leaving) promotes nothing, so that it does not split a batch.

:func:`asks_now` decides from plain data; times are in any one unit (the runtime uses
seconds of a monotonic clock, the simulation milliseconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from assignor import LeaderNotes
from assignor.model import MemberKey

POLICIES = ("batched", "eager", "conservative")


@dataclass(frozen=True)
class LearnerView:
    """What a member knows of its learners when it decides."""

    #: Its learners (task ids).
    held: frozenset[str]
    #: Those ready now (lag at or under ``acceptable_lag``).
    ready: frozenset[str]
    #: Ready learners it has not asked a round for yet -> since when they are ready.
    unasked_since: Mapping[str, float] = field(default_factory=dict)
    #: How many learners the group holds per its last assignment (0: not told).
    group_learners: int = 0
    #: The group's learners that are not ready yet, this member's among them -> when each
    #: last caught up further (its lag reached a new low); None when the member does not
    #: know every member's learners.
    catching_up: Mapping[str, float] | None = None


def asks_now(policy: str, view: LearnerView, now: float, wait: float) -> bool:
    """Whether the member asks for a rebalance now for its ready learners."""
    if policy not in POLICIES:
        raise ValueError(f"learner_rejoin must be one of {POLICIES}, not {policy!r}")
    if not view.unasked_since:
        return False
    if policy == "eager":
        return True
    all_mine = view.ready >= view.held
    if policy == "conservative":
        return all_mine
    if view.catching_up is not None:
        # A batch waits for a copy only while it gets closer.
        return all(now - since >= wait for since in view.catching_up.values())
    # Unknown group (an older leader): its own learners are all it can wait for.
    holds_all = view.group_learners <= len(view.held)
    if all_mine and holds_all:
        return True
    return now - min(view.unasked_since.values()) >= wait


def being_promoted(notes: LeaderNotes | None, key: MemberKey) -> frozenset[str]:
    """The tasks the member's last assignment moves to it in the next round (its own notes'
    ``incoming``): a learner among them was promoted and stays a copy until then, so it
    neither asks for a round nor counts as one to promote."""
    if notes is None:
        return frozenset()
    mine = notes.members.get(key)
    return frozenset(mine.incoming) if mine is not None else frozenset()


def asks_promotion(asked: frozenset[str], held: frozenset[str],
                   promoted: frozenset[str]) -> bool:
    """Whether the member's next subscription asks for its ready learners' promotion: it
    asked for a round for learners it still holds and that were not promoted yet (its request
    may have come while another round was under way, which did not promote them)."""
    return bool((asked & held) - promoted)
