"""Relay's assignor: the pure, leader-side decision of who runs which task, and the embedded
protocol that carries subscriptions and assignments.

``assign(tasks, members, config, now_ms, memory) -> (assignments, memory)`` is the contract:
no I/O, no clock, no randomness; the same input gives the same output.
"""

from assignor.model import (
    AssignorConfig,
    LeaderMemory,
    Member,
    MemberAssignment,
    Task,
    parse_task_id,
    task_sort_key,
)
from assignor.placement import assign

__all__ = [
    "AssignorConfig",
    "LeaderMemory",
    "Member",
    "MemberAssignment",
    "Task",
    "assign",
    "parse_task_id",
    "task_sort_key",
]
