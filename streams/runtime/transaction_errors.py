"""What a task's failed transaction says about the task: taken over by another producer
(fenced: the task belongs to someone else now), or failed on its own (the task is still this
thread's, and may start again at once from its committed state).

A transaction fails without any fencing when the broker's coordinators move: after a SIGKILL
of the broker that coordinated the group, librdkafka sends the offsets of the next
transactions to the group's old coordinator once it is back, which answers
``NOT_COORDINATOR``, and the transaction can only be aborted. Treating that as a fencing
closed every task of every thread and asked the whole group to rebalance, at the moment the
group's coordinator had just moved: rounds on rounds, and tasks stalled for minutes (214 s in
the fault suite). Kafka Streams revives such a task in place (``TaskCorruptedException``:
closed dirty, reopened, no rebalance); so does Relay.
"""

from __future__ import annotations

from typing import Any

#: librdkafka's codes for "another producer with this transactional id took over":
#: ``_FENCED`` (-144), ``INVALID_PRODUCER_EPOCH`` (47), ``PRODUCER_FENCED`` (90).
FENCING_CODES = frozenset({-144, 47, 90})


def kafka_error(error: BaseException | None) -> Any:
    """The confluent-kafka ``KafkaError`` an exception carries (a ``KafkaException``'s first
    argument, or the error a :class:`TransactionFailed` names as its cause), or None."""
    while error is not None:
        args = getattr(error, "args", ())
        if args and hasattr(args[0], "code") and hasattr(args[0], "fatal"):
            return args[0]
        if hasattr(error, "code") and hasattr(error, "fatal"):
            return error
        error = getattr(error, "cause", None) or error.__cause__
    return None


def revivable(error: BaseException) -> bool:
    """Whether the task whose transaction failed with ``error`` may be revived in place: the
    error comes from the broker or the client (a Kafka error), and it is neither a fencing
    nor fatal to the producer. Anything else (fenced, fatal, or not a Kafka error at all)
    goes to the group, as before."""
    err = kafka_error(error)
    if err is None:
        return False
    return not err.fatal() and err.code() not in FENCING_CODES
