"""The batch router: a fetch's records grouped by the task that runs their partition, once
per batch rather than once per record."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def route_by_task(
    batches: Mapping[Any, list[Any]], task_for: Callable[[Any], T | None],
) -> list[tuple[T, list[list[Any]]]]:
    """Each task with records in ``batches`` (partition -> records), with its partitions'
    record lists in fetch order; partitions no task runs (revoked, restoring) and empty
    lists are left out. Tasks come in the order their first partition was fetched."""
    routed: dict[int, tuple[T, list[list[Any]]]] = {}
    for tp, records in batches.items():
        if not records:
            continue
        task = task_for(tp)
        if task is None:
            continue
        entry = routed.get(id(task))
        if entry is None:
            routed[id(task)] = (task, [records])
        else:
            entry[1].append(records)
    return list(routed.values())
