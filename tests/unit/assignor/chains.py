"""Histories that chain changes, simulated in time, and what they measure.

A history starts from a settled group and makes a chain of changes (joins, crashes of
instances and of single threads, returns of crashed threads, restarts, rolling restarts,
leaving marks, host swaps, leader changes), each either once the group settled or some time
after the change before it, so that a change may arrive in the middle of a move. Rounds
happen only when someone asks: a change, a member that revoked tasks or shut down in the
last round, a member whose learners are ready (the runtime's batched policy), or a hold's
timer; a round takes ``ROUND_MS``. The leader is a member: when it vanishes or restarts, the
next round is led from the notes the members echo.

Measured per history: every move of a task between instances (voluntary when the instance
it left is still open, forced when it vanished or is leaving), the fewest moves balance
needs summed over the changes (each from where the tasks were when it arrived), the rounds
from the first change until the group is settled, and every broken promise: a task active
twice, a hold released early or not given back, a held task with fewer standbys than it
can have or losing a copy that could take over, and a settled group that is unbalanced
(across instances per kind, or within an instance per kind and in total).

``python -m tests.unit.assignor.chains [--histories N] [--seed S]`` prints the figures.
"""

from __future__ import annotations

import argparse
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from assignor import (
    AssignorConfig,
    LeaderMemory,
    Member,
    MemberAssignment,
    MemberNotes,
    Task,
    memory_from_notes,
)
from streams.config import LEARNER_BATCH_WAIT_MS
from streams.group.learner_readiness import asks_promotion, being_promoted
from tests.unit.assignor.measures import (
    _asks_at,
    _group_learning,
    _learning,
    fewest_moves,
    open_capacity,
)
from tests.unit.assignor.simulation import Group, SimMember
from tests.unit.assignor.test_convergence import check_warm

ROUND_MS = 3_000
FAMILIES = (None, None, None, "rolling", "hostswap")
KINDS = ("join", "crash", "thread", "return", "restart", "threadrestart", "leave",
         "swap", "leader")


@dataclass(frozen=True)
class Change:
    kind: str
    #: which instance (an index into the sorted names present), or how many for a swap
    which: int = 0
    #: threads of a joining instance
    threads: int = 1
    #: ms after the change before it (after the start for the first); None: once settled
    after_ms: int | None = None


@dataclass(frozen=True)
class Setup:
    threads: tuple[int, ...]
    tasks: tuple[Task, ...]
    config: AssignorConfig
    #: seed of the copies' catch-up times (uneven between instances and tasks)
    lag_seed: int = 0
    slowest_ms: int = 20_000
    spread_ms: int = 20_000
    names: tuple[str, ...] = ()


@dataclass
class Segment:
    """From a settled group, through the changes that arrive before it settles again."""

    changes: int = 0
    #: rounds a deadline started (a hold's end, a leaving instance's scale-down timeout)
    timers: int = 0
    rounds: int = 0
    moves: int = 0
    stateful_moves: int = 0
    voluntary: int = 0
    fewest: int = 0
    fewest_voluntary: int = 0

    def bound(self, max_learners: int) -> int:
        """2 * ceil(stateful moves / max_learners) + 3, and two rounds more for each further
        change or deadline: the round it starts and the follow-up of what it revokes."""
        return (2 * math.ceil(self.stateful_moves / max_learners) + 3
                + 2 * (self.changes + self.timers - 1))


@dataclass
class Outcome:
    """A history's figures, summed over its segments (settled to settled)."""

    rounds: int = 0
    moves: int = 0
    stateful_moves: int = 0
    voluntary: int = 0
    fewest: int = 0
    fewest_voluntary: int = 0
    changes: int = 0
    segments: int = 0
    #: holds whose notes no member present carried when a new leader took over
    holds_lost: int = 0
    #: the most rounds a segment took beyond its bound (``Segment.bound``)
    excess: int = -3
    #: per segment: (changes, deadlines, rounds, stateful moves, moves, fewest moves)
    segment_log: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def over(self) -> bool:
        return self.excess > 0


def catch_up_times(seed: int, slowest_ms: int, spread_ms: int) -> Callable[[str, str], int]:
    def catch_up(instance: str, task: str) -> int:
        return max(0, slowest_ms - random.Random(f"{seed}/{instance}/{task}").randint(
            0, spread_ms))
    return catch_up


def thread_balanced(group: Group) -> list[str]:
    """Within each instance that stays, the threads' task counts differ by at most one, in
    total and stateful."""
    stateful = {t.task_id: t.stateful for t in group.tasks}
    per_instance: dict[str, list[tuple[int, int]]] = {}
    for member in group.members.values():
        if member.leaving_since_ms is None:
            per_instance.setdefault(member.instance_id, []).append(
                (len(member.active), sum(1 for t in member.active if stateful[t])))
    problems = []
    for inst, counts in sorted(per_instance.items()):
        totals = [c[0] for c in counts]
        kept = [c[1] for c in counts]
        if max(totals) - min(totals) > 1 or max(kept) - min(kept) > 1:
            problems.append(f"threads of {inst} unbalanced: (total, stateful) {counts}")
    return problems


def instance_balanced(group: Group) -> list[str]:
    """Per kind and in total, the tasks per thread of the instances that stay differ by at
    most the tolerance."""
    stateful = {t.task_id: t.stateful for t in group.tasks}
    cap = open_capacity(group)
    problems = []
    for kind in (True, False, None):
        loads = dict.fromkeys(cap, 0)
        for member in group.members.values():
            if member.instance_id in cap:
                loads[member.instance_id] += sum(1 for t in member.active
                                                 if kind is None or stateful[t] == kind)
        ratios = {i: loads[i] / cap[i] for i in cap}
        if ratios and max(ratios.values()) - min(ratios.values()) > group.config.tolerance + 1e-9:
            name = {True: "stateful", False: "stateless", None: "in total"}[kind]
            problems.append(f"instances unbalanced ({name}): "
                            f"{ {i: (loads[i], cap[i]) for i in sorted(cap)} }")
    return problems


class History:
    """One history being simulated."""

    def __init__(self, setup: Setup, rng: random.Random) -> None:
        self.setup = setup
        self.rng = rng
        self.group = Group(list(setup.tasks), setup.config)
        self.names = list(setup.names) or [f"h{n}" for n in range(40)]
        self.used = 0
        self.joined: list[str] = []
        for threads in setup.threads:
            self.group.join(self._fresh_name(), threads=threads)
        self._start()
        self.group.rounds_to_ready = {}
        self.group.catch_up_ms = catch_up_times(setup.lag_seed, setup.slowest_ms,
                                                setup.spread_ms)
        self.stateful = {t.task_id: t.stateful for t in setup.tasks}
        self.leader: str | None = min(self.group.members)
        self.last: dict[str, str] = {t: m.instance_id for m in self.group.members.values()
                                     for t in m.active}
        self.crashed: list[tuple[str, int]] = []  # threads that vanished, to return
        #: members that vanished as they were: a paused one comes back with its old state
        self.away: dict[str, SimMember] = {}
        #: task -> (member it is held for, since, until)
        self.holds: dict[str, tuple[str, int, int]] = {}
        #: held tasks a round has seen held
        self.seen_held: set[str] = set()
        #: members of the last round (a member back from a pause that vanishes again before
        #: a round saw it is nobody's news)
        self.in_last_round: set[str] = set(self.group.members)
        self.out = Outcome()
        self.asked: dict[str, set[str]] = {}
        self.follow_up: int | None = None
        self.timer: int | None = None
        self.last_round: int | None = None

    def _start(self) -> None:
        """Rounds, copies caught up before each, until one changes nothing (balanced or not:
        the history's end checks balance)."""
        for _ in range(100):
            self.group.catch_up()
            before = self.group.active_by_member()
            out = self.group.round()
            if before == self.group.active_by_member() and not any(
                    a.revoked or a.learners for a in out.values()):
                return

    def _fresh_name(self) -> str:
        name = self.names[self.used % len(self.names)]
        self.used += 1
        if self.used > len(self.names):
            name = f"{name}x{self.used}"
        self.joined.append(name)
        return name

    # -- changes -------------------------------------------------------------------------

    def _present(self) -> list[str]:
        return sorted({m.instance_id for m in self.group.members.values()})

    def _open(self) -> list[str]:
        return sorted({m.instance_id for m in self.group.members.values()
                       if m.leaving_since_ms is None})

    def _vanish(self, mid: str) -> None:
        group = self.group
        member = group.members.pop(mid)
        self.asked.pop(mid, None)
        delay = group.config.lost_task_delay_ms
        if delay and member.leaving_since_ms is None and mid in self.in_last_round:
            for task in member.active:
                if self.holds.get(task, ("",))[0] == mid:
                    continue  # it came back and went again before a round saw it back
                self.holds[task] = (mid, group.now_ms, group.now_ms + delay)
                self.seen_held.discard(task)
            self.crashed.append((member.instance_id, member.thread))
        self.away[mid] = member
        if mid == self.leader:
            self.leader = None

    def _restart(self, instance: str, thread: int | None = None) -> None:
        for mid, member in self.group.members.items():
            if member.instance_id == instance and thread in (None, member.thread):
                member.active, member.learners, member.standbys = set(), {}, {}
                member.notes = None
                member.ready_at, member.learning_since = {}, {}
                self.asked.pop(mid, None)
                if mid == self.leader:
                    self.leader = None

    def apply(self, change: Change) -> bool:
        """Apply ``change``; False when it does not apply to the group as it is."""
        group = self.group
        present, open_ = self._present(), self._open()
        if not present:
            return False
        victim = open_[change.which % len(open_)] if open_ else None
        kind = change.kind
        if kind == "join":
            group.join(self._fresh_name(), threads=change.threads)
        elif kind == "crash" and victim and len(open_) > 1:
            for mid in sorted(m for m, s in group.members.items() if s.instance_id == victim):
                self._vanish(mid)
        elif kind == "thread" and victim and len(group.members) > 1:
            threads = sorted(m for m, s in group.members.items() if s.instance_id == victim)
            self._vanish(threads[change.which % len(threads)])
        elif kind == "return" and self.crashed:
            instance, thread = self.crashed.pop(change.which % len(self.crashed))
            if f"{instance}-{thread}" in group.members:
                return False
            leaving = any(m.instance_id == instance and m.leaving_since_ms is not None
                          for m in group.members.values())
            if leaving:
                return False
            mid = f"{instance}-{thread}"
            if change.threads == 1 or mid not in self.away:
                group.join_thread(instance, thread)
            else:
                # It was paused (SIGSTOP past its session): it comes back with what it ran,
                # its copies and the notes of its last assignment, all of them stale.
                group.members[mid] = self.away[mid]
        elif kind == "restart" and victim:
            self._restart(victim)
        elif kind == "threadrestart" and victim:
            threads = sorted(s.thread for s in group.members.values() if s.instance_id == victim)
            self._restart(victim, threads[change.which % len(threads)])
        elif kind in ("leave", "retire") and victim and len(open_) > 1:
            if kind == "retire":  # the instance that joined first
                victim = min(open_, key=self.joined.index)
            group.mark_leaving(victim)
            for task, (mid, _, _) in list(self.holds.items()):
                if mid.rsplit("-", 1)[0] == victim:
                    del self.holds[task]
        elif kind == "swap" and open_:
            swapped = open_[: max(1, min(change.which, len(open_)))]
            for _ in swapped:
                group.join(self._fresh_name(), threads=change.threads)
            for name in swapped:
                group.mark_leaving(name)
                for task, (mid, _, _) in list(self.holds.items()):
                    if mid.rsplit("-", 1)[0] == name:
                        del self.holds[task]
        elif kind == "leader":
            self.leader = None
        else:
            return False
        return True

    # -- rounds ----------------------------------------------------------------------------

    def _round_wanted(self, earliest: int) -> tuple[int | None, dict[str, int]]:
        group = self.group
        learning = _group_learning(group)
        asks = {}
        for mid, member in group.members.items():
            at = _asks_at(member, self.asked.get(mid, set()), "batched",
                          LEARNER_BATCH_WAIT_MS, earliest, learning)
            if at is not None:
                asks[mid] = at
        times = [*asks.values(), *(t for t in (self.follow_up, self.timer) if t is not None)]
        return (max(min(times), earliest) if times else None), asks

    def run_round(self, at: int, asks: dict[str, int]) -> dict[str, MemberAssignment]:
        group = self.group
        for mid, when in asks.items():
            if when <= at:
                member = group.members[mid]
                self.asked.setdefault(mid, set()).update(
                    t for t in _learning(member) if member.ready_at[t] <= at)
        for mid, member in group.members.items():
            member.asks_promotion = asks_promotion(
                frozenset(self.asked.get(mid, ())), frozenset(member.learners),
                being_promoted(member.notes, (member.instance_id, member.thread)))
        group.advance_to(at)
        if self.leader is None:
            # A new leader: it rebuilds the memory from the notes the members echo.
            group.memory = None
            self.leader = self.rng.choice(sorted(group.members))
        views = [m.view() for m in group.members.values()]
        memory = group.memory
        if memory is None:
            memory = memory_from_notes(views)
            self._drop_holds_nobody_carries(views, memory)
        out = group.round()
        self.in_last_round = {m.member_id for m in views}
        self.last_round = at
        self.asked = {mid: done & set(group.members[mid].learners)
                      for mid, done in self.asked.items() if mid in group.members}
        self._check(views, out)
        try:
            check_warm(views, memory, group.config.acceptable_lag, self.stateful, out)
        except AssertionError as cold:
            self.out.problems.append(f"t={at}: {cold}")
        # A member that revoked tasks or is told to rejoin at once asks for the next round.
        self.follow_up = at + ROUND_MS if any(
            a.revoked or a.shutdown or a.rejoin_after_ms == 0 for a in out.values()) else None
        timers = [a.rejoin_after_ms for a in out.values()
                  if a.rejoin_after_ms and not a.revoked]
        self.timer = at + min(timers) if timers else None
        if self.leader not in group.members:
            self.leader = None
        return out

    def _drop_holds_nobody_carries(self, views: list[Member], memory: LeaderMemory) -> None:
        """A new leader knows of a hold only from the notes the members echo: a hold that no
        member present carries (nor the vanished member's tasks) is lost with the leader (the
        documented limit). One some member carries must survive."""
        for task, (mid, _, _) in list(self.holds.items()):
            instance, thread = mid.rsplit("-", 1)
            key = (instance, int(thread))
            if task in memory.lost or memory.owners.get(task) == key:
                continue
            carried = any(m.notes is not None and task in {
                *m.notes.members.get(key, MemberNotes()).held,
                *m.notes.members.get(key, MemberNotes()).owned} for m in views)
            if not carried:
                del self.holds[task]
                self.out.holds_lost += 1

    def _check(self, views: list[Member], out: dict[str, MemberAssignment]) -> None:
        group, problems = self.group, self.out.problems
        now = group.now_ms
        owners: dict[str, str] = {}
        for mid, assignment in out.items():
            for task in assignment.active:
                if task in owners:
                    problems.append(f"t={now}: {task} active on {owners[task]} and {mid}")
                owners[task] = mid
        instance_of = {m.member_id: m.instance_id for m in views}
        here = set(instance_of)
        # Holds: nothing runs a held task before its deadline; a returning member gets it.
        for task, (mid, since, until) in list(self.holds.items()):
            if now >= until:
                del self.holds[task]
                continue
            runs = owners.get(task)
            if mid in here and task not in self.seen_held:
                del self.holds[task]  # back before any round missed it: nothing was held
                continue
            self.seen_held.add(task)
            if mid in here:
                moving = group.memory.moving.get(task) if group.memory else None
                if runs is None and moving is not None:
                    runs = f"{moving[0]}-{moving[1]}"  # revoked for it: it runs there next
                    instance_of.setdefault(runs, moving[0])
                if runs is None or instance_of[runs] != mid.rsplit("-", 1)[0]:
                    problems.append(f"t={now}: {task} held for {mid} since {since} not given "
                                    f"back: runs on {runs}")
                del self.holds[task]
            elif runs is not None:
                problems.append(f"t={now}: {task} held for {mid} since {since} until {until} "
                                f"released early to {runs}")
                del self.holds[task]
        # A held task keeps num_standbys copies while an eligible instance is open, and keeps
        # every copy that could take over.
        memory = group.memory
        if memory is None:
            return
        open_ = {m.instance_id for m in views if not m.leaving}
        copies_after: dict[str, set[str]] = {}
        for mid, assignment in out.items():
            if mid in instance_of:
                for task in (*assignment.standbys, *assignment.learners):
                    copies_after.setdefault(task, set()).add(instance_of[mid])
        for task, (key, _) in memory.lost.items():
            if not self.stateful[task]:
                continue
            # Its member's sibling threads count: when the delay ends it goes to them.
            eligible = set(open_)
            have = copies_after.get(task, set()) & eligible
            want = min(group.config.num_standbys, len(eligible))
            if len(have) < want:
                problems.append(f"t={now}: {task} held for {key} has copies on {sorted(have)}, "
                                f"wants {want} of {sorted(eligible)}")
            before = {m.instance_id for m in views if task in m.standbys or task in m.learners}
            dropped = (before & eligible) - have
            if dropped:
                problems.append(f"t={now}: {task} held for {key} lost its copies on "
                                f"{sorted(dropped)}")

    def _count_moves(self) -> None:
        open_ = set(self._open())
        seg = self.segment
        for member in self.group.members.values():
            for task in member.active:
                source = self.last.get(task)
                if source is not None and source != member.instance_id:
                    seg.moves += 1
                    seg.stateful_moves += self.stateful[task]
                    seg.voluntary += source in open_
                self.last[task] = member.instance_id

    def _needed(self) -> tuple[int, int]:
        """The fewest moves balance needs from where the tasks are to the group as it is,
        and how many of them are forced (their instance vanished or is leaving)."""
        open_ = set(self._open())
        least = fewest_moves(self.group, self.last, self.group.config.tolerance)
        return least, sum(1 for inst in self.last.values() if inst not in open_)

    def _close_segment(self) -> None:
        """The group settled: add up the segment since it last was."""
        seg, out = self.segment, self.out
        if seg.changes:
            out.changes += seg.changes
            out.segments += 1
            out.rounds += seg.rounds
            out.moves += seg.moves
            out.stateful_moves += seg.stateful_moves
            out.voluntary += seg.voluntary
            out.fewest += seg.fewest
            out.fewest_voluntary += seg.fewest_voluntary
            out.excess = max(out.excess,
                             seg.rounds - seg.bound(self.group.config.max_learners))
            out.segment_log.append((seg.changes, seg.timers, seg.rounds, seg.stateful_moves,
                                    seg.moves, seg.fewest))
        self.segment = Segment()

    def run(self, changes: list[Change], limit: int = 400) -> Outcome:
        """Make the changes in turn, with rounds as the members ask for them, until the last
        change has settled; then check the group is balanced."""
        group = self.group
        pending = list(changes)
        previous_at = group.now_ms
        trigger: int | None = None
        self.segment = Segment()
        while True:
            earliest = group.now_ms if self.last_round is None else max(
                group.now_ms, self.last_round + ROUND_MS)
            if trigger is not None:
                self.follow_up = trigger if self.follow_up is None else min(self.follow_up,
                                                                            trigger)
                trigger = None
            round_at, asks = self._round_wanted(earliest)
            if round_at is None:
                self._close_segment()
            if pending:
                change = pending[0]
                if change.after_ms is None:
                    change_at = group.now_ms if round_at is None else None
                else:
                    change_at = max(group.now_ms, previous_at + change.after_ms)
                if change_at is not None and (round_at is None or change_at < round_at):
                    pending.pop(0)
                    group.advance_to(change_at)
                    previous_at = change_at
                    # What the change adds to the moves still needed when it arrives: a
                    # change arriving before the last settled counts only what it adds.
                    remaining, forced_before = self._needed()
                    if self.apply(change):
                        least, forced = self._needed()
                        self.segment.changes += 1
                        self.segment.fewest += least - remaining
                        self.segment.fewest_voluntary += (least - forced) - (
                            remaining - forced_before)
                        trigger = change_at
                    continue
            if round_at is None:
                break
            if self.timer is not None and round_at >= self.timer:
                self.segment.timers += 1  # a hold's or a scale-down's deadline came
            self.run_round(round_at, asks)
            self.segment.rounds += 1
            self._count_moves()
            if self.segment.rounds > limit:
                self.out.problems.append(f"not settled after {limit} rounds")
                return self.out
        self.out.problems.extend(instance_balanced(group))
        self.out.problems.extend(thread_balanced(group))
        return self.out


def random_setup(rng: random.Random) -> Setup:
    instances = rng.randint(1, 5)
    subtopologies = rng.randint(1, 3)
    per_sub = rng.randint(1, 10)
    stateless_every = rng.choice([2, 3, 4, 7, 1_000])
    tasks = tuple(Task(f"{s}_{p}", stateful=(s * per_sub + p) % stateless_every != 0)
                  for s in range(subtopologies) for p in range(per_sub))
    config = AssignorConfig(
        num_standbys=rng.choice([0, 0, 1, 2]),
        max_learners=rng.randint(1, 4),
        acceptable_lag=0,
        lost_task_delay_ms=rng.choice([0, 0, 10_000, 60_000, 180_000]),
        scale_down_timeout_ms=rng.choice([120_000, 600_000]),
    )
    prefix = rng.choice(["h", "node-", "w", "z"])
    names = [f"{prefix}{n}" for n in rng.sample(range(100), 40)]
    return Setup(tuple(rng.randint(1, 3) for _ in range(instances)), tasks, config,
                 lag_seed=rng.randrange(2**16), slowest_ms=rng.choice([0, 5_000, 40_000,
                                                                        90_000]),
                 spread_ms=rng.choice([0, 10_000, 40_000]), names=tuple(names))


def random_changes(rng: random.Random, family: str | None = None) -> list[Change]:
    """A chain of one to five changes, each once settled or some time after the last."""
    def after() -> int | None:
        return rng.choice([None, None, 0, 2_000, 5_000, 15_000, 45_000, 100_000])

    if family == "hostswap":
        # New instances join, then the old ones are marked leaving, in the middle of the
        # moves the joins started or once settled.
        joins = [Change("join", 0, rng.randint(1, 3), after_ms=rng.choice([None, 0, 3_000]))
                 for _ in range(rng.randint(1, 3))]
        marks = [Change("retire", 0, after_ms=rng.choice([None, 0, 5_000, 20_000, 60_000]))
                 for _ in joins]
        return [*joins, *marks]
    if family == "rolling":
        first = Change("restart", 0, after_ms=None)
        return [first, *(Change("restart", n, after_ms=rng.choice([None, 5_000, 20_000]))
                         for n in range(1, rng.randint(2, 5)))]
    count = rng.randint(1, 5)
    return [Change(family or rng.choice(KINDS), rng.randint(0, 5), rng.randint(1, 3),
                   after()) for _ in range(count)]


def history(seed: int, family: str | None = None) -> tuple[Setup, list[Change], Outcome]:
    rng = random.Random(seed)
    setup = random_setup(rng)
    changes = random_changes(rng, family)
    return setup, changes, History(setup, rng).run(changes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--histories", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=3, help="problems shown per kind")
    args = parser.parse_args()
    total = Outcome()
    over = strict = 0
    problem_kinds: Counter[str] = Counter()
    shown: Counter[str] = Counter()
    worst: tuple[int, int, int] | None = None
    for n in range(args.histories):
        seed = args.seed + n
        family = FAMILIES[n % len(FAMILIES)]
        setup, changes, out = history(seed, family)
        for name in ("rounds", "moves", "stateful_moves", "voluntary", "fewest",
                     "fewest_voluntary", "changes", "segments"):
            setattr(total, name, getattr(total, name) + getattr(out, name))
        strict += any(rounds > 2 * math.ceil(sm / setup.config.max_learners) + 3
                      for _, _, rounds, sm, _, _ in out.segment_log)
        if out.over:
            over += 1
            if worst is None or out.excess > worst[0]:
                worst = (out.excess, seed, out.segment_log)
        for kind, problem in {_problem_kind(p): p for p in reversed(out.problems)}.items():
            if shown[kind] < args.show:
                shown[kind] += 1
                print(f"seed {seed} {family or ''}: {problem}\n   {setup}\n   {changes}")
        for kind in {_problem_kind(p) for p in out.problems}:
            problem_kinds[kind] += 1
    print(f"{args.histories} histories, {total.changes} changes, {total.rounds} rounds")
    print(f"moves {total.moves} vs fewest {total.fewest}: "
          f"{total.moves / max(1, total.fewest):.2f}x; voluntary {total.voluntary} vs "
          f"{total.fewest_voluntary}: {total.voluntary / max(1, total.fewest_voluntary):.2f}x")
    print(f"histories with a segment over one change's bound (2*ceil(m/L)+3): {strict}")
    print(f"histories with a segment over its bound: {over}; worst (excess, seed, segments "
          f"as (changes, deadlines, rounds, stateful moves, moves, fewest)): {worst}")
    for kind, count in problem_kinds.most_common():
        print(f"  {count} histories: {kind}")


def _problem_kind(problem: str) -> str:
    for kind in ("released early", "not given back", "lost its copies", "wants",
                 "threads of", "instances unbalanced", "active on", "not settled"):
        if kind in problem:
            return kind
    return problem


if __name__ == "__main__":
    main()
