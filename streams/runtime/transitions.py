"""Task transitions: what a member does with its tasks when a new assignment arrives.

Pure: from the roles the member's tasks have now and its new assignment, decide which tasks
keep running, which start (restoring first), which become or stay standby/learner copies, and
which close. The task manager (:mod:`streams.runtime.task_manager`) carries the plan out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from assignor import MemberAssignment


class Role(StrEnum):
    ACTIVE = "active"  # running
    RESTORING = "restoring"  # active, catching up on its changelogs before it runs
    STANDBY = "standby"
    LEARNER = "learner"


@dataclass(frozen=True)
class Plan:
    keep_active: tuple[str, ...] = ()
    #: New actives whose state must be restored (fresh, or from a copy this member holds).
    start: tuple[str, ...] = ()
    #: Of ``start``, those this member already holds a standby/learner copy of.
    promote: tuple[str, ...] = ()
    #: Actives (or restoring actives) that become copies here: stores stay open.
    demote: tuple[tuple[str, Role], ...] = ()
    #: New copies to open and follow.
    add_copies: tuple[tuple[str, Role], ...] = ()
    #: Copies that change between standby and learner.
    retag: tuple[tuple[str, Role], ...] = ()
    #: Tasks and copies this member no longer has: close their stores.
    close: tuple[str, ...] = ()
    roles: Mapping[str, Role] = field(default_factory=dict)


def plan_transitions(current: Mapping[str, Role], target: MemberAssignment) -> Plan:
    active = set(target.active)
    learners = set(target.learners) - active
    standbys = set(target.standbys) - active - learners

    def copy_role(task: str) -> Role | None:
        if task in learners:
            return Role.LEARNER
        if task in standbys:
            return Role.STANDBY
        return None

    keep, start, promote, demote, add, retag, close = [], [], [], [], [], [], []
    roles: dict[str, Role] = {}
    for task in sorted(set(current) | active | learners | standbys):
        now = current.get(task)
        wanted = copy_role(task)
        if task in active:
            if now is Role.ACTIVE:
                keep.append(task)
                roles[task] = Role.ACTIVE
            elif now is Role.RESTORING:
                roles[task] = Role.RESTORING
            else:
                start.append(task)
                if now in (Role.STANDBY, Role.LEARNER):
                    promote.append(task)
                roles[task] = Role.RESTORING
        elif wanted is not None:
            roles[task] = wanted
            if now in (Role.ACTIVE, Role.RESTORING):
                demote.append((task, wanted))
            elif now is None:
                add.append((task, wanted))
            elif now is not wanted:
                retag.append((task, wanted))
        elif now is not None:
            close.append(task)
    return Plan(
        tuple(keep), tuple(start), tuple(promote), tuple(demote), tuple(add), tuple(retag),
        tuple(close), roles,
    )
