"""A pure simulation of a group following the assignor's instructions round by round: members
drop revoked tasks, start assigned ones, keep the learner and standby copies they are given
(new copies start far behind, a set number of rounds behind on chosen instances, or, timed,
a set time from being ready), echo the leader's notes from their last assignment, restart
(losing everything but their static id), and shut down when told."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from assignor import AssignorConfig, LeaderMemory, Member, MemberAssignment, Task, assign

FAR_BEHIND = 1_000_000


@dataclass
class SimMember:
    member_id: str
    instance_id: str
    thread: int = 0
    active: set[str] = field(default_factory=set)
    learners: dict[str, int] = field(default_factory=dict)
    standbys: dict[str, int] = field(default_factory=dict)
    leaving_since_ms: int | None = None
    scale_down_timeout_ms: int | None = None
    notes: Any = None
    #: Timed copies: task -> when the copy is ready (see ``Group.catch_up_ms``).
    ready_at: dict[str, int] = field(default_factory=dict)
    #: Timed learners: task -> since when the member holds it as a learner.
    learning_since: dict[str, int] = field(default_factory=dict)
    #: How many learners the group held after the last round (the runtime's group_learners).
    group_learners: int = 0
    #: Whether it asks the next round to promote ready learners (None: always, as before).
    asks_promotion: bool | None = None

    def view(self) -> Member:
        extra = {} if self.notes is None else {"notes": self.notes}
        return Member(self.member_id, self.instance_id, self.thread, frozenset(self.active),
                      dict(self.standbys), dict(self.learners),
                      self.leaving_since_ms is not None, self.leaving_since_ms,
                      self.scale_down_timeout_ms, **extra,
                      asks_promotion=self.asks_promotion is not False)


@dataclass
class Group:
    tasks: list[Task]
    config: AssignorConfig = field(default_factory=AssignorConfig)
    members: dict[str, SimMember] = field(default_factory=dict)
    memory: LeaderMemory | None = None
    now_ms: int = 0
    history: list[dict[str, MemberAssignment]] = field(default_factory=list)
    #: instance -> how many rounds a new copy there takes to catch up (see ``tick``)
    rounds_to_ready: dict[str, int] = field(default_factory=dict)
    #: Timed copies: (instance, task) -> how long a new copy there takes to catch up, in ms;
    #: its lag is the time it has left (``advance_to``), so set ``acceptable_lag=0``.
    catch_up_ms: Callable[[str, str], int] | None = None

    def join(self, instance: str, threads: int = 1, active: tuple[str, ...] = ()) -> None:
        for t in range(threads):
            self.join_thread(instance, t, active if t == 0 else ())

    def join_thread(self, instance: str, thread: int, active: tuple[str, ...] = ()) -> None:
        mid = f"{instance}-{thread}"
        self.members[mid] = SimMember(mid, instance, thread, set(active))

    def crash(self, instance: str) -> None:
        for mid in [m for m, s in self.members.items() if s.instance_id == instance]:
            del self.members[mid]

    def crash_thread(self, instance: str, thread: int) -> None:
        del self.members[f"{instance}-{thread}"]

    def bounce(self, instance: str) -> None:
        """The instance restarts: same static ids, nothing running, no copies, no notes."""
        for member in self.members.values():
            if member.instance_id == instance:
                member.active, member.learners, member.standbys = set(), {}, {}
                member.notes = None

    def mark_leaving(self, instance: str, timeout_ms: int | None = None) -> None:
        for member in self.members.values():
            if member.instance_id == instance:
                member.leaving_since_ms = self.now_ms
                member.scale_down_timeout_ms = timeout_ms

    def catch_up(self, instance: str | None = None) -> None:
        """Learners (of one instance, or all) reach the changelog's end."""
        for member in self.members.values():
            if instance is None or member.instance_id == instance:
                for task in member.learners:
                    member.learners[task] = 0
                for task in member.standbys:
                    member.standbys[task] = 0

    def tick(self) -> None:
        """One round's worth of restoring: every copy's lag goes down by one (a copy on an
        instance in ``rounds_to_ready`` starts that many rounds behind)."""
        for member in self.members.values():
            for copies in (member.learners, member.standbys):
                for task, lag in copies.items():
                    copies[task] = max(0, lag - 1)

    def advance_to(self, now_ms: int) -> None:
        """Time passes: every timed copy's lag is the time it has left until it is ready."""
        self.now_ms = now_ms
        for member in self.members.values():
            for copies in (member.learners, member.standbys):
                for task in copies:
                    if task in member.ready_at:
                        copies[task] = max(0, member.ready_at[task] - now_ms)

    def _start_lag(self, instance: str) -> int:
        return self.rounds_to_ready.get(instance, FAR_BEHIND)

    def round(self) -> dict[str, MemberAssignment]:
        views = [m.view() for m in self.members.values()]
        out, self.memory = assign(self.tasks, views, self.config, self.now_ms, self.memory)
        self.history.append(out)
        for mid, assignment in out.items():
            member = self.members[mid]
            if assignment.error:
                del self.members[mid]
                continue
            fresh = self._start_lag(member.instance_id)
            member.active = set(assignment.active)
            member.learners = {t: member.learners.get(t, member.standbys.get(t, fresh))
                               for t in assignment.learners}
            member.standbys = {t: member.standbys.get(t, member.learners.get(t, fresh))
                               for t in assignment.standbys}
            member.notes = getattr(assignment, "notes", None)
            if self.catch_up_ms is not None:
                self._time_copies(member)
            if assignment.shutdown:
                del self.members[mid]
        learning = sum(len(a.learners) for a in out.values())
        for member in self.members.values():
            member.group_learners = learning
        return out

    def _time_copies(self, member: SimMember) -> None:
        assert self.catch_up_ms is not None
        held = {*member.learners, *member.standbys}
        member.ready_at = {t: at for t, at in member.ready_at.items() if t in held}
        member.learning_since = {t: member.learning_since.get(t, self.now_ms)
                                 for t in member.learners}
        for task in held - set(member.ready_at):
            lag = member.learners.get(task, member.standbys.get(task, FAR_BEHIND))
            # A new copy starts its catch-up now; one held before time was modelled keeps
            # its lag (0 once caught up).
            member.ready_at[task] = self.now_ms + (
                self.catch_up_ms(member.instance_id, task) if lag >= FAR_BEHIND else lag)
        for copies in (member.learners, member.standbys):
            for task in copies:
                copies[task] = max(0, member.ready_at[task] - self.now_ms)

    def active_by_instance(self) -> dict[str, list[str]]:
        result: dict[str, list[str]] = {}
        for member in self.members.values():
            result.setdefault(member.instance_id, []).extend(member.active)
        return {k: sorted(v) for k, v in sorted(result.items())}

    def active_by_member(self) -> dict[str, list[str]]:
        return {mid: sorted(m.active) for mid, m in sorted(self.members.items())}

    def learners_by_instance(self) -> dict[str, list[str]]:
        result: dict[str, list[str]] = {}
        for member in self.members.values():
            if member.learners:
                result.setdefault(member.instance_id, []).extend(member.learners)
        return {k: sorted(v) for k, v in sorted(result.items())}

    def copies_by_instance(self) -> dict[str, list[str]]:
        result: dict[str, list[str]] = {}
        for member in self.members.values():
            held = [*member.learners, *member.standbys]
            if held:
                result.setdefault(member.instance_id, []).extend(held)
        return {k: sorted(v) for k, v in sorted(result.items())}
