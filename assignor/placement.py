"""The learner assignor: a pure function from the group's state to every member's assignment.

Order of work (the learner design, with the cooperative and deferred-imbalance designs):

1. members: drop duplicate member ids and static ids (of a static id the newcomer gets an
   error, which revokes what it claims: see ``_drop_duplicates``), group threads into
   instances, note leaving instances and their scale-down deadlines; a new leader rebuilds
   the previous leader's memory from the notes the members echo;
2. lost tasks: a vanished static member's tasks are held back for ``lost_task_delay_ms``
   (per member: a restarting thread gets its own tasks back, all of them), and keep their
   standbys; nothing is held for an instance marked leaving;
3. actives: every running task stays where it runs unless a ready learner elsewhere takes it
   (all of them at once, in a round a member asked for its ready learners; see
   ``Member.asks_promotion``) or the scale-down timeout of a leaving owner passed, and all of
   them are counted before any unowned task is placed; an unowned task goes to a ready
   learner, the member it was moving to, its previous owner, its most caught-up copy, back to
   its previous owner if that one is leaving (it gave the task up for a learner that could
   not take it), and only then to the least loaded instance; a task its owner restores from
   far behind (``Member.slow_restores``) goes to a caught-up copy on another instance, and
   its owner learns it back;
4. balance: stateless tasks move at once; stateful ones through learners (at most
   ``max_learners``, not counting learners promoted in this round), first for leaving
   instances, then from the most to the least loaded instance, each move only while it is
   needed (a caught-up standby where the task goes takes it over at once, either way);
   once no stateful task is still to move, stateless tasks even out the totals;
5. cooperative safety: a task whose owner changes is revoked this round and assigned next;
6. standbys; then threads within each instance, balanced per kind and sticky (copies stay on
   the thread that holds them); then the leader's notes for each member, shutdowns and
   rejoin timers.

Balanced means: per kind (stateful, stateless) and in total, the tasks per thread of any two
instances that stay differ by at most ``imbalance_tolerance`` (one by default); within an
instance, the threads' counts differ by at most one, per kind and in total.

Load is kept in heaps so that a round grows near-linearly with tasks and members. Everything
iterates in sorted order: the same input gives the same output.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from assignor.model import (
    AssignorConfig,
    LeaderMemory,
    Member,
    MemberAssignment,
    MemberKey,
    Task,
    task_sort_key,
)
from assignor.notes import build_notes, memory_from_notes, owners_noted_at

#: Instances tied for lightest (or heaviest) that are compared by their totals: a bound, so
#: that a round stays near-linear in a group of many equal instances.
_TIES_SCANNED = 16


@dataclass
class _Instance:
    instance_id: str
    members: list[Member]
    leaving: bool = False
    deadline_ms: int | None = None
    #: Threads that are away while their tasks are held for them: they still count.
    phantoms: int = 0

    @property
    def capacity(self) -> int:
        return len(self.members) + self.phantoms


@dataclass
class _Plan:
    #: task -> the instance that runs it (from the next round on, when it moves)
    target: dict[str, str] = field(default_factory=dict)
    #: task -> the instance learning it (a learner that is not promoted this round)
    learners: dict[str, str] = field(default_factory=dict)
    #: task -> the instance whose learner is promoted this round (it keeps its copy)
    promoted: dict[str, str] = field(default_factory=dict)
    standbys: dict[str, list[str]] = field(default_factory=dict)
    #: task -> (the static member it is held for, since when)
    held: dict[str, tuple[MemberKey, int]] = field(default_factory=dict)
    #: tasks held last round that go back to their member this round (balance leaves them)
    returning: set[str] = field(default_factory=set)
    #: instances given back more than balance allows (the group changed while they were
    #: away): their members ask for the next round at once, which moves the excess
    over_returned: set[str] = field(default_factory=set)
    #: tasks that only members given an error claim (they are told to revoke them): they run
    #: nowhere this round, and their new member gets them in the next one
    released: set[str] = field(default_factory=set)
    #: member id -> it gets a released task in the next round, which it asks for at once
    waiting: set[str] = field(default_factory=set)
    revoke: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    #: task -> the member it was revoked for
    moving: dict[str, MemberKey] = field(default_factory=dict)
    #: member id -> active tasks after this round
    active: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))


class _Load:
    """Planned tasks per instance, stateful and stateless apart, with heaps over the open
    instances so that the lightest and the heaviest are found in logarithmic time."""

    def __init__(self, instances: dict[str, _Instance], open_ids: list[str]) -> None:
        self.cap = {i: inst.capacity for i, inst in instances.items()}
        self.open = set(open_ids)
        self.open_capacity = sum(self.cap[i] for i in open_ids)
        #: tasks of each kind planned anywhere (open or leaving instances, or held)
        self.total: dict[bool, int] = {True: 0, False: 0}
        self.count: dict[tuple[str, bool], int] = defaultdict(int)
        self.tasks: dict[tuple[str, bool], set[str]] = defaultdict(set)
        self._min: dict[bool, list[tuple[float, int, str]]] = {True: [], False: []}
        self._max: dict[bool, list[tuple[float, int, str]]] = {True: [], False: []}
        for kind in (True, False):
            self._min[kind] = [(0.0, 0, i) for i in sorted(open_ids)]
            heapq.heapify(self._min[kind])
        #: The max-heaps are built on first use (placing tasks only needs the lightest).
        self._max_live = {True: False, False: False}

    def ratio(self, inst: str, kind: bool) -> float:
        return self.count[(inst, kind)] / self.cap[inst]

    def _changed(self, inst: str, kind: bool) -> None:
        if inst in self.open:
            count = self.count[(inst, kind)]
            ratio = count / self.cap[inst]
            heapq.heappush(self._min[kind], (ratio, count, inst))
            if self._max_live[kind]:
                heapq.heappush(self._max[kind], (-ratio, -count, inst))

    def add(self, inst: str, task: str, kind: bool) -> None:
        self.total[kind] += 1
        self.count[(inst, kind)] += 1
        self.tasks[(inst, kind)].add(task)
        self._changed(inst, kind)

    def add_running(self, placed: dict[str, str], stateful: dict[str, bool]) -> None:
        """Count many tasks at once (task -> instance), then rebuild the heaps once."""
        for task, inst in placed.items():
            kind = stateful[task]
            self.total[kind] += 1
            self.count[(inst, kind)] += 1
            self.tasks[(inst, kind)].add(task)
        for kind in (True, False):
            self._min[kind] = [(self.count[(i, kind)] / self.cap[i], self.count[(i, kind)], i)
                               for i in self.open]
            heapq.heapify(self._min[kind])
            self._max_live[kind] = False

    def add_held(self, inst: str, kind: bool) -> None:
        self.total[kind] += 1
        self.count[(inst, kind)] += 1
        self._changed(inst, kind)

    def move(self, task: str, kind: bool, source: str, destination: str) -> None:
        self.total[kind] -= 1  # added back below
        self.count[(source, kind)] -= 1
        self.tasks[(source, kind)].discard(task)
        self._changed(source, kind)
        self.add(destination, task, kind)

    def lightest(self, kind: bool, exclude: Iterable[str] = ()) -> str | None:
        heap, skipped, found = self._min[kind], [], None
        excluded = set(exclude)
        while heap:
            _ratio, count, inst = heap[0]
            if count != self.count[(inst, kind)]:
                heapq.heappop(heap)  # stale
                continue
            if inst in excluded:
                skipped.append(heapq.heappop(heap))
                continue
            found = inst
            break
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found

    def heaviest(self, kind: bool) -> str | None:
        if not self._max_live[kind]:
            self._max[kind] = [(-self.count[(i, kind)] / self.cap[i], -self.count[(i, kind)], i)
                               for i in self.open]
            heapq.heapify(self._max[kind])
            self._max_live[kind] = True
        heap = self._max[kind]
        while heap:
            _, neg_count, inst = heap[0]
            if -neg_count != self.count[(inst, kind)]:
                heapq.heappop(heap)
                continue
            return inst
        return None

    def _total_ratio(self, inst: str) -> float:
        return (self.count[(inst, True)] + self.count[(inst, False)]) / self.cap[inst]

    def _tied(self, heap: list[tuple[float, int, str]], kind: bool, sign: int,
              limit: int = _TIES_SCANNED) -> list[str]:
        """The instances at the top of ``heap`` (up to ``limit``) whose load of ``kind`` per
        thread equals the top's; stale entries are dropped, the others pushed back."""
        tied: list[str] = []
        kept: list[tuple[float, int, str]] = []
        while heap and len(tied) < limit:
            entry = heapq.heappop(heap)
            ratio, count, inst = entry
            if sign * count != self.count[(inst, kind)] or inst in tied:
                continue  # stale, or a duplicate of one already taken
            if tied and ratio != kept[0][0]:
                heapq.heappush(heap, entry)
                break
            tied.append(inst)
            kept.append(entry)
        for entry in kept:
            heapq.heappush(heap, entry)
        return tied

    def lightest_in_total(self, kind: bool) -> str | None:
        """The lightest instance for ``kind``; of those tied, the one with the fewest tasks per
        thread in total, so that the stateless tasks need not move to even the totals out."""
        if self.lightest(kind) is None:
            return None
        # Ties in total go to the first in the heap's order, as without totals.
        return min(self._tied(self._min[kind], kind, 1), key=self._total_ratio)

    def heaviest_in_total(self, kind: bool) -> str | None:
        """The heaviest instance for ``kind``; of those tied, the one with the most tasks per
        thread in total."""
        if self.heaviest(kind) is None:
            return None
        return max(self._tied(self._max[kind], kind, -1), key=self._total_ratio)

    def roomiest_in_total(self, tolerance: int) -> str | None:
        """Of the open instances with room for one more stateful task (see
        :meth:`has_room`), the one with the fewest tasks per thread in total once it has it:
        where the stateful task goes, no stateless one has to leave to even the totals out."""
        roomy = [i for i in sorted(self.open) if self.has_room(i, True, tolerance)]
        return min(roomy, key=lambda i: ((self.count[(i, True)] + self.count[(i, False)] + 1)
                                         / self.cap[i], self.ratio(i, True)), default=None)

    def unbalanced(self, heavy: str, light: str, kind: bool, tolerance: int) -> bool:
        cap_h, cap_l = self.cap[heavy], self.cap[light]
        return (self.count[(heavy, kind)] * cap_l - self.count[(light, kind)] * cap_h
                > tolerance * cap_h * cap_l)

    def improves(self, source: str, destination: str, kind: bool) -> bool:
        """Whether moving one task lowers the imbalance (the sum of squared loads per
        thread): a move that does not is one more move than balance needs."""
        c_s, c_d = self.count[(source, kind)], self.count[(destination, kind)]
        return (2 * c_s - 1) * self.cap[destination] > (2 * c_d + 1) * self.cap[source]

    def share(self, inst: str, kind: bool) -> float:
        """What ``inst`` holds once every task (those of leaving instances too) is spread
        over the open instances by their threads."""
        return self.total[kind] * self.cap[inst] / self.open_capacity

    def needed(self, source: str, destination: str, kind: bool) -> bool:
        """Whether balance needs a task to move from ``source`` to ``destination``: the source
        holds more than its share, the destination less, and the move lowers the imbalance.
        A source that is leaving always gives its tasks up."""
        if source not in self.open:
            return True
        return (self.count[(source, kind)] > self.share(source, kind) + 1e-9
                and self.count[(destination, kind)] < self.share(destination, kind) - 1e-9
                and self.improves(source, destination, kind))

    def has_room(self, inst: str, kind: bool, tolerance: int) -> bool:
        """Whether one more task keeps ``inst`` at or under its share, and within the
        tolerance of the lightest instance (per thread), so that balance does not have to
        move a task off it again."""
        count = self.count[(inst, kind)] + 1
        if count > math.ceil(self.share(inst, kind) - 1e-9):
            return False
        light = self.lightest(kind, exclude=(inst,))
        if light is None:
            return True
        cap_i, cap_l = self.cap[inst], self.cap[light]
        return count * cap_l - self.count[(light, kind)] * cap_i <= tolerance * cap_i * cap_l


def assign(
    tasks: Sequence[Task],
    members: Sequence[Member],
    config: AssignorConfig,
    now_ms: int,
    memory: LeaderMemory | None,
    use_learners: bool = True,
) -> tuple[dict[str, MemberAssignment], LeaderMemory]:
    """Decide every member's assignment for this round.

    ``tasks``: every task of the app. ``members``: the group as the subscriptions describe it.
    ``now_ms``: the leader's clock (an argument, so that rounds replay exactly). ``memory``:
    what the leader decided last round, or None for a new leader (which rebuilds it from the
    notes the members echo). ``use_learners=False`` moves stateful tasks at once (the
    stop-the-world baseline).

    Returns the assignment of every member id and the leader's new memory.
    """
    # Task ids were checked when the tasks were built: split them without checking again.
    ordered = sorted(tasks, key=lambda t: task_sort_key(t.task_id))
    stateful = {t.task_id: t.stateful for t in ordered}
    order = {task: n for n, task in enumerate(stateful)}

    valid, errors = _drop_duplicates(members, order)
    rebuilt = memory is None
    if memory is None:
        memory = memory_from_notes(valid)
    instances = _instances(valid, config)
    by_key = {m.key: m for m in valid}
    formed_at = memory.formed_at_ms if memory.formed_at_ms is not None else now_ms

    if not valid:
        # Nobody to give anything to (the leader is a member, so only a caller outside a
        # group asks this): nothing is assigned, and what the leader remembered stands.
        return dict(errors), memory
    owner, conflicts = _current_owners(valid, stateful, memory)
    _revoke_stale_claims(owner, conflicts, instances, by_key, memory, config, now_ms,
                         owners_noted_at(valid) if rebuilt else None)
    if config.initial_delay_ms and not owner and now_ms - formed_at < config.initial_delay_ms:
        wait = formed_at + config.initial_delay_ms - now_ms
        notes = build_notes(formed_at, formed_at, valid, {}, {}, {})
        result = {m.member_id: MemberAssignment(rejoin_after_ms=wait, notes=notes[m.member_id])
                  for m in valid}
        result.update(errors)
        return result, replace(memory, formed_at_ms=formed_at,
                               instances=frozenset(instances))

    learner_lags = _learner_lags(valid, config.acceptable_lag)
    standby_lags = _copies(valid, "standbys")
    plan = _Plan()
    claimed = {t for m in valid for t in m.active}
    plan.released = {t for mid, a in errors.items() for t in a.revoked
                     if t in stateful and t not in claimed}
    plan.held = _held_back(stateful, owner, instances, by_key, memory, config, now_ms)
    phantoms: dict[str, set[MemberKey]] = defaultdict(set)
    for key, _ in plan.held.values():
        if key[0] in instances and not instances[key[0]].leaving:
            phantoms[key[0]].add(key)
    for inst_id, keys in phantoms.items():
        instances[inst_id].phantoms = len(keys)
    open_ids = sorted(i for i, inst in instances.items() if not inst.leaving)
    load = _Load(instances, open_ids)
    for task, (key, _) in plan.held.items():
        if key[0] in phantoms:
            load.add_held(key[0], stateful[task])

    # Ready learners of running tasks are promoted, all at once, in a round some member asked
    # for them; a round that happens for another reason (a follow-up, a member leaving)
    # promotes none, so that promotions keep in step with the members' batches.
    promote = use_learners and any(m.asks_promotion for m in valid)
    _place_actives(plan, load, stateful, owner, instances, open_ids, learner_lags,
                   standby_lags, memory, config, now_ms, use_learners, promote, set(by_key))
    if open_ids:
        for kind in ([False] if use_learners else [False, True]):
            _balance_directly(plan, load, kind, owner, order, config)
        if use_learners:
            _place_learners(plan, load, stateful, owner, instances, open_ids, learner_lags,
                            standby_lags, order, config)
        if not plan.learners:
            _balance_totals(plan, load, owner, order, config)
    _place_standbys(plan, owner, stateful, instances, open_ids, standby_lags, learner_lags,
                    config)
    _per_thread(plan, instances, owner, stateful, memory, order)
    for member_id, claimed in conflicts.items():
        plan.revoke[member_id] |= claimed
    owners: dict[str, MemberKey] = {task: key for task, (key, _) in plan.held.items()}
    key_of = {m.member_id: m.key for m in valid}
    for mid, active in plan.active.items():
        key = key_of[mid]
        for task in active:
            owners[task] = key
    for task in plan.moving:
        owners[task] = owner[task].key if task in owner else plan.moving[task]
    # The notes are stamped with when the memory last changed, not with now: a round that
    # changes nothing gives every member the same bytes as before (static followers compare
    # digests of their assignments).
    unchanged = (memory.noted_at_ms is not None and owners == memory.owners
                 and plan.held == memory.lost and plan.moving == memory.moving)
    noted_at = memory.noted_at_ms if unchanged and memory.noted_at_ms is not None else now_ms
    new_memory = LeaderMemory(
        instances=frozenset(instances),
        owners=owners,
        lost=dict(plan.held),
        formed_at_ms=formed_at,
        moving=dict(plan.moving),
        noted_at_ms=noted_at,
    )
    result = _assignments(plan, instances, by_key, stateful, order, valid, now_ms, noted_at,
                          formed_at, config.lost_task_delay_ms)
    result.update(errors)
    return result, new_memory


# -- members and instances -----------------------------------------------------------------


def _drop_duplicates(
    members: Iterable[Member], order: Mapping[str, int],
) -> tuple[list[Member], dict[str, MemberAssignment]]:
    """The members the round assigns, and an error for the others: every member of a member
    id that several subscriptions carry (no broker hands one out twice, and one assignment
    cannot tell them apart), and all but one of the members of a static id. The one kept is
    the incumbent: the member whose echoed notes are the newest (it had an assignment), then
    one that runs tasks, then the smallest member id; a newcomer gets the error. An error
    revokes what its member claims: those tasks go to another member from the next round."""

    def error(claims: Iterable[str], message: str) -> MemberAssignment:
        revoked = tuple(sorted(claims, key=lambda t: (0, order[t], "") if t in order
                               else (1, 0, t)))
        return MemberAssignment(revoked=revoked, rejoin_after_ms=0 if revoked else None,
                                error=message)

    by_id: dict[str, list[Member]] = defaultdict(list)
    for member in members:
        by_id[member.member_id].append(member)
    errors: dict[str, MemberAssignment] = {}
    by_static: dict[tuple[str, int], list[Member]] = defaultdict(list)
    for member_id, same in sorted(by_id.items()):
        if len(same) > 1:
            errors[member_id] = error({t for m in same for t in m.active},
                                      f"duplicate member id {member_id}: {len(same)} "
                                      f"subscriptions carry it")
            continue
        [member] = same
        by_static[(member.instance_id, member.thread)].append(member)
    valid: list[Member] = []
    for (instance, thread), group in sorted(by_static.items()):
        keep = min(group, key=lambda m: (m.notes is None,
                                         -m.notes.round_ms if m.notes is not None else 0,
                                         not m.active, m.member_id))
        valid.append(keep)
        for other in group:
            if other is not keep:
                errors[other.member_id] = error(
                    other.active, f"duplicate group instance id {instance}-thread-{thread}: "
                    f"another member ({keep.member_id}) already uses it")
    return valid, errors


def _instances(members: list[Member], config: AssignorConfig) -> dict[str, _Instance]:
    instances: dict[str, _Instance] = {}
    for member in sorted(members, key=lambda m: (m.instance_id, m.thread, m.member_id)):
        inst = instances.setdefault(member.instance_id, _Instance(member.instance_id, []))
        inst.members.append(member)
        if member.leaving:
            inst.leaving = True
            since = member.leaving_since_ms or 0
            timeout = (member.scale_down_timeout_ms if member.scale_down_timeout_ms is not None
                       else config.scale_down_timeout_ms)
            deadline = since + timeout
            inst.deadline_ms = deadline if inst.deadline_ms is None else min(
                inst.deadline_ms, deadline)
    return instances


def _expired(inst: _Instance, now_ms: int) -> bool:
    return inst.deadline_ms is not None and now_ms >= inst.deadline_ms


def _current_owners(
    members: list[Member], stateful: dict[str, bool], memory: LeaderMemory
) -> tuple[dict[str, Member], dict[str, set[str]]]:
    """Who runs each task now; a second claimant, or an unknown task, must be revoked."""
    conflicts: dict[str, set[str]] = defaultdict(set)
    owner: dict[str, Member] = {}
    others: dict[str, list[Member]] = defaultdict(list)
    for member in members:
        for task in member.active:
            if task not in stateful:
                conflicts[member.member_id].add(task)
            elif owner.setdefault(task, member) is not member:
                others[task].append(member)
    for task, extra in others.items():
        claimants = [owner[task], *extra]
        previous = memory.owners.get(task)
        keep = min(claimants, key=lambda m: (m.key != previous, m.member_id))
        owner[task] = keep
        for other in claimants:
            if other is not keep:
                conflicts[other.member_id].add(task)
    return owner, conflicts


def _revoke_stale_claims(
    owner: dict[str, Member],
    conflicts: dict[str, set[str]],
    instances: dict[str, _Instance],
    by_key: dict[MemberKey, Member],
    memory: LeaderMemory,
    config: AssignorConfig,
    now_ms: int,
    noted: Mapping[str, int] | None = None,
) -> None:
    """A task the leader remembers on a vanished member, held for it, that another member
    claims: the claimant is back from a pause (SIGSTOP past its session) and runs what it
    ran before the task moved on. Its claim is revoked and the task held, as it would be had
    the claimant stayed away; only where the task is then held (:func:`_hold_since`): a task
    on its way to a member that is here is not, and revoking the claim would hand it to that
    member in the round its claimant still runs it, so the claim stands like any other.

    ``noted``: the memory was rebuilt from the notes, which give, per task, the round its
    owner is noted from (:func:`owners_noted_at`). A claim is then revoked only where the
    claimant's own notes are older than that: it last heard from the group before the task
    went on to its owner (a claimant given the task since holds notes of that round or a
    later one)."""
    if not config.lost_task_delay_ms:
        return
    for task, key in memory.owners.items():
        claimant = owner.get(task)
        if claimant is None or claimant.key == key:
            continue
        if noted is not None and (claimant.notes is None or task not in noted
                                  or claimant.notes.round_ms >= noted[task]):
            continue
        # Only a claim on a task that is then held is revoked: a task that would not be
        # held (on its way to a member that is here, say) would go to another member in this
        # very round, while its claimant still runs it. It stays with its claimant.
        if _hold_since(task, key, instances, by_key, memory, config, now_ms) is None:
            continue
        del owner[task]
        conflicts[claimant.member_id].add(task)


def _copies(members: list[Member], kind: str) -> dict[str, dict[str, int]]:
    """task -> instance -> the smallest lag of that instance's copies of the task."""
    copies: dict[str, dict[str, int]] = defaultdict(dict)
    for member in members:
        for task, lag in getattr(member, kind).items():
            per_instance = copies[task]
            per_instance[member.instance_id] = min(lag, per_instance.get(member.instance_id, lag))
    return copies


def _learner_lags(members: list[Member], acceptable_lag: int) -> dict[str, dict[str, int]]:
    """Like ``_copies`` for learners, with a learner its member expects to have caught up by
    the time the assignment arrives counted as just ready: behind every copy that is ready
    already, ahead of every one that is not."""
    counted = [member if not member.ready_by_assignment else replace(
        member, learners={task: min(lag, acceptable_lag) if task in member.ready_by_assignment
                          else lag for task, lag in member.learners.items()})
        for member in members]
    return _copies(counted, "learners")


def _held_back(
    stateful: dict[str, bool],
    owner: dict[str, Member],
    instances: dict[str, _Instance],
    by_key: dict[MemberKey, Member],
    memory: LeaderMemory,
    config: AssignorConfig,
    now_ms: int,
) -> dict[str, tuple[MemberKey, int]]:
    """Tasks whose static member vanished, held for it until the delay ends. The memory keeps
    them (with their member and when it went missing) for as long as they are held."""
    held: dict[str, tuple[MemberKey, int]] = {}
    if not config.lost_task_delay_ms:
        return held
    for task, previous in memory.owners.items():
        if task not in stateful or task in owner:
            continue
        since = _hold_since(task, previous, instances, by_key, memory, config, now_ms)
        if since is not None:
            held[task] = (previous, since)
    return held


def _hold_since(
    task: str,
    previous: MemberKey,
    instances: dict[str, _Instance],
    by_key: dict[MemberKey, Member],
    memory: LeaderMemory,
    config: AssignorConfig,
    now_ms: int,
) -> int | None:
    """Since when ``task``, remembered on ``previous``, is held for it, if it is held this
    round (nobody else running it): its member vanished, its instance is not leaving, it is
    not on its way to a member that is here, and the delay has not passed. The one rule for
    holding a task and for revoking a stale claim on it, so that a claim is revoked only
    where the task then runs nowhere."""
    if not config.lost_task_delay_ms or previous in by_key:
        return None
    inst = instances.get(previous[0])
    if inst is not None and inst.leaving:
        return None
    if task in memory.moving and memory.moving[task] in by_key:
        return None  # on its way to a member that is here
    remembered = memory.lost.get(task)
    since = remembered[1] if remembered and remembered[0] == previous else now_ms
    return since if now_ms < since + config.lost_task_delay_ms else None


# -- actives ---------------------------------------------------------------------------------


def _open_copy(
    task: str,
    lags: dict[str, dict[str, int]],
    instances: dict[str, _Instance],
    max_lag: int | None = None,
    exclude: str | None = None,
) -> str | None:
    """The open instance with the least-lagging copy of ``task`` (within ``max_lag``)."""
    best: tuple[int, str] | None = None
    for inst, lag in lags.get(task, {}).items():
        if inst == exclude or instances[inst].leaving or (max_lag is not None and lag > max_lag):
            continue
        if best is None or (lag, inst) < best:
            best = (lag, inst)
    return None if best is None else best[1]


def _warm_copy(
    task: str,
    kind: bool,
    copies: list[dict[str, dict[str, int]]],
    instances: dict[str, _Instance],
    load: _Load,
    config: AssignorConfig,
) -> str | None:
    """The most caught-up copy of ``task`` on an open instance (learner or standby); copies
    within ``acceptable_lag`` count as equally caught up, and the least loaded of them wins."""
    best: tuple[int, float, str] | None = None
    for lags in copies:
        for inst, lag in lags.get(task, {}).items():
            if instances[inst].leaving:
                continue
            rank = (0 if lag <= config.acceptable_lag else lag, load.ratio(inst, kind), inst)
            if best is None or rank < best:
                best = rank
    return None if best is None else best[2]


def _caught_up_copy(
    task: str,
    copies: list[dict[str, dict[str, int]]],
    instances: dict[str, _Instance],
    config: AssignorConfig,
    exclude: str,
) -> str | None:
    """The open instance other than ``exclude`` whose copy of ``task`` (learner or standby)
    lags least, if it is within ``acceptable_lag``."""
    least: dict[str, int] = {}
    for lags in copies:
        for inst, lag in lags.get(task, {}).items():
            least[inst] = min(lag, least.get(inst, lag))
    return _open_copy(task, {task: least}, instances, config.acceptable_lag, exclude)


def _open_member(key: MemberKey | None, instances: dict[str, _Instance]) -> str | None:
    if key is None:
        return None
    inst = instances.get(key[0])
    return inst.instance_id if inst is not None and not inst.leaving else None


def _leaving_keeper(key: MemberKey | None, present: set[MemberKey],
                    instances: dict[str, _Instance], now_ms: int) -> str | None:
    """The leaving instance of a task's previous owner, when that member is here and its
    scale-down deadline has not passed: a leaving member that gave a task up for a ready
    learner that could not take it (its member was marked leaving too) keeps it until a
    learner on an instance that stays is ready, as if it had not given it up, rather than
    the task starting cold elsewhere."""
    if key is None or key not in present:
        return None
    inst = instances.get(key[0])
    if inst is None or not inst.leaving or _expired(inst, now_ms):
        return None
    return inst.instance_id


def _place_actives(
    plan: _Plan,
    load: _Load,
    stateful: dict[str, bool],
    owner: dict[str, Member],
    instances: dict[str, _Instance],
    open_ids: list[str],
    learner_lags: dict[str, dict[str, int]],
    standby_lags: dict[str, dict[str, int]],
    memory: LeaderMemory,
    config: AssignorConfig,
    now_ms: int,
    use_learners: bool,
    promote: bool,
    present: set[MemberKey],
) -> None:
    # Running tasks first, all of them, so that unowned tasks see the whole load.
    unplaced: list[str] = []
    promotable: list[tuple[str, str]] = []
    learn_back: list[tuple[str, str, str]] = []
    for task, kind in stateful.items():
        if task in plan.held:
            continue
        current = owner.get(task)
        if current is None:
            unplaced.append(task)
            continue
        inst = instances[current.instance_id]
        # A promotion decided in an earlier round whose revoke did not take (its owner missed
        # that assignment, or the round was redone) stands, asked for again or not: nobody
        # asks twice for a learner the leader already promoted.
        decided = task in memory.moving
        ready = (_open_copy(task, learner_lags, instances, config.acceptable_lag,
                            inst.instance_id)
                 if (promote or decided) and kind and task in learner_lags else None)
        destination: str | None = inst.instance_id
        caught_up = (_caught_up_copy(task, [learner_lags, standby_lags], instances, config,
                                     inst.instance_id)
                     if kind and use_learners and task in current.slow_restores else None)
        if inst.leaving and open_ids:
            if _expired(inst, now_ms) or not kind or not use_learners:
                destination = (ready or _open_copy(task, learner_lags, instances)
                               or _open_copy(task, standby_lags, instances))
            elif ready is not None:
                destination = ready
        elif caught_up is not None:
            # Its owner restores it from far behind (it lost its state): a copy that is
            # caught up runs it after the next round, and the owner learns it back.
            destination = caught_up
            learn_back.append((task, inst.instance_id, caught_up))
        elif ready is not None and use_learners:
            promotable.append((task, ready))
        if destination is None:
            unplaced.append(task)
            continue
        if destination != inst.instance_id:
            plan.promoted[task] = destination
        elif (held := memory.lost.get(task)) is not None and held[0] == current.key:
            # Held for this member, which is back from a pause still running it: all it
            # held stays with it this round, as with a member that restarts.
            plan.returning.add(task)
        plan.target[task] = destination
    load.add_running(plan.target, stateful)
    for task, source, destination in learn_back[:config.max_learners]:
        # Its learner counts where it will run once ready, as any learner's task does.
        plan.learners[task] = source
        load.move(task, True, destination, source)

    # Unowned tasks: a ready learner, the member it was moving to, its previous owner, its
    # most caught-up copy; only then load (balance may move it later, through a learner).
    cold: list[str] = []
    moving, owners = memory.moving, memory.owners
    for task in unplaced:
        kind = stateful[task]
        copied = kind and (task in learner_lags or task in standby_lags)
        if not copied and task not in moving and task not in owners:
            cold.append(task)
            continue
        destination = None
        if copied:
            destination = _open_copy(task, learner_lags, instances, config.acceptable_lag)
        destination = (destination or _open_member(moving.get(task), instances)
                       or _open_member(owners.get(task), instances))
        if destination is None and copied:
            destination = _warm_copy(task, kind, [learner_lags, standby_lags], instances,
                                     load, config)
        if destination is None and kind and use_learners:
            destination = _leaving_keeper(owners.get(task), present, instances, now_ms)
        if destination is None:
            cold.append(task)
            continue
        # Only the member itself gets its task back past balance: a task whose hold ended
        # without its member goes to the instance's other threads as any task would, and
        # balance spreads it (that instance may have fewer threads than it had).
        held = memory.lost.get(task)
        if (held is not None and held[0] in present and held[0][0] == destination
                and task not in moving):
            plan.returning.add(task)
        plan.target[task] = destination
        load.add(destination, task, kind)
    for task in cold:
        kind = stateful[task]
        destination = load.lightest(kind) if open_ids else min(
            instances, key=lambda i: (load.ratio(i, kind), i))
        assert destination is not None
        plan.target[task] = destination
        load.add(destination, task, kind)

    # Ready learners of running tasks take over, all at once, while the move still helps
    # balance (a change since the learner was placed may have made it needless).
    for task, ready in promotable:
        source = plan.target[task]
        if load.needed(source, ready, True):
            plan.target[task] = ready
            plan.promoted[task] = ready
            load.move(task, True, source, ready)


# -- balancing ------------------------------------------------------------------------------


def _balance_directly(
    plan: _Plan,
    load: _Load,
    kind: bool,
    owner: dict[str, Member],
    order: dict[str, int],
    config: AssignorConfig,
) -> None:
    """Stateless tasks (and, without learners, every task) move at once, heaviest instance
    to lightest, until balanced."""
    for _ in range(len(plan.target) + 1):
        heavy, light = load.heaviest_in_total(kind), load.lightest_in_total(kind)
        if heavy is None or light is None or not load.unbalanced(heavy, light, kind,
                                                                 config.tolerance):
            return
        movable = _movable(plan, load, heavy, kind)
        if not movable:
            if any(t in plan.returning for t in load.tasks[(heavy, kind)]):
                plan.over_returned.add(heavy)
            return
        _move_one(plan, load, kind, movable, heavy, light, owner, order)


def _movable(plan: _Plan, load: _Load, inst: str, kind: bool) -> list[str]:
    """The tasks of ``kind`` planned on ``inst`` that balance may move now. A member that
    returns within the delay gets all its tasks back: balance moves them, if it must, from
    the next round on."""
    return [t for t in load.tasks[(inst, kind)]
            if plan.target[t] == inst and t not in plan.returning]


def _move_one(plan: _Plan, load: _Load, kind: bool, movable: list[str], source: str,
              destination: str, owner: dict[str, Member], order: dict[str, int]) -> None:
    """Move one of ``movable`` at once: a task not running anywhere yet first (no revoke),
    then the highest id."""
    task = min(movable, key=lambda t: (t in owner, -order[t]))
    plan.target[task] = destination
    plan.promoted.pop(task, None)
    load.move(task, kind, source, destination)


def _balance_totals(
    plan: _Plan,
    load: _Load,
    owner: dict[str, Member],
    order: dict[str, int],
    config: AssignorConfig,
) -> None:
    """Stateless tasks even out the tasks per thread in total, not per kind alone: an
    instance whose thread runs a stateful and a stateless task beside a new instance whose
    threads run nothing is balanced per kind (one task per thread apart), not in total.
    Called once no stateful task is still to move, so that the stateless tasks are spread
    around where the stateful ones end up, and not moved again as each of those arrives. A
    move keeps the stateless tasks balanced per kind and lowers the imbalance of the totals."""
    tolerance = config.tolerance
    open_ids = sorted(load.open)
    if len(open_ids) < 2:
        return

    def total(inst: str) -> int:
        return load.count[(inst, True)] + load.count[(inst, False)]

    def stateless_spread_after(source: str, destination: str) -> float:
        ratios = [(load.count[(i, False)] - (i == source) + (i == destination)) / load.cap[i]
                  for i in open_ids]
        return max(ratios) - min(ratios)

    for _ in range(len(plan.target) + 1):
        by_total = sorted(open_ids, key=lambda i: (total(i) / load.cap[i], i))
        top, bottom = by_total[-1], by_total[0]
        if (total(top) * load.cap[bottom] - total(bottom) * load.cap[top]
                <= tolerance * load.cap[top] * load.cap[bottom]):
            return
        moved = False
        for heavy in reversed(by_total):
            movable = _movable(plan, load, heavy, False)
            if not movable:
                continue
            cap_h, t_h = load.cap[heavy], total(heavy)
            for light in by_total:
                if light == heavy:
                    break
                cap_l, t_l = load.cap[light], total(light)
                # Two instances within the tolerance of each other trade a task only for
                # the group's extremes: the heaviest, or the lightest when the heaviest has
                # nothing it may give (its stateless task would unbalance that kind).
                if (t_h * cap_l - t_l * cap_h <= tolerance * cap_h * cap_l
                        and heavy != top and light != bottom):
                    break  # the lighter ones after it are nearer still
                # Each move lowers the sum of total²/capacity: the loop ends.
                if (2 * t_h - 1) * cap_l <= (2 * t_l + 1) * cap_h:
                    continue
                before = stateless_spread_after(heavy, heavy)
                if stateless_spread_after(heavy, light) > max(before, tolerance) + 1e-9:
                    continue
                _move_one(plan, load, False, movable, heavy, light, owner, order)
                moved = True
                break
            if moved:
                break
        if not moved:
            return


def _place_learners(
    plan: _Plan,
    load: _Load,
    stateful: dict[str, bool],
    owner: dict[str, Member],
    instances: dict[str, _Instance],
    open_ids: list[str],
    learner_lags: dict[str, dict[str, int]],
    standby_lags: dict[str, dict[str, int]],
    order: dict[str, int],
    config: AssignorConfig,
) -> None:
    used = len(plan.learners)  # owners learning back a task they restored from far behind
    # Existing learners stay while their move is still needed. Learners promoted this round
    # do not hold a slot: their slot is filled in the same round.
    for task in sorted(learner_lags, key=lambda t: order.get(t, -1)):
        if used >= config.max_learners:
            break
        if not stateful.get(task) or task not in plan.target or task in plan.promoted:
            continue
        current = owner.get(task)
        source = plan.target[task]
        if current is not None and source != current.instance_id:
            continue
        destination = _open_copy(task, learner_lags, instances, exclude=source)
        if destination is None:
            continue
        # A leaving instance's tasks are placed below, among every copy (learner or standby).
        if source not in load.open:
            continue
        if load.needed(source, destination, True):
            plan.learners[task] = destination
            load.move(task, True, source, destination)
            used += 1

    # Tasks of leaving instances: a learner on the most caught-up copy (a learner already
    # there, or a standby) whose instance has room, of equal copies the one with the fewest
    # tasks per thread in total once it has it; else on the instance with room and the
    # fewest in total, else on the lightest. A caught-up standby there takes the task over
    # at once instead. A learner placed when the group was another (an
    # instance joined or left since) is dropped where it would now be one too many: kept, its
    # task would move again once promoted.
    # Tasks whose learner is already under way come first, so that a learner is not
    # displaced (its restore started over elsewhere) by a task placed before it.
    leaving_tasks = sorted(
        ((task, inst_id) for inst_id, inst in instances.items() if inst.leaving
         for task in load.tasks[(inst_id, True)]),
        key=lambda ti: (not any(not instances[i].leaving
                                for i in learner_lags.get(ti[0], {})), order[ti[0]]))
    for task, inst_id in leaving_tasks:
        if used >= config.max_learners:
            return
        if plan.target[task] != inst_id or task in plan.learners:
            continue
        copies = dict(standby_lags.get(task, {}))
        for i, lag in learner_lags.get(task, {}).items():
            copies[i] = min(lag, copies.get(i, lag))
        holders = sorted(
            (lag, (load.count[(i, True)] + load.count[(i, False)] + 1) / load.cap[i], i)
            for i, lag in copies.items()
            if i != inst_id and not instances[i].leaving
            and load.has_room(i, True, config.tolerance))
        destination = (holders[0][2] if holders
                       else load.roomiest_in_total(config.tolerance)
                       or load.lightest_in_total(True))
        if destination is None:
            return
        standby_lag = standby_lags.get(task, {}).get(destination)
        if task in owner and standby_lag is not None and standby_lag <= config.acceptable_lag:
            # A caught-up standby there takes the task over in this round, as in a balance
            # move below: no learner to place, no round to ask for it.
            plan.target[task] = destination
            plan.promoted[task] = destination
            load.move(task, True, inst_id, destination)
            continue
        plan.learners[task] = destination
        load.move(task, True, inst_id, destination)
        used += 1

    # Balance through learners, heaviest instance first.
    while used < config.max_learners:
        heavy, light = load.heaviest_in_total(True), load.lightest_in_total(True)
        if heavy is None or light is None or not load.unbalanced(
                heavy, light, True, config.tolerance) or not load.needed(heavy, light, True):
            return
        # Tasks that run there, and those that go back there this round (a restarted
        # instance reports nothing running): a round nobody asks for may not follow.
        per_member: dict[str, int] = defaultdict(int)
        candidates = []
        for task in load.tasks[(heavy, True)]:
            current = owner.get(task)
            if (current is None or current.instance_id == heavy) and (
                    plan.target[task] == heavy and task not in plan.learners
                    and task not in plan.promoted and task not in plan.returning):
                if current is not None:
                    per_member[current.member_id] += 1
                candidates.append(task)
        if not candidates:
            if any(t in plan.returning for t in load.tasks[(heavy, True)]):
                plan.over_returned.add(heavy)
            return
        copies_on_light = {t: standby_lags[t][light] for t in candidates
                           if light in standby_lags.get(t, {})}
        # A task with a copy on the light instance first, then one from the busiest thread.
        task = min(candidates, key=lambda t: (
            t not in copies_on_light, copies_on_light.get(t, 0), t not in owner,
            -per_member[owner[t].member_id] if t in owner else 0, order[t]))
        if task in owner and 0 <= copies_on_light.get(task, -1) <= config.acceptable_lag:
            # A caught-up standby there takes the task over in this round, as a ready
            # learner would: no restore to wait for, so no round to ask for it either.
            plan.target[task] = light
            plan.promoted[task] = light
            load.move(task, True, heavy, light)
            continue
        plan.learners[task] = light
        load.move(task, True, heavy, light)
        used += 1


# -- standbys ---------------------------------------------------------------------------------


def _place_standbys(
    plan: _Plan,
    owner: dict[str, Member],
    stateful: dict[str, bool],
    instances: dict[str, _Instance],
    open_ids: list[str],
    standby_lags: dict[str, dict[str, int]],
    learner_lags: dict[str, dict[str, int]],
    config: AssignorConfig,
) -> None:
    """``num_standbys`` copies of each stateful task on distinct open instances other than the
    ones that run or learn it, existing copies first. A held task keeps every copy it has
    (learners become standbys) so that it can come back warm, and its member's sibling
    threads may hold one (it runs nowhere while held)."""
    count: dict[str, int] = defaultdict(int)
    heap = [(0.0, 0, i) for i in open_ids]
    cap = {i: instances[i].capacity for i in open_ids}

    def take(inst: str) -> None:
        count[inst] += 1
        heapq.heappush(heap, (count[inst] / cap[inst], count[inst], inst))

    for task, kind in stateful.items():
        if not kind:
            continue
        held = plan.held.get(task)
        excluded: set[str | None] = set()
        if held is not None:
            # Its member's instance counts while a sibling thread is there: when the delay
            # ends the task goes to that thread, and its copy keeps the local state current.
            existing = {**learner_lags.get(task, {}), **standby_lags.get(task, {})}
            want = max(config.num_standbys, len(existing))
        else:
            if not config.num_standbys:
                continue
            existing = standby_lags.get(task, {})
            want = config.num_standbys
            current = owner.get(task)
            excluded = {plan.target.get(task), plan.learners.get(task), plan.promoted.get(task),
                        None if current is None else current.instance_id}
        picked: list[str] = []
        if len(existing) == 1:
            [inst] = existing
            if inst not in excluded and inst in cap:
                picked = [inst]
                take(inst)
                if want == 1:
                    plan.standbys[task] = picked
                    continue
        elif existing:
            chosen = sorted((lag, i) for i, lag in existing.items()
                            if i not in excluded and i in cap)[:want]
            picked = [i for _, i in chosen]
            for inst in picked:
                take(inst)
        skipped = []
        while len(picked) < want and heap:
            entry = heapq.heappop(heap)
            _, c, inst = entry
            if c != count[inst]:
                continue
            if inst in excluded or inst in picked:
                skipped.append(entry)
                continue
            picked.append(inst)
            take(inst)
        for entry in skipped:
            heapq.heappush(heap, entry)
        if picked:
            plan.standbys[task] = picked


# -- threads ----------------------------------------------------------------------------------


def _distribute(
    members: list[Member],
    tasks: list[str],
    preferred: dict[str, str],
    extra_first: set[str] | None = None,
    running: dict[str, str] | None = None,
) -> dict[str, str]:
    """Spread ``tasks`` over ``members`` so that counts differ by at most one, keeping as many
    tasks as possible on their preferred member. ``extra_first``: members to give the
    remainder to last (those that got it for the other kind). ``running``: the member each
    task runs on now; over its quota, a member keeps the tasks it runs before those that
    would arrive (moving a running task to a sibling thread costs it two rounds, an arriving
    one's copy is handed over within the process)."""
    n = len(members)
    q, r = divmod(len(tasks), n)
    mine: dict[str, list[str]] = defaultdict(list)
    runs = running or {}
    for task in sorted(tasks, key=lambda t: runs.get(t) != preferred.get(t)):
        if task in preferred:
            mine[preferred[task]].append(task)
    # The remainder goes to members without an extra task of the other kind first (so that
    # the threads' totals differ by at most one too), then to those that keep most.
    avoid = extra_first or set()
    ranked = sorted(members, key=lambda m: (m.member_id in avoid, -len(mine[m.member_id]),
                                            m.thread))
    quota = {m.member_id: q + (1 if k < r else 0) for k, m in enumerate(ranked)}
    placed: dict[str, str] = {}
    counts: dict[str, int] = defaultdict(int)
    for member in members:
        for task in mine[member.member_id][:quota[member.member_id]]:
            placed[task] = member.member_id
            counts[member.member_id] += 1
    slots = iter([m.member_id for m in members for _ in range(
        quota[m.member_id] - counts[m.member_id])])
    for task in tasks:
        if task not in placed:
            placed[task] = next(slots)
    return placed


def _per_thread(
    plan: _Plan,
    instances: dict[str, _Instance],
    owner: dict[str, Member],
    stateful: dict[str, bool],
    memory: LeaderMemory,
    order: dict[str, int],
) -> None:
    """Each instance's tasks over its threads, per kind, sticky: a task stays on the thread
    that runs it, and an arriving task goes to the thread it was moving to or last ran on.
    A task that changes thread (or instance) is revoked now and runs there from the next
    round."""
    by_instance: dict[tuple[str, bool], list[str]] = defaultdict(list)
    for task in sorted(plan.target, key=order.__getitem__):
        by_instance[(plan.target[task], stateful[task])].append(task)
    for inst_id, inst in sorted(instances.items()):
        member_of_key = {m.key: m.member_id for m in inst.members}
        thread_of = {m.member_id: m.thread for m in inst.members}
        got_extra: set[str] = set()
        copy_holders: dict[str, str] | None = None
        for kind in (True, False):
            tasks = by_instance.get((inst_id, kind), [])
            if not tasks:
                continue
            preferred: dict[str, str] = {}
            for task in tasks:
                current = owner.get(task)
                if current is not None and current.instance_id == inst_id:
                    preferred[task] = current.member_id
                    continue
                for key in (memory.moving.get(task), memory.owners.get(task)):
                    if key is not None and key in member_of_key:
                        preferred[task] = member_of_key[key]
                        break
                else:
                    # A task arriving on the instance: the thread that holds its copy (the
                    # promoted learner's store is there).
                    if copy_holders is None:
                        copy_holders = {}
                        for attribute in ("learners", "standbys"):
                            for m in inst.members:
                                for t in getattr(m, attribute):
                                    copy_holders.setdefault(t, m.member_id)
                    if task in copy_holders:
                        preferred[task] = copy_holders[task]
            unsynced = {m.member_id for m in inst.members if m.unsynced}
            if inst.leaving:
                # A leaving instance only hands tasks over: no moves between its threads.
                placed = {t: preferred[t] for t in tasks if t in preferred}
                rest = [t for t in tasks if t not in preferred]
                placed.update(_distribute(inst.members, rest, {}))
            elif unsynced and len(unsynced) < len(inst.members):
                placed = _distribute_around(inst.members, tasks, preferred, unsynced, owner,
                                            got_extra)
            else:
                running = {t: owner[t].member_id for t in tasks
                           if t in owner and owner[t].instance_id == inst_id}
                placed = _distribute(inst.members, tasks, preferred, got_extra, running)
            counts = {m.member_id: 0 for m in inst.members}
            for task, member_id in placed.items():
                counts[member_id] += 1
                current = owner.get(task)
                if current is None and task in plan.released:
                    # Only a member given an error claims it, and revokes it this round.
                    plan.moving[task] = (inst_id, thread_of[member_id])
                    plan.waiting.add(member_id)
                elif current is None or current.member_id == member_id:
                    plan.active[member_id].append(task)
                else:
                    plan.revoke[current.member_id].add(task)
                    plan.moving[task] = (inst_id, thread_of[member_id])
            if kind:
                # Threads given one stateful task more than a sibling (those with none count).
                top = max(counts.values(), default=0)
                got_extra = {m for m, c in counts.items() if c == top} if len(
                    set(counts.values())) > 1 else set()


def _distribute_around(
    members: list[Member],
    tasks: list[str],
    preferred: dict[str, str],
    unsynced: set[str],
    owner: dict[str, Member],
    extra_first: set[str] | None = None,
) -> dict[str, str]:
    """:func:`_distribute` when some threads may still wait for their last assignment: they
    keep the tasks they run, and every other task goes to the other threads (a copy a waiting
    thread holds is handed over within the process). Balance between the threads returns in
    a later round, once they all have their assignments."""
    kept = {t: preferred[t] for t in tasks if preferred.get(t) in unsynced
            and owner.get(t) is not None and owner[t].member_id == preferred[t]}
    others = [m for m in members if m.member_id not in unsynced]
    rest = [t for t in tasks if t not in kept]
    placed = dict(kept)
    placed.update(_distribute(others, rest,
                              {t: p for t, p in preferred.items() if p not in unsynced},
                              extra_first))
    return placed


# -- assignments -----------------------------------------------------------------------------


def _copies_per_member(
    instances: dict[str, _Instance],
    tasks_by_instance: dict[str, list[str]],
    kind: str,
) -> dict[str, list[str]]:
    """Copies of each instance over its threads. A copy stays on the thread that holds it,
    whatever the counts: moving it to another thread would start its restore over (a learner
    that restarts makes its move wait, and the rounds of a big move no longer line up). A new
    copy goes to the thread with the fewest copies."""
    result: dict[str, list[str]] = defaultdict(list)
    for inst_id, tasks in tasks_by_instance.items():
        inst = instances[inst_id]
        holders: dict[str, str] = {}
        for attribute in (kind, "learners", "standbys", "slow_restores"):
            for m in inst.members:
                for t in getattr(m, attribute):
                    holders.setdefault(t, m.member_id)
        counts = {m.member_id: 0 for m in inst.members}
        fresh = []
        for task in tasks:
            holder = holders.get(task)
            if holder is None:
                fresh.append(task)
            else:
                result[holder].append(task)
                counts[holder] += 1
        if fresh:
            # How many new copies each thread takes, fewest first; then handed out in task
            # order, a run of neighbouring tasks per thread (fewer topics per thread's list).
            heap = [(counts[m.member_id], m.thread, m.member_id) for m in inst.members]
            heapq.heapify(heap)
            takes: dict[str, int] = defaultdict(int)
            for _ in fresh:
                count, thread, member_id = heapq.heappop(heap)
                takes[member_id] += 1
                heapq.heappush(heap, (count + 1, thread, member_id))
            queue = iter(fresh)
            for m in inst.members:
                result[m.member_id].extend(next(queue) for _ in range(takes[m.member_id]))
    return result


def _assignments(
    plan: _Plan,
    instances: dict[str, _Instance],
    by_key: dict[MemberKey, Member],
    stateful: dict[str, bool],
    order: dict[str, int],
    members: list[Member],
    now_ms: int,
    noted_at: int,
    formed_at: int,
    delay_ms: int,
) -> dict[str, MemberAssignment]:
    learner_tasks: dict[str, list[str]] = defaultdict(list)
    for task, inst in (*plan.learners.items(), *plan.promoted.items()):
        if not instances[inst].leaving:
            learner_tasks[inst].append(task)
    standby_tasks: dict[str, list[str]] = defaultdict(list)
    for task, insts in plan.standbys.items():
        for inst in insts:
            standby_tasks[inst].append(task)
    learners = _copies_per_member(instances, learner_tasks, "learners")
    standbys = _copies_per_member(instances, standby_tasks, "standbys")

    targeted: dict[str, int] = defaultdict(int)
    for inst in plan.target.values():
        targeted[inst] += 1
    releases = [since + delay_ms - now_ms for _, since in plan.held.values()]
    for inst in instances.values():
        pending = inst.leaving and inst.deadline_ms is not None and inst.deadline_ms > now_ms
        if pending and targeted[inst.instance_id]:
            releases.append(inst.deadline_ms - now_ms)  # type: ignore[operator]
    group_timer = max(0, min(releases)) if releases else None

    incoming: dict[MemberKey, list[str]] = defaultdict(list)
    for task, key in plan.moving.items():
        incoming[key].append(task)
    held_for: dict[MemberKey, dict[str, int]] = defaultdict(dict)
    for task, (key, since) in plan.held.items():
        held_for[key][task] = since
    actives_by_key = {m.key: plan.active.get(m.member_id, []) for m in members}
    notes = build_notes(noted_at, formed_at, members, actives_by_key, incoming, held_for)

    def ordered(tasks: Iterable[str]) -> tuple[str, ...]:
        # A task the app no longer has (a member of an older topology reports it) is revoked
        # too, after the app's own.
        return tuple(sorted(tasks, key=lambda t: (0, order[t], "") if t in order
                            else (1, 0, t)))

    learned = set(plan.learners)
    result: dict[str, MemberAssignment] = {}
    for inst in instances.values():
        for member in inst.members:
            mid = member.member_id
            revoked = ordered(plan.revoke.get(mid, ()))
            mine = ordered(plan.active.get(mid, ()))
            # A leaving instance is told to shut down in the round that revokes its last
            # tasks (the learner design). The runtime has it take part in the next round,
            # which assigns them, before it leaves: its departure alone may start no round.
            shutdown = inst.leaving and not mine and not targeted[inst.instance_id]
            # Nothing else would start the round that moves what balance could not.
            follow_up = mid in plan.waiting or (inst.instance_id in plan.over_returned and any(
                t in plan.returning for t in mine))
            result[mid] = MemberAssignment(
                active=mine,
                being_learned=tuple(t for t in mine if t in learned),
                learners=() if inst.leaving else ordered(learners.get(mid, ())),
                standbys=() if inst.leaving else ordered(standbys.get(mid, ())),
                revoked=revoked,
                rejoin_after_ms=0 if revoked or follow_up else group_timer,
                shutdown=shutdown,
                notes=notes[mid],
            )
    return result
