"""The assignor's plain data: tasks, members as their subscriptions describe them, the
configuration, each member's assignment, the leader's memory between rounds, and the notes
that carry that memory through the members to a new leader."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any


def parse_task_id(task_id: str) -> tuple[int, int]:
    """``"0_3"`` -> ``(0, 3)``: sub-topology 0, partition 3."""
    try:
        sub, partition = task_id.split("_")
        parsed = int(sub), int(partition)
    except ValueError:
        raise ValueError(f"not a task id: {task_id!r} (expected '<sub>_<partition>')") from None
    if parsed[0] < 0 or parsed[1] < 0:
        raise ValueError(f"not a task id: {task_id!r} (negative numbers)")
    return parsed


def task_sort_key(task_id: str) -> tuple[int, int]:
    return parse_task_id(task_id)


#: A static member: ``(instance id, thread index)``, i.e. ``<instance>-thread-<n>``.
MemberKey = tuple[str, int]


@dataclass(frozen=True)
class Task:
    task_id: str
    stateful: bool = True

    def __post_init__(self) -> None:
        parse_task_id(self.task_id)


@dataclass(frozen=True)
class MemberNotes:
    """What the leader knows about one static member, beyond what it reports itself.

    ``owned``: the tasks it runs (left out of the notes a member carries about itself, since
    its subscription lists them); ``incoming``: tasks revoked elsewhere that it gets in the
    next round; ``held``: tasks held back for it while it is away, with when it went missing.
    """

    owned: tuple[str, ...] = ()
    incoming: tuple[str, ...] = ()
    held: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class LeaderNotes:
    """The part of the leader's memory one member carries: its own notes and those of one or
    two members on other instances. Every member echoes its copy in its next subscription, so
    that any new leader can rebuild the memory from the group (a leader that crashed or
    restarted loses only its own copy)."""

    #: when the leader's memory last changed (newer notes about a member win)
    round_ms: int
    formed_at_ms: int | None = None
    members: Mapping[MemberKey, MemberNotes] = field(default_factory=dict)


@dataclass(frozen=True)
class Member:
    """One group member (a stream thread) as its subscription describes it.

    ``standbys`` and ``learners`` map task ids to the lag of the copy this member holds;
    ``notes`` are the leader's notes it echoes from its last assignment (None if it has none).
    ``asks_promotion``: it asked for this round to promote its ready learners; ready learners
    (of any member) are promoted only in a round some member asks that of. Members that do
    not say (older ones) count as asking. ``unsynced``: the leader saw no sign that it got
    its assignment of the last round (it may still be waiting for it): a task arriving on
    its instance goes to another thread of the instance when there is one.
    ``ready_by_assignment``: learners still beyond the acceptable lag that the member expects
    to have caught up by the time this round's assignment reaches it (a new instance that
    warmed up joins while its copies finish restoring, see ``streams.group.warm_up``); the round
    counts them as ready.
    ``slow_restores``: actives this member restores from far behind (a restart that lost its
    state directory, a store found corrupt), with the records each has left, that it expects
    to take longer than a move would: the leader hands each to a caught-up copy on another
    instance, if there is one, and has this member learn it back.
    """

    member_id: str
    instance_id: str
    thread: int
    active: frozenset[str] = frozenset()
    standbys: Mapping[str, int] = field(default_factory=dict)
    learners: Mapping[str, int] = field(default_factory=dict)
    leaving: bool = False
    leaving_since_ms: int | None = None
    scale_down_timeout_ms: int | None = None
    notes: LeaderNotes | None = None
    asks_promotion: bool = True
    unsynced: bool = False
    ready_by_assignment: frozenset[str] = frozenset()
    slow_restores: Mapping[str, int] = field(default_factory=dict)

    @property
    def key(self) -> MemberKey:
        return self.instance_id, self.thread


class AssignorConfigError(ValueError):
    """A setting of the assignor has a wrong type or value; ``setting`` names it."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting


@dataclass(frozen=True)
class AssignorConfig:
    num_standbys: int = 0
    acceptable_lag: int = 10_000
    max_learners: int = 2
    lost_task_delay_ms: int = 0
    initial_delay_ms: int = 0
    scale_down_timeout_ms: int = 600_000
    #: How far apart (in tasks per thread) instances may be and still count as balanced;
    #: None means one task.
    imbalance_tolerance: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name == "imbalance_tolerance":
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise AssignorConfigError(
                    f.name, f"{f.name} must be a whole number, not {value!r}")
        for name in ("num_standbys", "acceptable_lag", "lost_task_delay_ms",
                     "initial_delay_ms", "scale_down_timeout_ms"):
            if getattr(self, name) < 0:
                raise AssignorConfigError(
                    name, f"{name} must be >= 0, not {getattr(self, name)}")
        if self.max_learners < 1:
            raise AssignorConfigError(
                "max_learners", f"max_learners must be >= 1, not {self.max_learners}")
        if self.imbalance_tolerance is not None and self.imbalance_tolerance < 1:
            raise AssignorConfigError(
                "imbalance_tolerance",
                f"imbalance_tolerance must be >= 1 task per thread (or unset for 1), not "
                f"{self.imbalance_tolerance}",
            )

    @classmethod
    def from_settings(cls, settings: Any) -> AssignorConfig:
        """The assignor's settings read from an object with attributes of the same names
        (the app's configuration), validated: a wrong one raises
        :class:`AssignorConfigError` naming it."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)
                      if hasattr(settings, f.name)})

    @property
    def tolerance(self) -> int:
        return self.imbalance_tolerance or 1


@dataclass(frozen=True)
class MemberAssignment:
    """What one member runs after a round (sorted task ids), and the leader's notes it keeps
    and echoes in its next subscription."""

    active: tuple[str, ...] = ()
    being_learned: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()
    standbys: tuple[str, ...] = ()
    revoked: tuple[str, ...] = ()
    rejoin_after_ms: int | None = None
    shutdown: bool = False
    error: str | None = None
    notes: LeaderNotes | None = None
    #: How many members the round assigned (0: not told). A member that asks for the next
    #: round waits until that many members report having their assignment.
    group_size: int = 0
    #: How many learner copies the round's assignments hold in all (0: not told). A member
    #: holding them all needs to wait for no other member's learners.
    group_learners: int = 0


@dataclass(frozen=True)
class LeaderMemory:
    """What the leader remembers between rounds; a new leader rebuilds it from the notes the
    members echo (or starts empty when nobody has any)."""

    instances: frozenset[str] = frozenset()
    #: task -> the static member that runs it, last ran it, or gives it up this round
    owners: Mapping[str, MemberKey] = field(default_factory=dict)
    #: task -> (the static member that vanished with it, when it was first seen missing)
    lost: Mapping[str, tuple[MemberKey, int]] = field(default_factory=dict)
    formed_at_ms: int | None = None
    #: task -> the static member it was revoked for (it gets it in the next round)
    moving: Mapping[str, MemberKey] = field(default_factory=dict)
    #: when the memory last changed: the stamp of the notes the members carry
    noted_at_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "instances": sorted(self.instances),
            "owners": {t: list(k) for t, k in sorted(self.owners.items())},
            "lost": {t: [list(k), since] for t, (k, since) in sorted(self.lost.items())},
            "formed_at_ms": self.formed_at_ms,
            "moving": {t: list(k) for t, k in sorted(self.moving.items())},
            "noted_at_ms": self.noted_at_ms,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LeaderMemory:
        def key(raw: Any) -> MemberKey:
            return str(raw[0]), int(raw[1])

        return cls(
            instances=frozenset(data.get("instances", ())),
            owners={t: key(k) for t, k in data.get("owners", {}).items()},
            lost={t: (key(v[0]), int(v[1])) for t, v in data.get("lost", {}).items()},
            formed_at_ms=data.get("formed_at_ms"),
            moving={t: key(k) for t, k in data.get("moving", {}).items()},
            noted_at_ms=data.get("noted_at_ms"),
        )
