"""The log of dead letters: a task's first ones in full, then one line per thousand; once, an
error, when a task's every record so far failed to deserialize (a wrong serde)."""

from __future__ import annotations

from streams.runtime.dead_letter_log import (
    ALL_FAILED_AFTER,
    LOGGED_IN_FULL,
    SUMMED_EVERY,
    DeadLetterLog,
)


def test_a_flood_of_dead_letters_is_summed_up_and_a_wrong_serde_said_once() -> None:
    log = DeadLetterLog()
    notes = [log.note("0_1", "deserialize", 0) for _ in range(5_003)]
    logged = [n for n, (log_it, _) in enumerate(notes, 1) if log_it]
    assert logged == [*range(1, LOGGED_IN_FULL + 1), *range(SUMMED_EVERY, 5_003, SUMMED_EVERY)]
    assert [n for n, (_, all_failed) in enumerate(notes, 1) if all_failed] == [ALL_FAILED_AFTER]


def test_bad_records_among_good_ones_are_no_wrong_serde() -> None:
    log = DeadLetterLog()
    # A task that processed records fine, or whose records failed in its steps' code.
    assert not any(log.note("0_1", "deserialize", 7)[1] for _ in range(500))
    assert not any(log.note("0_2", "process", 0)[1] for _ in range(500))
    assert log.note("0_3", "deserialize", 0) == (True, False)  # counted per task
