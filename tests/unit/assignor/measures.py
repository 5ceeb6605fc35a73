"""Measures over a simulated group: whether it is balanced, how many tasks a change moved,
the fewest moves that balance needs after that change, and how many rounds the group takes
to settle (round by round, or in time, with members asking for rounds as the runtime
does)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from streams.group.learner_readiness import LearnerView, asks_now, asks_promotion, being_promoted
from tests.unit.assignor.simulation import Group, SimMember


def placement(group: Group) -> dict[str, str]:
    """task -> the instance running it."""
    return {t: m.instance_id for m in group.members.values() for t in m.active}


def open_capacity(group: Group) -> dict[str, int]:
    """instance -> threads, for instances that stay."""
    cap: dict[str, int] = {}
    for member in group.members.values():
        if member.leaving_since_ms is None:
            cap[member.instance_id] = cap.get(member.instance_id, 0) + 1
    return cap


def balanced(group: Group, tolerance: int = 1) -> bool:
    """Per kind and in total, tasks per thread of the instances that stay differ by at most
    ``tolerance``, and within an instance the threads differ by at most one task, per kind
    and in total."""
    stateful = {t.task_id: t.stateful for t in group.tasks}
    cap = open_capacity(group)
    if not cap:
        return True
    for kind in (True, False):
        loads = dict.fromkeys(cap, 0)
        threads: dict[str, list[int]] = {}
        for member in group.members.values():
            if member.instance_id not in cap:
                continue
            mine = sum(1 for t in member.active if stateful[t] == kind)
            loads[member.instance_id] += mine
            threads.setdefault(member.instance_id, []).append(mine)
        ratios = [loads[i] / cap[i] for i in cap]
        if max(ratios) - min(ratios) > tolerance + 1e-9:
            return False
        if any(max(c) - min(c) > 1 for c in threads.values()):
            return False
    totals: dict[str, list[int]] = {}
    for member in group.members.values():
        if member.instance_id in cap:
            totals.setdefault(member.instance_id, []).append(len(member.active))
    ratios = [sum(totals.get(i, [])) / cap[i] for i in cap]
    if max(ratios) - min(ratios) > tolerance + 1e-9:
        return False
    return all(max(c) - min(c) <= 1 for c in totals.values())


def moves(before: Mapping[str, str], after: Mapping[str, str]) -> int:
    """Tasks that run on another instance after than before (a task of an instance that
    vanished counts: it had to go somewhere)."""
    return sum(1 for task, inst in before.items() if task in after and after[task] != inst)


def fewest_moves(group: Group, before: Mapping[str, str], tolerance: int = 1,
                 stateful_only: bool = False) -> int:
    """The fewest tasks running before (on any instance) that must run elsewhere for the
    group's instances that stay to be balanced: every task of an instance that vanished or
    is leaving, plus what the instances that stay must give up, per kind and in total (the
    larger of the two: each alone is a bound below, and on the chains' histories the exact
    joint count was no more than 0.01% above it). ``stateful_only``: of the stateful tasks
    alone, balanced as a kind. Call it right after the change."""
    stateful = {t.task_id: t.stateful for t in group.tasks}
    cap = open_capacity(group)
    names = sorted(cap)
    caps = [cap[i] for i in names]
    if stateful_only:
        tasks = [t for t in stateful if stateful[t]]
        have = [sum(1 for t in tasks if before.get(t) == i) for i in names]
        return (sum(1 for t in tasks if t in before and before[t] not in cap)
                + _fewest(have, caps, len(tasks), tolerance))
    forced = sum(1 for inst in before.values() if inst not in cap)
    per_kind = 0
    for kind in (True, False):
        tasks = [t for t in stateful if stateful[t] == kind]
        have = [sum(1 for t in tasks if before.get(t) == i) for i in names]
        per_kind += _fewest(have, caps, len(tasks), tolerance)
    have = [sum(1 for t in stateful if before.get(t) == i) for i in names]
    in_total = _fewest(have, caps, len(stateful), tolerance)
    return forced + max(per_kind, in_total)


def _fewest(have: list[int], cap: list[int], total: int, tolerance: int) -> int:
    """Fewest tasks the instances must give up so that loads per thread lie within one band
    [x, x + tolerance] and add up to ``total``."""
    if not cap:
        return 0
    candidates = {k / c - shift for c in cap for k in range(total + 1)
                  for shift in (0, tolerance)}
    best = math.inf
    for x in candidates:
        low = [max(0, math.ceil(x * c - 1e-9)) for c in cap]
        high = [math.floor((x + tolerance) * c + 1e-9) for c in cap]
        if sum(low) > total or sum(high) < total or any(
                h < lo for h, lo in zip(high, low, strict=True)):
            continue
        final = [min(max(a, lo), h) for a, lo, h in zip(have, low, high, strict=True)]
        given_up = sum(max(0, a - f) for a, f in zip(have, final, strict=True))
        given_up += max(0, sum(final) - total)
        best = min(best, given_up)
    return int(best)


def settle(group: Group, limit: int = 200, catch_up: bool = True, step_ms: int = 0) -> int:
    """Rounds until the group is quiet (nothing revoked, learned or shut down, nothing
    changed) and balanced; returns how many it took. ``catch_up``: every copy catches up
    before each round; otherwise copies catch up a round's worth at a time (``Group.tick``)
    and a round runs only when something asks for one, as members do: a learner that became
    ready (eager rejoin), a member that revoked tasks in the last round, or one that shut
    down."""
    rounds, asked = 0, True
    for _ in range(limit * 4):
        if catch_up:
            group.catch_up()
        else:
            ready_before = _ready_learners(group)
            group.tick()
            asked = asked or bool(_ready_learners(group) - ready_before)
            if not asked:
                continue
        group.now_ms += step_ms
        before = {mid: (sorted(m.active), sorted(m.learners)) for mid, m in
                  group.members.items()}
        out = group.round()
        rounds += 1
        after = {mid: (sorted(m.active), sorted(m.learners)) for mid, m in
                 group.members.items()}
        quiet = all(not a.revoked and not a.learners and not a.shutdown for a in out.values())
        if quiet and before == after and balanced(group, group.config.tolerance):
            return rounds
        # A member that revoked tasks (or is told to) rejoins at once, one that shut down
        # leaves (and the broker starts a round), a ready learner asks for one.
        asked = any(a.revoked or a.shutdown or a.rejoin_after_ms == 0
                    for a in out.values()) or bool(
            _ready_learners(group))
        if not catch_up and not asked and not any(a.learners for a in out.values()):
            # Nobody will ask for another round: this is where the group stays.
            if balanced(group, group.config.tolerance):
                return rounds
            raise AssertionError(f"stuck unbalanced: {group.active_by_member()}")
        if rounds >= limit:
            break
    raise AssertionError(f"not settled after {rounds} rounds: {group.active_by_member()}")


def _ready_learners(group: Group) -> set[tuple[str, str]]:
    acceptable = group.config.acceptable_lag
    return {(mid, t) for mid, m in group.members.items() for t, lag in m.learners.items()
            if lag <= acceptable}


def settle_timed(group: Group, policy: str, wait_ms: int, round_ms: int = 3_000,
                 limit: int = 200) -> int:
    """Rounds until the group is quiet and balanced, with time: copies catch up in the time
    ``group.catch_up_ms`` gives them, a round takes ``round_ms``, and a round runs only when
    someone asks for one: the change itself, a member that revoked tasks or shut down in the
    last round (at once), or a member whose learners are ready, as ``policy`` decides
    (:func:`streams.group.learner_readiness.asks_now`, the runtime's own decision)."""
    asked: dict[str, set[str]] = {}
    follow_up: int | None = group.now_ms  # the change starts a round
    last: int | None = None
    rounds = 0
    while rounds < limit:
        earliest = group.now_ms if last is None else last + round_ms
        asks = {}
        learning = _group_learning(group)
        for mid, member in group.members.items():
            at = _asks_at(member, asked.get(mid, set()), policy, wait_ms, earliest, learning)
            if at is not None:
                asks[mid] = at
        times = [*asks.values(), *([] if follow_up is None else [follow_up])]
        if not times:
            # Nobody will ask for another round: this is where the group stays.
            if balanced(group, group.config.tolerance):
                return rounds
            raise AssertionError(f"stuck unbalanced: {group.active_by_member()}")
        at = max(min(times), earliest)
        for mid, when in asks.items():
            if when <= at:
                member = group.members[mid]
                asked.setdefault(mid, set()).update(
                    t for t in _learning(member) if member.ready_at[t] <= at)
        for mid, member in group.members.items():
            member.asks_promotion = asks_promotion(
                frozenset(asked.get(mid, ())), frozenset(member.learners),
                being_promoted(member.notes, (member.instance_id, member.thread)))
        group.advance_to(at)
        before = {mid: (sorted(m.active), sorted(m.learners)) for mid, m in
                  group.members.items()}
        out = group.round()
        rounds += 1
        last = at
        asked = {mid: done & set(group.members[mid].learners) for mid, done in asked.items()
                 if mid in group.members}
        after = {mid: (sorted(m.active), sorted(m.learners)) for mid, m in
                 group.members.items()}
        quiet = all(not a.revoked and not a.learners and not a.shutdown for a in out.values())
        if quiet and before == after and balanced(group, group.config.tolerance):
            return rounds
        # A member that revoked tasks (or is told to) rejoins at once; one that shut down
        # leaves.
        follow_up = at + round_ms if any(a.revoked or a.shutdown or a.rejoin_after_ms == 0
                                         for a in out.values()) else None
    raise AssertionError(f"not settled after {rounds} rounds: {group.active_by_member()}")


def _asks_at(member: SimMember, asked: set[str], policy: str, wait_ms: int,
             earliest: int, group: dict[str, int]) -> int | None:
    """When the member asks for a round for its ready learners (None: not before one of
    them is gone). Its view only changes when a learner of the group gets ready or a wait
    runs out. ``group``: every learner of the group -> when it is ready, which the member
    knows from the status records; a copy not ready yet is still catching up (its lag
    keeps going down)."""
    held = _learning(member)
    ready_at = {t: group[t] for t in held}
    pending = [ready_at[t] for t in held if t not in asked]
    if not pending:
        return None
    candidates = sorted({earliest, *(max(earliest, at + extra) for at in pending
                                     for extra in (0, wait_ms)),
                         *(max(earliest, at) for at in group.values())})
    for now in candidates:
        ready = frozenset(t for t in held if ready_at[t] <= now)
        view = LearnerView(held, ready, {t: ready_at[t] for t in ready if t not in asked},
                           member.group_learners,
                           {t: now for t, at in group.items() if at > now})
        if asks_now(policy, view, now, wait_ms):
            return now
    return None


def _group_learning(group: Group) -> dict[str, int]:
    """Every learner of the group -> when it is ready as a learner (a standby that becomes a
    learner is ready from then on)."""
    return {t: max(member.ready_at[t], member.learning_since[t])
            for member in group.members.values() for t in _learning(member)}


def _learning(member: SimMember) -> frozenset[str]:
    """The member's learners, less those its last round promoted (copies until the next)."""
    return frozenset(member.learners) - being_promoted(
        member.notes, (member.instance_id, member.thread))
