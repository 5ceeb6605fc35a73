"""What the log says of dead letters: each of a task's first ones in full, then one line per
thousand, so that a wrong serde on a busy topic (every record dead-lettered) does not write a
line per record; and once, as an error, when a task's every record so far failed to
deserialize, which is a wrong serde rather than bad records."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from streams.runtime.task import MAX_ERROR_CHARS, RecordError

log = logging.getLogger(__name__)

#: Dead letters of one task logged one by one before they are summed up.
LOGGED_IN_FULL = 10
#: After those, one line per this many.
SUMMED_EVERY = 1_000
#: A task whose first this many records all failed to deserialize has a wrong serde.
ALL_FAILED_AFTER = 100


@dataclass
class DeadLetterLog:
    """Per task: how many dead letters so far, and whether the all-failed error was said."""

    counts: dict[str, int] = field(default_factory=dict)
    said_all_failed: set[str] = field(default_factory=set)

    def note(self, task: str, stage: str, processed: int) -> tuple[bool, bool]:
        """A dead letter of ``task`` at ``stage``, the task having processed ``processed``
        records fine: whether to log it, and whether to say (once) that every record of the
        task failed to deserialize."""
        count = self.counts[task] = self.counts.get(task, 0) + 1
        log_it = count <= LOGGED_IN_FULL or count % SUMMED_EVERY == 0
        all_failed = (stage == "deserialize" and processed == 0 and count >= ALL_FAILED_AFTER
                      and task not in self.said_all_failed)
        if all_failed:
            self.said_all_failed.add(task)
        return log_it, all_failed

    def report(self, error: RecordError, task_id: str, processed: int, topic: str) -> None:
        """Log a dead letter of ``task_id`` sent to ``topic`` as :meth:`note` decides (every
        record collector, at-least-once or exactly-once, says the same)."""
        record = error.record
        log_it, all_failed = self.note(task_id, error.stage, processed)
        if log_it:
            count = self.counts[task_id]
            more = "" if count <= LOGGED_IN_FULL else (
                f" ({count} dead letters of task {task_id} so far; one line per "
                f"{SUMMED_EVERY} from the {LOGGED_IN_FULL}th)")
            log.warning("%s; sent to %s%s", str(error)[:MAX_ERROR_CHARS], topic, more)
        if all_failed:
            log.error("task %s: every one of its first %d records failed to deserialize (the "
                      "last at %s[%d]@%d, its %s): the serde declared for the topic is likely "
                      "not the one its producer used. They go to %s and are committed; "
                      "on_error='stop' stops at the first instead", task_id, ALL_FAILED_AFTER,
                      record.topic, record.partition, record.offset, error.part or "value",
                      topic)
