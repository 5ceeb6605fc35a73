"""The learner assignor: a pure function from the group's state to every member's assignment.

Order of work (seed 003, with seed 000's cooperative and deferred designs):

1. members: drop duplicate static ids (the newcomer gets an error), group threads into
   instances, note leaving instances and their scale-down deadlines;
2. lost tasks: a vanished instance's tasks are held back for ``lost_task_delay_ms``;
3. actives: currently running tasks stay, unless a ready learner elsewhere takes them (or the
   scale-down timeout of a leaving owner passed); unowned tasks go to a ready learner, the
   previous owner, an unready learner, a standby, or the least loaded instance;
4. stateless balance: stateless tasks move at once (cooperatively);
5. learners: existing learners stay until promoted; new ones are picked from the most loaded
   instances (and from leaving ones) for the least loaded instances, at most ``max_learners``;
6. cooperative safety: a task whose owner changes is revoked this round and assigned next;
7. standbys; then threads within each instance, sticky; then shutdowns and rejoin timers.

Everything iterates in sorted order: the same input gives the same output.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from assignor.model import (
    AssignorConfig,
    LeaderMemory,
    Member,
    MemberAssignment,
    Task,
    task_sort_key,
)


@dataclass
class _Instance:
    instance_id: str
    members: list[Member]
    leaving: bool = False
    deadline_ms: int | None = None

    @property
    def capacity(self) -> int:
        return len(self.members)


@dataclass
class _Plan:
    target: dict[str, str] = field(default_factory=dict)  # task -> instance running it
    revoke: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    learners: dict[str, str] = field(default_factory=dict)  # task -> learner instance
    standbys: dict[str, list[str]] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)  # task -> release time
    moving: dict[str, str] = field(default_factory=dict)  # task -> destination instance


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
    what the leader decided last round, or None for a new leader. ``use_learners=False``
    moves stateful tasks at once (the stop-the-world baseline).

    Returns the assignment of every member id and the leader's new memory.
    """
    memory = memory or LeaderMemory()
    ordered_tasks = sorted(tasks, key=lambda t: task_sort_key(t.task_id))
    stateful = {t.task_id: t.stateful for t in ordered_tasks}
    task_ids = list(stateful)

    valid, errors = _drop_duplicates(members)
    instances = _instances(valid, config)
    formed_at = memory.formed_at_ms if memory.formed_at_ms is not None else now_ms

    owner, conflicts = _current_owners(valid, stateful, memory)
    if config.initial_delay_ms and not owner and now_ms - formed_at < config.initial_delay_ms:
        wait = formed_at + config.initial_delay_ms - now_ms
        result = {m.member_id: MemberAssignment(rejoin_after_ms=wait) for m in valid}
        result.update(errors)
        return result, replace(memory, formed_at_ms=formed_at,
                               instances=frozenset(instances))

    learner_lags = _copies(valid, "learners")
    standby_lags = _copies(valid, "standbys")
    plan = _Plan()
    plan.held, lost = _held_back(task_ids, owner, instances, memory, config, now_ms)
    open_instances = sorted(i for i, inst in instances.items() if not inst.leaving)
    load = _Load(instances, stateful)

    # 3. actives
    for task in task_ids:
        if task in plan.held:
            continue
        current = owner.get(task)
        ready = _ready_learner(task, learner_lags, instances, config, exclude=current)
        if current is not None:
            inst = instances[current.instance_id]
            destination = inst.instance_id
            if inst.leaving and _expired(inst, now_ms) and open_instances:
                destination = (
                    _any_learner(task, learner_lags, instances)
                    or _best_standby(task, standby_lags, instances)
                    or load.least(open_instances, task)
                )
            elif ready is not None and (inst.leaving or use_learners):
                destination = ready
            plan.target[task] = destination
        else:
            plan.target[task] = (
                ready
                or _previous_owner(task, memory, instances)
                or _any_learner(task, learner_lags, instances)
                or _best_standby(task, standby_lags, instances)
                or load.least(open_instances or sorted(instances), task)
            )
        load.add(plan.target[task], task)

    # 4 and 5. balance: stateless tasks (and, without learners, every task) move at once;
    # stateful ones through learners.
    if open_instances:
        _move_directly(plan, load, open_instances, instances, owner, stateful, config,
                       everything=not use_learners)
        if use_learners:
            _place_learners(plan, load, open_instances, instances, owner, stateful,
                            learner_lags, standby_lags, config, memory, now_ms)

    # 6. cooperative: a task changing owner is revoked now and assigned next round.
    for task, destination in list(plan.target.items()):
        current = owner.get(task)
        if current is not None and current.instance_id != destination:
            plan.revoke[current.member_id].add(task)
            plan.moving[task] = destination
            del plan.target[task]
    for member_id, tasks_ in conflicts.items():
        plan.revoke[member_id] |= tasks_

    _place_standbys(plan, owner, stateful, instances, standby_lags, memory, config)
    result = _per_thread(plan, instances, owner, learner_lags, standby_lags, now_ms, config)
    result.update(errors)

    new_memory = LeaderMemory(
        instances=frozenset(instances),
        owners={
            **{t: i for t, i in plan.target.items()},
            **{t: owner[t].instance_id for t in plan.moving},
        },
        lost=lost,
        formed_at_ms=formed_at,
        moving=dict(plan.moving),
    )
    return result, new_memory


# -- members and instances -----------------------------------------------------------------


def _drop_duplicates(
    members: Iterable[Member],
) -> tuple[list[Member], dict[str, MemberAssignment]]:
    by_static: dict[tuple[str, int], list[Member]] = defaultdict(list)
    for member in sorted(members, key=lambda m: m.member_id):
        by_static[(member.instance_id, member.thread)].append(member)
    valid: list[Member] = []
    errors: dict[str, MemberAssignment] = {}
    for (instance, thread), group in sorted(by_static.items()):
        keep = min(group, key=lambda m: (not m.active, m.member_id))
        valid.append(keep)
        for other in group:
            if other is not keep:
                errors[other.member_id] = MemberAssignment(
                    error=f"duplicate group instance id {instance}-thread-{thread}: another "
                    f"member ({keep.member_id}) already uses it"
                )
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
    claims: dict[str, list[Member]] = defaultdict(list)
    conflicts: dict[str, set[str]] = defaultdict(set)
    for member in members:
        for task in sorted(member.active):
            if task in stateful:
                claims[task].append(member)
            else:
                conflicts[member.member_id].add(task)
    owner: dict[str, Member] = {}
    for task, claimants in claims.items():
        previous = memory.owners.get(task)
        keep = min(claimants, key=lambda m: (m.instance_id != previous, m.member_id))
        owner[task] = keep
        for other in claimants:
            if other is not keep:
                conflicts[other.member_id].add(task)
    return owner, conflicts


def _copies(members: list[Member], kind: str) -> dict[str, dict[str, int]]:
    """task -> instance -> the smallest lag of that instance's copies of the task."""
    copies: dict[str, dict[str, int]] = defaultdict(dict)
    for member in members:
        for task, lag in getattr(member, kind).items():
            per_instance = copies[task]
            per_instance[member.instance_id] = min(lag, per_instance.get(member.instance_id, lag))
    return copies


def _held_back(
    task_ids: list[str],
    owner: dict[str, Member],
    instances: dict[str, _Instance],
    memory: LeaderMemory,
    config: AssignorConfig,
    now_ms: int,
) -> tuple[dict[str, int], dict[str, tuple[str, int]]]:
    held: dict[str, int] = {}
    lost: dict[str, tuple[str, int]] = {}
    if not config.lost_task_delay_ms:
        return held, lost
    for task in task_ids:
        previous = memory.owners.get(task)
        if task in owner or previous is None or previous in instances:
            continue
        remembered = memory.lost.get(task)
        since = remembered[1] if remembered and remembered[0] == previous else now_ms
        if now_ms < since + config.lost_task_delay_ms:
            held[task] = since + config.lost_task_delay_ms
            lost[task] = (previous, since)
    return held, lost


# -- preferences -----------------------------------------------------------------------------


def _closest_copy(
    task: str,
    lags: dict[str, dict[str, int]],
    instances: dict[str, _Instance],
    max_lag: int | None = None,
    exclude: str | None = None,
) -> str | None:
    """The non-leaving instance with the least-lagging copy of ``task`` (within ``max_lag``)."""
    candidates = sorted(
        (lag, inst) for inst, lag in lags.get(task, {}).items()
        if not instances[inst].leaving and inst != exclude
        and (max_lag is None or lag <= max_lag)
    )
    return candidates[0][1] if candidates else None


def _ready_learner(
    task: str,
    learner_lags: dict[str, dict[str, int]],
    instances: dict[str, _Instance],
    config: AssignorConfig,
    exclude: Member | None,
) -> str | None:
    return _closest_copy(task, learner_lags, instances, config.acceptable_lag,
                         None if exclude is None else exclude.instance_id)


def _any_learner(
    task: str, learner_lags: dict[str, dict[str, int]], instances: dict[str, _Instance]
) -> str | None:
    return _closest_copy(task, learner_lags, instances)


def _best_standby(
    task: str, standby_lags: dict[str, dict[str, int]], instances: dict[str, _Instance]
) -> str | None:
    return _closest_copy(task, standby_lags, instances)


def _previous_owner(
    task: str, memory: LeaderMemory, instances: dict[str, _Instance]
) -> str | None:
    for candidate in (memory.moving.get(task), memory.owners.get(task)):
        if candidate in instances and not instances[candidate].leaving:
            return candidate
    return None


class _Load:
    """Planned active tasks per instance, stateful and stateless counted apart."""

    def __init__(self, instances: dict[str, _Instance], stateful: dict[str, bool]) -> None:
        self.instances = instances
        self.stateful = stateful
        self.count: dict[tuple[str, bool], int] = defaultdict(int)

    def add(self, inst: str, task: str, delta: int = 1) -> None:
        self.count[(inst, self.stateful[task])] += delta

    def move(self, task: str, source: str, destination: str) -> None:
        self.add(source, task, -1)
        self.add(destination, task)

    def of(self, inst: str, kind: bool) -> int:
        return self.count[(inst, kind)]

    def least(self, candidates: Sequence[str], task: str) -> str:
        return self.lightest(candidates, self.stateful[task])

    def lightest(self, candidates: Sequence[str], kind: bool) -> str:
        return min(candidates, key=lambda i: (
            self.of(i, kind) / self.instances[i].capacity, self.of(i, kind), i))

    def most(self, candidates: Sequence[str], kind: bool) -> str:
        return max(candidates, key=lambda i: (
            self.of(i, kind) / self.instances[i].capacity, self.of(i, kind), _neg(i)))

    def unbalanced(self, heavy: str, light: str, kind: bool, tolerance: int) -> bool:
        cap_h, cap_l = self.instances[heavy].capacity, self.instances[light].capacity
        return (self.of(heavy, kind) * cap_l - self.of(light, kind) * cap_h
                > tolerance * cap_h * cap_l)


def _neg(text: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in text)


# -- balancing ------------------------------------------------------------------------------


def _move_directly(
    plan: _Plan,
    load: _Load,
    open_instances: list[str],
    instances: dict[str, _Instance],
    owner: dict[str, Member],
    stateful: dict[str, bool],
    config: AssignorConfig,
    everything: bool,
) -> None:
    kinds = [False, True] if everything else [False]
    for kind in kinds:
        # Off leaving instances first, then from the heaviest to the lightest.
        for task, inst in sorted(plan.target.items(), key=lambda kv: task_sort_key(kv[0])):
            if stateful[task] == kind and instances[inst].leaving:
                destination = load.least(open_instances, task)
                load.move(task, inst, destination)
                plan.target[task] = destination
        for _ in range(len(plan.target) + 1):
            heavy = load.most(open_instances, kind)
            light = load.lightest(open_instances, kind)
            if not load.unbalanced(heavy, light, kind, config.tolerance):
                break
            movable = [t for t, i in plan.target.items() if i == heavy and stateful[t] == kind]
            # Prefer a task that is not running anywhere yet, then the highest id.
            movable.sort(key=lambda t: (t in owner, _neg_task(t)))
            task = movable[0]
            plan.target[task] = light
            load.move(task, heavy, light)


def _neg_task(task: str) -> tuple[int, int]:
    sub, partition = task_sort_key(task)
    return -sub, -partition


def _place_learners(
    plan: _Plan,
    load: _Load,
    open_instances: list[str],
    instances: dict[str, _Instance],
    owner: dict[str, Member],
    stateful: dict[str, bool],
    learner_lags: dict[str, dict[str, int]],
    standby_lags: dict[str, dict[str, int]],
    config: AssignorConfig,
    memory: LeaderMemory,
    now_ms: int,
) -> None:
    # Existing learners stay until promoted, including through the round in which their task
    # is revoked from its old owner (it becomes active there in the next round).
    for task in sorted(learner_lags, key=task_sort_key):
        if task not in stateful or not stateful[task] or task in plan.held:
            continue
        running_on = plan.target.get(task)
        current = owner.get(task)
        for inst in sorted(learner_lags[task]):
            if instances[inst].leaving or task in plan.learners or running_on is None:
                continue
            if current is None or current.instance_id == inst:
                continue  # promoted now, or its instance already runs the task
            plan.learners[task] = inst
            if running_on != inst:
                load.move(task, running_on, inst)
    # Tasks of leaving instances need a learner on an open instance.
    for task, inst in sorted(plan.target.items(), key=lambda kv: task_sort_key(kv[0])):
        if len(plan.learners) >= config.max_learners:
            break
        if stateful[task] and instances[inst].leaving and task not in plan.learners:
            destination = _learner_destination(task, load, open_instances, standby_lags,
                                               memory, instances)
            plan.learners[task] = destination
            load.move(task, inst, destination)
    # Balance through learners, heaviest instance first.
    while len(plan.learners) < config.max_learners:
        heavy = load.most(open_instances, True)
        candidates = [t for t, i in plan.target.items()
                      if i == heavy and stateful[t] and t not in plan.learners]
        if not candidates:
            break
        light = load.lightest(open_instances, True)
        if not load.unbalanced(heavy, light, True, config.tolerance):
            break
        candidates.sort(key=lambda t: (light not in standby_lags.get(t, {}), task_sort_key(t)))
        task = candidates[0]
        if owner.get(task) is None:
            # Not running anywhere yet: nothing to learn, place it at once.
            plan.target[task] = light
        else:
            plan.learners[task] = light
        load.move(task, heavy, light)


def _learner_destination(
    task: str,
    load: _Load,
    open_instances: list[str],
    standby_lags: dict[str, dict[str, int]],
    memory: LeaderMemory,
    instances: dict[str, _Instance],
) -> str:
    standby = _best_standby(task, standby_lags, instances)
    if standby is not None and standby in open_instances:
        return standby
    return load.least(open_instances, task)


def _place_standbys(
    plan: _Plan,
    owner: dict[str, Member],
    stateful: dict[str, bool],
    instances: dict[str, _Instance],
    standby_lags: dict[str, dict[str, int]],
    memory: LeaderMemory,
    config: AssignorConfig,
) -> None:
    if not config.num_standbys:
        return
    count: dict[str, int] = defaultdict(int)
    for task in stateful:
        if not stateful[task] or task in plan.held:
            continue
        excluded = {plan.target.get(task), plan.learners.get(task), plan.moving.get(task)}
        if task in owner:
            excluded.add(owner[task].instance_id)
        candidates = [i for i in sorted(instances)
                      if i not in excluded and not instances[i].leaving]
        previous = memory.owners.get(task)

        def preference(inst: str, task: str = task, previous: str | None = previous) -> tuple:
            has_copy = inst in standby_lags.get(task, {})
            return (not has_copy, inst != previous,
                    count[inst] / instances[inst].capacity, inst)

        chosen = sorted(candidates, key=preference)[: config.num_standbys]
        for inst in chosen:
            count[inst] += 1
        plan.standbys[task] = chosen


# -- threads, shutdowns, timers ---------------------------------------------------------------


def _per_thread(
    plan: _Plan,
    instances: dict[str, _Instance],
    owner: dict[str, Member],
    learner_lags: dict[str, dict[str, int]],
    standby_lags: dict[str, dict[str, int]],
    now_ms: int,
    config: AssignorConfig,
) -> dict[str, MemberAssignment]:
    active: dict[str, list[str]] = defaultdict(list)
    learners: dict[str, list[str]] = defaultdict(list)
    standbys: dict[str, list[str]] = defaultdict(list)

    def spread(inst: _Instance, tasks: list[str], holders: dict[str, str],
               into: dict[str, list[str]], stateful_first: bool = False) -> None:
        members = inst.members
        for task in sorted(tasks, key=task_sort_key):
            holder = holders.get(task)
            if holder is not None:
                into[holder].append(task)
        for task in sorted(tasks, key=task_sort_key):
            if holders.get(task) is None:
                target = min(members, key=lambda m: (len(into[m.member_id]), m.thread,
                                                     m.member_id))
                into[target.member_id].append(task)

    by_instance: dict[str, list[str]] = defaultdict(list)
    for task, inst in plan.target.items():
        by_instance[inst].append(task)
    for inst_id, inst in sorted(instances.items()):
        ids = {m.member_id for m in inst.members}
        running = {t: owner[t].member_id for t in by_instance[inst_id]
                   if t in owner and owner[t].member_id in ids}
        spread(inst, by_instance[inst_id], running, active)

        learner_tasks = [t for t, i in plan.learners.items() if i == inst_id]
        holders = {t: m.member_id for m in inst.members for t in m.learners}
        spread(inst, learner_tasks, {t: h for t, h in holders.items() if t in learner_tasks},
               learners)
        standby_tasks = [t for t, insts in plan.standbys.items() if inst_id in insts]
        holders = {t: m.member_id for m in inst.members for t in m.standbys}
        spread(inst, standby_tasks,
               {t: h for t, h in holders.items() if t in standby_tasks}, standbys)

    timers: list[int] = [release - now_ms for release in plan.held.values()]
    for inst in instances.values():
        pending = inst.leaving and inst.deadline_ms is not None and inst.deadline_ms > now_ms
        if pending and inst.instance_id in plan.target.values():
            timers.append(inst.deadline_ms - now_ms)  # type: ignore[operator]
    group_timer = max(0, min(timers)) if timers else None

    learned = set(plan.learners)
    result: dict[str, MemberAssignment] = {}
    for inst in instances.values():
        for member in inst.members:
            mid = member.member_id
            revoked = sorted(plan.revoke.get(mid, ()), key=task_sort_key)
            mine = sorted(active[mid], key=task_sort_key)
            rejoin = 0 if revoked else group_timer
            shutdown = inst.leaving and not mine and not revoked and not any(
                plan.target.get(t) == inst.instance_id for t in plan.target
            )
            result[mid] = MemberAssignment(
                active=tuple(mine),
                being_learned=tuple(t for t in mine if t in learned),
                learners=() if inst.leaving else tuple(sorted(learners[mid], key=task_sort_key)),
                standbys=() if inst.leaving else tuple(sorted(standbys[mid], key=task_sort_key)),
                revoked=tuple(revoked),
                rejoin_after_ms=rejoin,
                shutdown=shutdown,
            )
    return result
