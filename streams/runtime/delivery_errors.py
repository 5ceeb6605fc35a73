"""What the at-least-once data producer's failed deliveries say, as librdkafka's error codes
tell it, and what becomes of the tasks whose records they were.

- **Not delivered, and not to be** (the record's ``message.timeout.ms`` ran out, or it was
  purged from the queue): the broker never got it, or got it only in part, so the input it
  came from is processed again. The task runs again in place from its last commit, without
  the group (as an exactly-once task is revived after a failed transaction,
  :mod:`streams.runtime.transaction_errors`): its stores drop their writes since that commit
  and its input is sought back to the position they reflect
  (:meth:`streams.runtime.task_manager.TaskManager.replay`). Its outputs since repeat, which
  at-least-once allows; nothing is lost. A broker failover longer than the timeout ends here.
- **The producer lost** (the broker fenced its idempotent producer id, or librdkafka made
  the producer fatal: seen on Tansu after a SIGSTOP past the session, once records had timed
  out): the producer can send nothing more, but the records are not refused as such. They
  count as not delivered, and the thread replaces its producer (a new producer id) before
  its tasks run again.
- **Refused** (anything else: a record too large, an authorization error): sending it again
  would be refused again. It stays sticky and fatal to the thread, so that no commit ever
  passes input whose outputs or changelog records the broker refused.

Errors of tasks the thread no longer runs (lost to the group, a zombie's queued records
expired) need no revival: their input is another member's now.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: librdkafka's codes for a record that was not (or not surely) delivered, and is not going
#: to be: ``_MSG_TIMED_OUT`` (-192, ``message.timeout.ms``), ``_TIMED_OUT`` (-185),
#: ``REQUEST_TIMED_OUT`` (7), ``_PURGE_QUEUE`` (-152) and ``_PURGE_INFLIGHT`` (-151), the
#: reports of a :meth:`Producer.purge`.
NOT_DELIVERED_CODES = frozenset({-192, -185, 7, -152, -151})


#: Codes of a producer that can send nothing more: ``PRODUCER_FENCED`` (90),
#: ``INVALID_PRODUCER_EPOCH`` (47), ``UNKNOWN_PRODUCER_ID`` (59), ``_FATAL`` (-150, what
#: librdkafka reports for every record once the producer is fatal).
PRODUCER_LOST_CODES = frozenset({90, 47, 59, -150})


def producer_lost(err: Any) -> bool:
    """The record of this report was not delivered because its producer can send nothing
    more: a new producer sends it again."""
    code = getattr(err, "code", None)
    return callable(code) and code() in PRODUCER_LOST_CODES


def described(err: Any) -> str:
    """A delivery error as an operator should read it: librdkafka words a fenced idempotent
    producer as a transactional one, which an at-least-once app does not use."""
    if producer_lost(err):
        return (f"the broker no longer takes this thread's idempotent producer, as after a "
                f"pause past the session; a new producer sends again (librdkafka: {err})")
    return str(err)


def not_delivered(err: Any) -> bool:
    """The record of this delivery report was not delivered and is not being sent again: its
    input must be processed again. Anything without a Kafka error code counts as refused."""
    code = getattr(err, "code", None)
    return callable(code) and code() in NOT_DELIVERED_CODES


@dataclass(frozen=True)
class DeliveryVerdict:
    """What a commit does with the delivery errors since the last one."""

    #: Running tasks whose records did not get through: revived, their offsets not committed.
    replay: frozenset[str]
    #: The first refusal: fatal to the thread (None: none).
    refusal: Any = None
    #: The producer can send nothing more: the thread replaces it.
    producer_lost: bool = False


def judge(errors: Iterable[tuple[str, Any]], running: Iterable[str]) -> DeliveryVerdict:
    """The verdict on ``errors`` (task id, delivery error) for a thread that runs the tasks
    ``running``."""
    held = set(running)
    replay: set[str] = set()
    lost = False
    for task_id, err in errors:
        if producer_lost(err):
            lost = True
        elif not not_delivered(err):
            return DeliveryVerdict(frozenset(), err)
        if task_id in held:
            replay.add(task_id)
    return DeliveryVerdict(frozenset(replay), producer_lost=lost)
