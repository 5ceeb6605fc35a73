"""The assignor's plain data: tasks, members as their subscriptions describe them, the
configuration, each member's assignment, and the leader's memory between rounds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Task:
    task_id: str
    stateful: bool = True

    def __post_init__(self) -> None:
        parse_task_id(self.task_id)


@dataclass(frozen=True)
class Member:
    """One group member (a stream thread) as its subscription describes it.

    ``standbys`` and ``learners`` map task ids to the lag of the copy this member holds.
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


@dataclass(frozen=True)
class AssignorConfig:
    num_standbys: int = 0
    acceptable_lag: int = 10_000
    max_learners: int = 2
    lost_task_delay_ms: int = 0
    initial_delay_ms: int = 0
    scale_down_timeout_ms: int = 600_000
    imbalance_tolerance: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_standbys", "acceptable_lag", "lost_task_delay_ms",
                     "initial_delay_ms", "scale_down_timeout_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, not {getattr(self, name)}")
        if self.max_learners < 1:
            raise ValueError(f"max_learners must be >= 1, not {self.max_learners}")
        if self.imbalance_tolerance is not None and self.imbalance_tolerance < 1:
            raise ValueError(
                f"imbalance_tolerance must be >= 1 task, not {self.imbalance_tolerance}"
            )

    @property
    def tolerance(self) -> int:
        return self.imbalance_tolerance or 1


@dataclass(frozen=True)
class MemberAssignment:
    """What one member runs after a round (sorted task ids)."""

    active: tuple[str, ...] = ()
    being_learned: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()
    standbys: tuple[str, ...] = ()
    revoked: tuple[str, ...] = ()
    rejoin_after_ms: int | None = None
    shutdown: bool = False
    error: str | None = None


@dataclass(frozen=True)
class LeaderMemory:
    """What the leader remembers between rounds; a new leader starts from None."""

    instances: frozenset[str] = frozenset()
    owners: Mapping[str, str] = field(default_factory=dict)
    #: task -> (instance that vanished with it, when it was first seen missing)
    lost: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    formed_at_ms: int | None = None
    #: task -> the instance it was revoked for (it gets it in the next round)
    moving: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "instances": sorted(self.instances),
            "owners": dict(sorted(self.owners.items())),
            "lost": {t: list(v) for t, v in sorted(self.lost.items())},
            "formed_at_ms": self.formed_at_ms,
            "moving": dict(sorted(self.moving.items())),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LeaderMemory:
        return cls(
            instances=frozenset(data.get("instances", ())),
            owners=dict(data.get("owners", {})),
            lost={t: (str(v[0]), int(v[1])) for t, v in data.get("lost", {}).items()},
            formed_at_ms=data.get("formed_at_ms"),
            moving=dict(data.get("moving", {})),
        )
