"""The group-level error of an OffsetFetch answer, which aiokafka 0.14 does not read.

From version 2 on, OffsetFetch carries a group-level error in a field of its own, and Apache
Kafka answers such an error with no partition at all: the coordinator still loading the
group's offsets after it moved to another broker (``COORDINATOR_LOAD_IN_PROGRESS``), or a
broker that is no longer the coordinator (``NOT_COORDINATOR``). aiokafka 0.14 reads only the
per-partition errors, so it takes such an answer for "no committed offset": a task then
starts from the beginning of its input (``auto_offset_reset="earliest"``) and processes
everything again, duplicates even under exactly-once. Measured in the fault suite: a task
restarted just after a SIGKILL of its group's coordinator ran from the beginning and wrote
412 orders a second time. Raising the error instead makes aiokafka's own loop find the
coordinator again and retry, as it does for the per-partition form of the same errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiokafka import errors as kafka_errors

#: Errors after which the coordinator must be looked up again before a retry.
_COORDINATOR_GONE = (kafka_errors.NotCoordinatorForGroupError,
                     kafka_errors.GroupCoordinatorNotAvailableError)


def group_error(response: Any) -> type[kafka_errors.KafkaError] | None:
    """The group-level error of an OffsetFetch answer; None when there is none (versions
    0 and 1 have no such field)."""
    code = getattr(response, "error_code", 0) or 0
    error = kafka_errors.for_code(code)
    return None if error is kafka_errors.NoError else error


def raise_group_error(response: Any, coordinator_dead: Callable[[], None]) -> None:
    """Raise the group-level error of an OffsetFetch answer, after marking the coordinator
    dead when the error says it moved."""
    error = group_error(response)
    if error is None:
        return
    if issubclass(error, _COORDINATOR_GONE):
        coordinator_dead()
    raise error(f"OffsetFetch answered the group-level error {error.__name__}")
