"""Relay's assignor: the pure, leader-side decision of who runs which task, and the embedded
protocol that carries subscriptions and assignments.

``assign(tasks, members, config, now_ms, memory) -> (assignments, memory)`` is the contract:
no I/O, no clock, no randomness; the same input gives the same output.
"""

from assignor.model import (
    AssignorConfig,
    AssignorConfigError,
    LeaderMemory,
    LeaderNotes,
    Member,
    MemberAssignment,
    MemberNotes,
    Task,
    parse_task_id,
    task_sort_key,
)
from assignor.notes import memory_from_notes
from assignor.placement import assign

__all__ = [
    "AssignorConfig",
    "AssignorConfigError",
    "LeaderMemory",
    "LeaderNotes",
    "Member",
    "MemberAssignment",
    "MemberNotes",
    "Task",
    "assign",
    "memory_from_notes",
    "parse_task_id",
    "task_sort_key",
]
