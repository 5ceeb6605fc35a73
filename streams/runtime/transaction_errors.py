"""What a task's failed transactional call says, as confluent-kafka's error flags tell it.

- **Retriable** (``err.retriable()``, neither abortable nor fatal: a timed-out call): the call's
  outcome is not known yet, and the call is made again. A ``commit_transaction`` that timed
  out may still commit: aborting then (or reviving from the state before it) would take a
  committed transaction for an aborted one.
- **Fenced** (another producer took the transactional id over: ``_FENCED``,
  ``PRODUCER_FENCED``, ``INVALID_PRODUCER_EPOCH``, or a fatal producer, or ``_FATAL`` in a
  delivery report, which carries no fatal flag): the task belongs to someone else now. It is
  closed and the group asked to plan again (Kafka Streams' ``TaskMigratedException``).
- **Anything else a Kafka error says** (``txn_requires_abort()``: ``NOT_COORDINATOR`` from the
  group's old coordinator after a broker's SIGKILL, a send that timed out, a call still
  undecided after its retries, a call that never returned): the task is still this
  thread's. It is revived in place:
  closed dirty and started again from its committed state, without the group (Kafka Streams'
  ``TaskCorruptedException``). Its committed offsets are read only after its new producer
  fenced the old one, which settles an undecided transaction either way.

An error that is not a Kafka error at all is taken for a fencing: the group decides.
"""

from __future__ import annotations

from typing import Any

#: librdkafka's codes for "another producer with this transactional id took over":
#: ``_FENCED`` (-144), ``INVALID_PRODUCER_EPOCH`` (47), ``PRODUCER_FENCED`` (90); and
#: ``_FATAL`` (-150), which a delivery report carries, without the fatal flag, once its
#: producer is in a fatal state (fenced, as a rule).
FENCING_CODES = frozenset({-144, 47, 90, -150})


def kafka_error(error: BaseException | None) -> Any:
    """The confluent-kafka ``KafkaError`` an exception carries (a ``KafkaException``'s first
    argument, or the error a failed transaction names as its ``cause``), or None."""
    seen = 0
    while error is not None and seen < 8:
        seen += 1
        args = getattr(error, "args", ())
        if args and hasattr(args[0], "code") and hasattr(args[0], "fatal"):
            return args[0]
        if hasattr(error, "code") and hasattr(error, "fatal"):
            return error
        cause = getattr(error, "cause", None)
        if cause is not None and hasattr(cause, "code") and hasattr(cause, "fatal"):
            return cause
        error = cause if isinstance(cause, BaseException) else error.__cause__
    return None


def retriable(error: BaseException) -> bool:
    """The call that raised ``error`` may simply be made again: its outcome is not known."""
    err = kafka_error(error)
    return (err is not None and err.retriable() and not err.txn_requires_abort()
            and not err.fatal())


def fenced(error: BaseException) -> bool:
    """The task's transactional id belongs to another producer now (or the error is not
    one Kafka's client raised, and the group is asked to decide)."""
    err = kafka_error(error)
    return err is None or err.fatal() or err.code() in FENCING_CODES


def revivable(error: BaseException) -> bool:
    """The task whose transaction failed with ``error`` may start again in place (a call
    that hung past its timeout included: a new producer finds the coordinators afresh)."""
    return getattr(error, "hung", False) or not fenced(error)
