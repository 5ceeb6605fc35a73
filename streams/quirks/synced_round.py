"""When a member may ask for the next rebalance: once every member of its round has its
assignment.

A cooperative member asks for a rebalance right after a round in two cases: it revoked
something (the follow-up round places what it gave up) and its learners caught up. On a
broker whose coordinator answers followers' SyncGroup requests late (Tansu polls a forming
group with pauses of seconds, so a follower's answer comes up to a second after the
leader's), a JoinGroup sent while another member still waits for its SyncGroup answer holds
that member for about five seconds; the group completes the next round without it, and it
forces yet another. Waiting until every member of the round reports its assignment removes
those stalls and the extra round they cost.

Members report ``(member id, generation)`` on the control topic once they applied an
assignment (:mod:`streams.group.control`); each process keeps the latest report per member in a
:class:`RoundReports`. Each assignment says how many members the round assigned
(``group_size``). :func:`may_rejoin` decides, from plain data, whether a waiting member asks
now. The wait is bounded: a member that never reports (it crashed, or runs a Relay that does
not report) delays the request by :data:`SYNC_WAIT_LIMIT_S` at most.

Those reports name a generation, which a broker may keep over several rounds; so a member
about to ask also waits while the status records of the other instances' members say they
are in a round (:func:`may_ask_after_others_synced`). A member whose membership ended (it
was frozen past its session) waits the same way before it joins again, for the other
members' round (:func:`may_join_after_loss`).

A member reads them for itself too: :func:`sync_answer_lost` tells it that its own SyncGroup
answer was lost, so that it gets a round started at once (see :mod:`streams.group.join_watch`)
instead of waiting its stall limit.

The leader reads the same reports: :func:`unsynced_members` names the members of its last
round still waiting for their assignment, which get no task they do not already run (see
``Member.unsynced``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: The longest a member waits for the others' reports before it asks anyway: about the stall
#: it avoids (Tansu holds a SyncGroup caught by a new round about five seconds).
SYNC_WAIT_LIMIT_S = 5.0
#: The longest a member whose membership ended waits for fresh status records of the others
#: (they publish each second).
UNKNOWN_ROUND_WAIT_S = 2.0
#: Members whose reports are kept (the ones that reported last): far more than a group has.
KEEP_MEMBERS = 50_000


@dataclass(frozen=True)
class RoundView:
    """What the waiting member knows of its own round."""

    #: Its generation (-1 before its first assignment).
    generation: int
    #: How many members its last assignment's round assigned (0: not told).
    group_size: int
    #: Whether it is in a round now (between join-prepare and join-complete).
    rebalancing: bool
    #: Seconds since it began waiting in this generation (reset when the generation changes).
    waited_s: float


def members_synced(generation: int, reports: Mapping[str, int]) -> int:
    """How many members report having their assignment of ``generation``."""
    return sum(1 for reported in reports.values() if reported == generation)


def may_rejoin(view: RoundView, reports: Mapping[str, int],
               limit_s: float = SYNC_WAIT_LIMIT_S) -> bool:
    """Whether a member waiting to ask for a rebalance asks now.

    Never in the middle of a round (its request would follow its own SyncGroup answer at
    once, the very race this avoids; the round's end starts a new wait). Otherwise once every
    member of its generation has its assignment, or once it has waited ``limit_s`` in this
    generation, or at once when it does not know its round (no generation or no size).
    """
    if view.rebalancing:
        return False
    if view.generation < 0 or view.group_size <= 0:
        return True
    if view.waited_s >= limit_s:
        return True
    return members_synced(view.generation, reports) >= view.group_size


def rejoin_limit_s(session_timeout_ms: int) -> float:
    """The longest a member whose membership ended waits for the others' round before it
    joins: about the rest of a round on a broker that answers a JoinGroup half a session
    after it came and a static member's SyncGroup 3 s after that, and a second more."""
    return session_timeout_ms / 2000 + 4.0


def may_join_after_loss(others_in_round: Iterable[str] | None, waited_s: float,
                        limit_s: float) -> bool:
    """Whether a member whose membership ended (it was silent past its session, or the broker
    expired it) joins now: once no member of another instance is in a round, or once it has
    waited ``limit_s``. Its JoinGroup, sent while the others wait for their SyncGroup
    answers, would make those answers vain (the leader's assignment does not name it): they
    come only at the broker's timeout, and the others join a round later still, which holds
    the tasks their round was moving (a learner's handover) for two rounds more.
    ``others_in_round`` None: nothing fresh is known of the others yet (the status records
    of its freeze are still being read), so it waits, at most :data:`UNKNOWN_ROUND_WAIT_S`."""
    if others_in_round is None:
        return waited_s >= min(limit_s, UNKNOWN_ROUND_WAIT_S)
    return waited_s >= limit_s or not any(True for _ in others_in_round)


def may_ask_after_others_synced(others_in_round: Iterable[str] | None, waited_s: float,
                                limit_s: float = SYNC_WAIT_LIMIT_S) -> bool:
    """Whether a member about to ask for a round asks now, as far as the status records of
    the other instances' members tell: once none of them says it is in a round, or once it
    has waited ``limit_s``. The generations the members report cannot tell one round from
    the next where the broker keeps a generation over several rounds: a member still waiting
    for its SyncGroup answer reports the generation of its last round, and a request then
    made that answer vain (Tansu gives it only at its timeout, and the task the round was
    moving to that member waited two rounds more). ``others_in_round`` None (nothing fresh
    is known of the others): at once, as without the records."""
    if others_in_round is None:
        return True
    return waited_s >= limit_s or not any(True for _ in others_in_round)


def unsynced_members(previous_round: Iterable[str], leader: str,
                     reports: Mapping[str, int]) -> set[str]:
    """Members of the leader's previous round that have not reported having their assignment
    of it, though the leader has: a follower whose SyncGroup answer was lost when the next
    round began waits for it a round or two. Nothing when the leader's own report is missing
    (it knows no round to compare with)."""
    generation = reports.get(leader)
    if generation is None:
        return set()
    return {m for m in previous_round if m != leader and reports.get(m) != generation}


def sync_answer_lost(own_member: str, joined_generation: int, applied_generation: int,
                     rebalancing: bool, reports: Mapping[str, int]) -> bool:
    """Whether a member waits for a SyncGroup answer that another member's report shows was
    given: it joined ``joined_generation`` (its JoinGroup was answered), has applied no
    assignment of it, and another member already reports having its assignment of that
    generation or a later one. Followers' answers come within about a second of each other,
    so a member in that state for longer lost its answer (seen on Tansu when a member's
    session ended just after a round) and waits until the next round, which nobody starts."""
    if not rebalancing or joined_generation < 0 or joined_generation <= applied_generation:
        return False
    return any(generation >= joined_generation for member, generation in reports.items()
               if member != own_member)


@dataclass
class RoundReports:
    """The latest generation each member of the group reported having its assignment of
    (member id -> generation), as a process reads them from the control topic."""

    generations: dict[str, int] = field(default_factory=dict)

    def record(self, member_id: str, generation: int) -> None:
        if not member_id or generation < 0:
            return
        # Latest report last, so that the members gone longest are forgotten first; a group
        # that starts over counts its generations from the beginning again, so the latest
        # report wins even when its generation is lower.
        self.generations.pop(member_id, None)
        self.generations[member_id] = generation
        while len(self.generations) > KEEP_MEMBERS:
            del self.generations[next(iter(self.generations))]
