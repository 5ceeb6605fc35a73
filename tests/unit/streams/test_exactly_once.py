"""Exactly-once processing with fake clients (no broker): a new active fences its previous
owner before its state is read; a task's outputs, changelog records and input offsets commit
in one transaction, after which (and only after which) its store applies its write buffer;
a fenced transaction discards the buffer and the task reopens from its committed state; a
transaction that failed without a fencing revives its task in place, and a commit that timed
out is made again (it may have gone through)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from aiokafka.structs import TopicPartition
from confluent_kafka import KafkaError, KafkaException

from statestore.checkpoint import read_checkpoint
from statestore.store import INPUT_POSITION_KEY
from streams.app import App
from streams.config import AppConfig, ConfigError
from streams.dsl.topology import SubTopology
from streams.runtime.transaction_errors import fenced, retriable, revivable
from streams.runtime.transactions import (
    OffsetsEvidence,
    TransactionalCollector,
    TransactionalCommitter,
    TransactionFailed,
)
from tests.unit.streams.fakes import SINK, SOURCE, Rig, TransactionLog, assign, record, rig

CHANGELOG = "unit-counts-changelog"
TP0 = TopicPartition(SOURCE, 0)


@contextlib.asynccontextmanager
async def eos_rig(tmp_path: Path, **settings: Any):
    r = rig(tmp_path, processing_guarantee="exactly_once", **settings)
    # The group's offsets are those the committed transactions carried, and a restoration
    # replays the committed changelog, as on a broker.
    r.consumer.transactions = log_of(r)
    r.restorer.transactions = log_of(r)
    # A sending of offsets is not given up for being slower than another task's (a thread
    # started late on a loaded machine), but in the test of that rule.
    committer = r.thread.committer
    assert isinstance(committer, TransactionalCommitter)
    committer.offsets_after_another_s = float("inf")
    try:
        yield r
    finally:
        r.thread.task_manager.close_all()
        await r.thread.collector.close()


def log_of(r: Rig) -> TransactionLog:
    assert r.transactions is not None
    return r.transactions


async def process(r: Rig, *records: object) -> None:
    await r.thread.process({TP0: list(records)})
    await r.thread.collector.ship(r.thread.registry.active.values())


def test_the_guarantee_is_a_setting_at_least_once_by_default() -> None:
    assert AppConfig("app").processing_guarantee == "at_least_once"
    assert AppConfig("app", processing_guarantee="exactly_once").exactly_once
    with pytest.raises(ConfigError, match="processing_guarantee must be"):
        AppConfig("app", processing_guarantee="exactly-once")
    assert AppConfig.from_env({"RELAY_PROCESSING_GUARANTEE": "exactly_once"},
                              application_id="a").exactly_once


async def test_the_exactly_once_thread_commits_through_transactions(tmp_path: Path) -> None:
    async with eos_rig(tmp_path) as r:
        assert isinstance(r.thread.collector, TransactionalCollector)
        assert isinstance(r.thread.committer, TransactionalCommitter)


async def test_a_new_active_fences_its_previous_owner_before_its_state_is_restored(
    tmp_path: Path,
) -> None:
    events: list[str] = []
    async with eos_rig(tmp_path, events=events) as r:
        await assign(r, ("0_0", "0_1"))
        order = [e for e in events if e.startswith(("init", "restore"))]
        # The two tasks are restored together; each is fenced before its changelog is read.
        assert sorted(order) == ["init unit-0_0", "init unit-0_1", "restore counts/0",
                                 "restore counts/1"]
        assert order.index("init unit-0_0") < order.index("restore counts/0")
        assert order.index("init unit-0_1") < order.index("restore counts/1")


async def test_outputs_changelog_and_offsets_commit_together_then_the_store_applies_them(
    tmp_path: Path,
) -> None:
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        await assign(r, ("0_0",))
        store = r.thread.tasks["0_0"].stores["counts"]
        await process(r, record(0, 0, "a"), record(0, 1, "b"), record(0, 2, "a"))
        # Read your writes: the open transaction's counts are seen by the task...
        assert store.get("a") == 2 and store.uncommitted > 0
        # ...and by no one else: nothing is committed, the checkpoint has not moved.
        assert log.records == [] and log.offsets == {}
        assert read_checkpoint(store.directory, CHANGELOG, 0) is None
        await r.thread.committer.commit()
        assert [msgpack.unpackb(o.value) for o in log.to(SINK)] == [1, 1, 2]
        changelog = log.to(CHANGELOG)
        assert changelog[-1].key == INPUT_POSITION_KEY  # the input position goes with it
        assert msgpack.unpackb(changelog[-1].value) == {f"{SOURCE}:0": 3, "stream-time": 1000}
        assert log.offsets == {(SOURCE, 0): 3}
        assert r.consumer.commits == []  # offsets go in the transaction, not the group commit
        assert store.uncommitted == 0 and store.get("a") == 2
        checkpoint = read_checkpoint(store.directory, CHANGELOG, 0)
        assert checkpoint is not None and checkpoint.offset == len(changelog)


async def test_a_fenced_transaction_discards_its_writes_and_the_task_reopens_from_its_committed_state(  # noqa: E501
    tmp_path: Path,
) -> None:
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        await assign(r, ("0_0",))
        await process(r, record(0, 0, "a"))
        await r.thread.committer.commit()
        committed_records = list(log.records)
        await process(r, record(0, 1, "a"), record(0, 2, "b"))
        assert r.thread.tasks["0_0"].stores["counts"].get("a") == 2
        # Another owner of 0_0 starts: this member is now a zombie for it.
        log.producer("unit-0_0").init_transactions()
        # The zombie's producer refuses its next records; processing goes on until commit.
        await process(r, record(0, 3, "c"))
        await r.thread.committer.commit()
        assert r.thread.committer.failures == 1
        assert log.records == committed_records and log.offsets == {(SOURCE, 0): 1}
        assert "0_0" not in r.thread.tasks and r.consumer.rejoins >= 1
        # Handed back, the task resumes from the committed state on disk: its store has
        # the committed count only, and the input resumes after the committed record.
        r.consumer.seeks.clear()
        await assign(r, ("0_0",))
        store = r.thread.tasks["0_0"].stores["counts"]
        assert store.has_checkpoint  # no full restore: the checkpoint vouches for the disk
        assert store.get("a") == 1 and store.get("b") is None
        assert r.consumer.seeks[TP0] == 1
        await process(r, record(0, 1, "a"), record(0, 2, "b"))
        await r.thread.committer.commit()
        assert [msgpack.unpackb(o.value) for o in log.to(SINK)] == [1, 2, 1]


def failure(code: int, **kind: bool) -> KafkaException:
    return KafkaException(KafkaError(code, "injected", **kind))


def not_coordinator() -> KafkaException:
    """What librdkafka raises when the group's old coordinator, back after a SIGKILL, answers
    the transaction's offsets: the transaction can only be aborted."""
    return failure(KafkaError.NOT_COORDINATOR, txn_requires_abort=True)


def timed_out() -> KafkaException:
    return failure(KafkaError._TIMED_OUT, retriable=True)


class _Failing:
    """A task's transactional producer whose ``call`` raises ``error()`` ``times`` times;
    ``lands``: a commit reaches the broker all the same (its answer timed out on its way
    back), and the broker completes it before the error is raised."""

    def __init__(self, producer: Any, call: str, error: Any, times: int = 1,
                 lands: bool = False) -> None:
        self._producer, self._call, self._error = producer, call, error
        self.left, self._lands = times, lands

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._producer, name)
        if name != self._call:
            return method

        def call(*args: Any) -> Any:
            if self.left:
                self.left -= 1
                if self._lands and self._producer.in_transaction:
                    self._producer.prepare_commit()
                raise self._error()
            return method(*args)
        return call


async def committed_on_0_0(r: Rig, records: list[Any]) -> tuple[TransactionalCommitter, Any]:
    """Task 0_0 assigned, ``records`` processed and committed: the committer, and the task's
    transaction (its producer) as it stands."""
    committer = r.thread.committer
    assert isinstance(committer, TransactionalCommitter)
    await assign(r, ("0_0",))
    await process(r, *records)
    await committer.commit()
    return committer, r.thread.collector.producers.transactions["0_0"]  # type: ignore[union-attr]


def fail_the_next_init(producers: Any) -> list[_Failing]:
    """Make the next producer that ``producers`` start fail its ``init_transactions`` once
    (timed out); the list gets that producer."""
    new_producer = producers._new_producer
    failing: list[_Failing] = []

    def failing_once(tid: str) -> Any:
        if failing:
            return new_producer(tid)
        failing.append(_Failing(new_producer(tid), "init_transactions", timed_out))
        return failing[0]

    producers._new_producer = failing_once
    return failing


def inject(r: Rig, task_id: str, call: str, error: Any, **kind: Any) -> _Failing:
    transaction = r.thread.collector.producers.transactions[task_id]  # type: ignore[union-attr]
    failing = _Failing(transaction.producer, call, error, **kind)
    transaction.producer = failing
    return failing


def counts_out(log: TransactionLog) -> list[tuple[str, int]]:
    return [(msgpack.unpackb(o.key), msgpack.unpackb(o.value)) for o in log.to(SINK)]


async def run_to_end(r: Rig, records: list[Any], start: int) -> None:
    """Feed ``records`` from the task's position on (the fake consumer does not seek: the
    test does, as a real one would after the seek) until every one is processed and
    committed."""
    task = r.thread.tasks["0_0"]
    position = task.processed.get(TP0, start)
    await process(r, *records[position:])
    await r.thread.committer.commit()


@pytest.mark.parametrize("call", ["send_offsets_to_transaction", "commit_transaction"])
async def test_a_transaction_failed_without_a_fencing_revives_its_task_in_place_exactly_once(
    tmp_path: Path, call: str,
) -> None:
    records = [record(0, i, k) for i, k in enumerate("abab")]
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        await assign(r, ("0_0",))
        await process(r, *records[:1])
        await r.thread.committer.commit()
        inject(r, "0_0", call, not_coordinator)
        await process(r, *records[1:3])
        rejoins, requests = r.consumer.rejoins, list(r.control.rebalance_requests)
        r.consumer.seeks.clear()
        await r.thread.committer.commit()
        assert r.thread.committer.failures == 1
        assert log.offsets == {(SOURCE, 0): 1} and counts_out(log) == [("a", 1)]
        # No fencing: the group is not asked to rebalance; the task restores and runs again.
        assert r.consumer.rejoins == rejoins and r.control.rebalance_requests == requests
        assert "0_0" in r.thread.registry.restoring and TP0 in r.consumer.paused
        await r.thread.state_updater.restore_pending()
        task = r.thread.tasks["0_0"]
        # It resumes after the last committed record, its store at the committed state.
        assert r.consumer.seeks[TP0] == 1 and task.processed[TP0] == 1
        assert TP0 not in r.consumer.paused
        store = task.stores["counts"]
        assert store.get("a") == 1 and store.get("b") is None
        await run_to_end(r, records, 1)
        # Every input record's effect once: in the outputs, the store and the offsets.
        assert counts_out(log) == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
        assert store.get("a") == 2 and store.get("b") == 2
        assert log.offsets == {(SOURCE, 0): 4}
        assert r.thread.committer.failures == 1


async def test_a_commit_that_timed_out_is_made_again_and_counts_once(tmp_path: Path) -> None:
    records = [record(0, i, k) for i, k in enumerate("abab")]
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        await assign(r, ("0_0",))
        await process(r, *records[:2])
        # The commit reaches the broker, but its answer does not come back in time.
        injected = inject(r, "0_0", "commit_transaction", timed_out, lands=True)
        await r.thread.committer.commit()
        assert injected.left == 0
        assert r.thread.committer.failures == 0 and "0_0" in r.thread.tasks
        assert log.offsets == {(SOURCE, 0): 2}
        await run_to_end(r, records, 2)
        assert counts_out(log) == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
        store = r.thread.tasks["0_0"].stores["counts"]
        assert store.get("a") == 2 and store.get("b") == 2


class _Hangs:
    """A producer whose ``send_offsets_to_transaction`` does not return, whatever its timeout,
    until released: librdkafka's wait for a group coordinator that is gone."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer
        self.release = threading.Event()
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def send_offsets_to_transaction(self, *args: Any) -> None:
        # Returns at last, had the commit waited (it then goes through: the test fails).
        self.calls += 1
        self.release.wait(5)
        self._producer.send_offsets_to_transaction(*args)


async def commit_until_hung(committer: Any, hangs: _Hangs) -> asyncio.Future[None]:
    """Start ``committer``'s commit and return it once its sending of offsets hangs. Its
    rules are checked every ms; the one of a coordinator known for a while is off (the fake
    consumer has had one from the start), so only the rule a test sets gives the call up."""
    committer.offsets_known_coordinator_s = float("inf")
    committer.offsets_check_s = 0.001
    waiting = asyncio.ensure_future(committer.commit())
    while not hangs.calls:
        await asyncio.sleep(0.001)
    return waiting


async def hang_the_next_offsets(r: Any, records: list[Any]) -> _Hangs:
    """Task 0_0 commits its first record; then its producer's sending of offsets hangs, and
    the next two records are processed (the commit to come sends their offsets)."""
    await assign(r, ("0_0",))
    await process(r, *records[:1])
    await r.thread.committer.commit()
    transaction = r.thread.collector.producers.transactions["0_0"]
    hangs = _Hangs(transaction.producer)
    transaction.producer = hangs
    await process(r, *records[1:3])
    return hangs


async def test_a_transactional_call_that_hangs_past_its_timeout_revives_its_task(
    tmp_path: Path,
) -> None:
    records = [record(0, i, k) for i, k in enumerate("abab")]
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        committer = r.thread.committer
        hangs = await hang_the_next_offsets(r, records)
        try:
            # The commit gives up on the call instead of holding the thread with it (after a
            # few ms here: the unit tier may not sit out a longer timer).
            committer.offsets_timeout_s, committer.offsets_grace_s = 0.002, 0.003
            await committer.commit()
            committer.offsets_timeout_s, committer.offsets_grace_s = 30.0, 5.0
            assert committer.failures == 1 and "0_0" in r.thread.registry.restoring
            await r.thread.state_updater.restore_pending()
            assert r.consumer.seeks[TP0] == 1
            await run_to_end(r, records, 1)
        finally:
            hangs.release.set()
        assert counts_out(log) == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
        assert log.offsets == {(SOURCE, 0): 4} and r.consumer.rejoins == 0


class _Timeouts:
    """A producer that records the timeout each call of a transaction is given."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer
        self.timeouts: dict[str, float] = {}
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._producer, name)
        if name not in ("flush", "send_offsets_to_transaction", "commit_transaction"):
            return call

        def timed(*args: Any) -> Any:
            self.timeouts[name] = args[-1]
            self.calls.append(name)
            return call(*args)

        timed.__name__ = name
        return timed


async def test_a_hung_sending_of_offsets_is_given_up_sooner_than_the_other_calls(
    tmp_path: Path,
) -> None:
    """librdkafka's sending of offsets can hang for as long as it is waited for after the
    group's coordinator died, however long its timeout: the task is revived only when the
    wait ends. It is waited for long enough for the coordinator to move, not the 30 s + 5 s
    of the transaction's other calls."""
    async with eos_rig(tmp_path) as r:
        committer = r.thread.committer
        assert isinstance(committer, TransactionalCommitter)
        await assign(r, ("0_0",))
        transaction = r.thread.collector.producers.transactions["0_0"]  # type: ignore[union-attr]
        timed = _Timeouts(transaction.producer)
        transaction.producer = timed
        await process(r, record(0, 0, "a"))
        await committer.commit()
        assert committer.commits == 1
        offsets_wait = timed.timeouts["send_offsets_to_transaction"] + committer.offsets_grace_s
        flush_wait = timed.timeouts["flush"] + committer.call_grace_s
        assert offsets_wait < flush_wait


async def test_the_offsets_are_sent_before_the_flush(tmp_path: Path) -> None:
    """After a broker's SIGKILL the flush waits for the partitions' leaders to move; offsets
    sent after it, to a group coordinator that moved meanwhile, were the ones that hung. Sent
    first, they go while the old coordinator is still known to be down, and a hang is given
    up while the flush would still be waiting."""
    async with eos_rig(tmp_path) as r:
        await assign(r, ("0_0",))
        transaction = r.thread.collector.producers.transactions["0_0"]  # type: ignore[union-attr]
        timed = _Timeouts(transaction.producer)
        transaction.producer = timed
        await process(r, record(0, 0, "a"))
        await r.thread.committer.commit()
        assert timed.calls == ["send_offsets_to_transaction", "flush", "commit_transaction"]
        assert log_of(r).offsets == {(SOURCE, 0): 1}


async def test_a_sending_of_offsets_still_waiting_once_the_group_has_its_coordinator_is_given_up(
    tmp_path: Path,
) -> None:
    """After the coordinator's SIGKILL librdkafka may wait on the dead one, its stale choice,
    long after the group's consumer found the new one: the call is given up then, its task
    revived, without waiting out the call's own bound."""
    records = [record(0, i, k) for i, k in enumerate("abab")]
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        committer = r.thread.committer
        assert isinstance(committer, TransactionalCommitter)
        hangs = await hang_the_next_offsets(r, records)
        try:
            # The group's consumer has its coordinator; the call goes on past the (here
            # zero) time it is given once it has (checked every ms: the unit tier may not
            # sit out a longer timer), well within its own bound.
            r.consumer.coordinator_since = 0.0
            committer.offsets_known_coordinator_s, committer.offsets_check_s = 0.0, 0.001
            await committer.commit()
            assert committer.failures == 1 and "0_0" in r.thread.registry.restoring
            committer.offsets_known_coordinator_s = float("inf")  # the next call: not given up
            await r.thread.state_updater.restore_pending()
            await run_to_end(r, records, 1)
        finally:
            hangs.release.set()
        assert counts_out(log) == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
        assert log.offsets == {(SOURCE, 0): 4} and r.consumer.rejoins == 0


@pytest.mark.parametrize("cause", ["the coordinator moved", "the coordinator is moving",
                                   "slow offsets", "neither"])
async def test_a_producer_that_waited_out_the_coordinators_move_is_replaced_after_its_commit(
    tmp_path: Path, cause: str,
) -> None:
    """After the SIGKILL of the group's coordinator, a producer whose sending of offsets
    waited out the move sends its next ones to the dead broker, and hangs: once its
    transaction has committed, it is replaced by a new producer (fencing it, with no
    transaction open), and the task goes on, neither revived nor rebalanced."""
    records = [record(0, i, k) for i, k in enumerate("abab")]
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        committer, old = await committed_on_0_0(r, records[:1])
        if cause == "the coordinator moved":
            r.consumer.coordinator_since = old.since + 1.0  # found after the producer's start
        elif cause == "the coordinator is moving":
            r.consumer.coordinator_since = None  # marked dead, looked for
        elif cause == "slow offsets":
            committer.renew_after_offsets_s = -1.0  # any sending of offsets counts as slow
        await process(r, *records[1:3])
        await committer.commit()
        renewed = r.thread.collector.producers.transactions["0_0"]  # type: ignore[union-attr]
        assert (renewed is not old) == (cause != "neither")
        assert committer.failures == 0 and "0_0" in r.thread.tasks
        r.consumer.coordinator_since, committer.renew_after_offsets_s = 0.0, 3.0
        await run_to_end(r, records, 3)
        assert counts_out(log) == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
        assert log.offsets == {(SOURCE, 0): 4} and r.consumer.rejoins == 0
        assert committer.commits == 3 and log.aborted == 0


@pytest.mark.parametrize("history", ["moved", "found first", "lost, found on its node",
                                     "moved before it"])
async def test_a_producer_from_before_the_coordinators_move_is_replaced_without_a_commit(
    tmp_path: Path, history: str,
) -> None:
    """Run S: a task committed just before the SIGKILL of the group's coordinator, its thread
    then waited on another task's hung call, and its next sending of offsets, on the producer
    from before the move, hung too. Once the coordinator was lost and found on another node
    after the producer was made, the producer is replaced between transactions at the end of
    a commit, whether or not the task committed in it; not for a thread's first find of
    the coordinator, a coordinator found again on the same node, or a move the producer
    came after."""
    records = [record(0, i, k) for i, k in enumerate("abab")]
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        committer, old = await committed_on_0_0(r, records[:2])
        if history in ("moved", "lost, found on its node"):
            r.consumer.coordinator_lost = time.monotonic()
        if history in ("moved", "found first"):
            r.consumer.coordinator_found = time.monotonic()
        if history == "moved before it":
            r.consumer.coordinator_lost = r.consumer.coordinator_found = old.since - 1.0
        await committer.commit()  # nothing to commit: the task's transaction is not open
        renewed = r.thread.collector.producers.transactions["0_0"]  # type: ignore[union-attr]
        assert (renewed is not old) == (history == "moved")
        assert committer.failures == 0 and "0_0" in r.thread.tasks
        await committer.commit()  # replaced once
        assert r.thread.collector.producers.transactions["0_0"] is renewed  # type: ignore[union-attr]
        await run_to_end(r, records, 2)
        assert counts_out(log) == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
        assert log.offsets == {(SOURCE, 0): 4} and r.consumer.rejoins == 0
        assert log.aborted == 0


@pytest.mark.parametrize("through_the_move", ["a commit", "nothing to commit"])
async def test_a_producer_that_cannot_be_replaced_revives_its_task_from_what_it_committed(
    tmp_path: Path, through_the_move: str,
) -> None:
    """The replacement of a producer is one attempt, made while the thread's lock is held: if
    its ``init_transactions`` fails, the task, its transaction committed, is revived (its next
    producer is started off the lock, with retries), neither closed nor rebalanced; so it is
    for a producer from before the coordinator's move whose task had nothing to commit
    through it."""
    records = [record(0, i, k) for i, k in enumerate("abab")]
    committed = 3 if through_the_move == "a commit" else 2
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        committer = r.thread.committer
        assert isinstance(committer, TransactionalCommitter)
        producers = r.thread.collector.producers  # type: ignore[union-attr]
        await assign(r, ("0_0",))
        await process(r, *records[:1 if through_the_move == "a commit" else 2])
        await committer.commit()
        failing = fail_the_next_init(producers)
        if through_the_move == "a commit":
            r.consumer.coordinator_since = None  # the group's coordinator is moving
            await process(r, *records[1:3])
        else:
            r.consumer.coordinator_lost = r.consumer.coordinator_found = time.monotonic()
        await committer.commit()
        r.consumer.coordinator_since = 0.0
        assert failing and failing[0].left == 0
        assert committer.commits == committed - 1 and committer.failures == 1
        assert "0_0" in r.thread.registry.restoring and r.consumer.rejoins == 0
        await r.thread.state_updater.restore_pending()
        assert r.consumer.seeks[TP0] == committed
        await run_to_end(r, records, committed)
        assert counts_out(log) == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
        assert log.offsets == {(SOURCE, 0): 4} and log.aborted == 0


async def test_a_sending_of_offsets_still_waiting_once_another_tasks_went_through_is_given_up(
    tmp_path: Path,
) -> None:
    """Two tasks' offsets are sent together after the coordinator's SIGKILL: one goes through
    once the coordinators moved, the other waits on the dead broker. It is given up soon
    after the first went through (here at once, checked every ms: the unit tier may not sit
    out a longer timer), before the group's consumer says anything, its task revived; the
    other task commits."""
    records = [record(0, i, k) for i, k in enumerate("abab")]
    tp1 = TopicPartition(SOURCE, 1)
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        committer = r.thread.committer
        assert isinstance(committer, TransactionalCommitter)
        await assign(r, ("0_0", "0_1"))
        await r.thread.process({TP0: records[:1], tp1: [record(1, 0, "c")]})
        await committer.commit()
        transaction = r.thread.collector.producers.transactions["0_0"]  # type: ignore[union-attr]
        hangs = _Hangs(transaction.producer)
        transaction.producer = hangs
        await r.thread.process({TP0: records[1:3], tp1: [record(1, 1, "c")]})
        try:
            committer.offsets_after_another_s, committer.offsets_check_s = 0.0, 0.001
            await committer.commit()
            committer.offsets_after_another_s = float("inf")
            assert committer.failures == 1 and "0_0" in r.thread.registry.restoring
            assert log.offsets[(SOURCE, 1)] == 2
            await r.thread.state_updater.restore_pending()
            await run_to_end(r, records, 1)
        finally:
            hangs.release.set()
        assert [o for o in counts_out(log) if o[0] != "c"] == [
            ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
        assert log.offsets[(SOURCE, 0)] == 4 and r.consumer.rejoins == 0


def stateless_subs() -> list[SubTopology]:
    app = App("unit", bootstrap_servers="127.0.0.1:1")
    app.stream(SOURCE).map_values(lambda v: v * 10).to(SINK)
    subs = app.topology.sub_topologies()
    app.topology.assign_partitions(subs, {SOURCE: 4}, 4)
    return subs


@pytest.mark.parametrize("lands", [True, False])
async def test_a_commit_still_undecided_revives_its_task_from_what_the_fencing_settled(
    tmp_path: Path, lands: bool,
) -> None:
    """A commit that timed out on every try may or may not have gone through: the task's
    next producer settles it when it fences the old one, and the task resumes from what that
    left, read after the fencing. A stateless task has nothing but the group's offsets to
    tell it where."""
    records = [record(0, i, k, value=i) for i, k in enumerate("abcd")]
    async with eos_rig(tmp_path, subs=stateless_subs()) as r:
        log = log_of(r)
        r.thread.committer.commit_budget_s = 0.0
        await assign(r, ("0_0",))
        await process(r, *records[:2])
        inject(r, "0_0", "commit_transaction", timed_out, times=100, lands=lands)
        await r.thread.committer.commit()
        assert r.thread.committer.failures == 1
        assert "0_0" in r.thread.registry.restoring and r.consumer.rejoins == 0
        for _ in range(5):
            await asyncio.sleep(0)  # the thread's loop runs on before the restoration starts
        await r.thread.state_updater.restore_pending()
        assert r.consumer.seeks[TP0] == (2 if lands else 0)
        await run_to_end(r, records, 0 if not lands else 2)
        assert [msgpack.unpackb(o.value) for o in log.to(SINK)] == [0, 10, 20, 30]
        assert log.offsets == {(SOURCE, 0): 4}


@pytest.mark.parametrize("lands", [True, False])
async def test_a_revived_task_keeps_its_stores_open_rolled_back_to_what_was_committed(
    tmp_path: Path, lands: bool,
) -> None:
    """A revival does not close and reopen the task's stores (RocksDB's close and open took
    0.5 to 1 s on the event loop after a broker's SIGKILL): they are rolled back to their
    last commit, and restored from there, so that a commit that went through after all is
    applied, and one that did not is not; later commits are acknowledged as usual."""
    records = [record(0, i, k) for i, k in enumerate("abab")]
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        r.thread.committer.commit_budget_s = 0.0
        await assign(r, ("0_0",))
        await process(r, *records[:1])
        await r.thread.committer.commit()
        store = r.thread.tasks["0_0"].stores["counts"]
        await process(r, *records[1:3])
        inject(r, "0_0", "commit_transaction", timed_out, times=100, lands=lands)
        await r.thread.committer.commit()
        assert r.thread.committer.failures == 1 and "0_0" in r.thread.registry.restoring
        assert store.is_open and r.thread.registry.restoring["0_0"]["counts"] is store
        await r.thread.state_updater.restore_pending()
        assert r.thread.tasks["0_0"].stores["counts"] is store
        position = 3 if lands else 1
        assert r.consumer.seeks[TP0] == position
        assert (store.get("a"), store.get("b")) == ((2, 1) if lands else (1, None))
        await run_to_end(r, records, position)
        assert counts_out(log) == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
        assert store.get("a") == 2 and store.get("b") == 2
        assert log.offsets == {(SOURCE, 0): 4} and r.consumer.rejoins == 0


def test_what_a_failed_transactional_call_says() -> None:
    assert revivable(not_coordinator()) and not fenced(not_coordinator())
    assert retriable(timed_out()) and revivable(timed_out())
    assert not retriable(not_coordinator())
    assert revivable(TransactionFailed("sends failed", KafkaError(KafkaError._MSG_TIMED_OUT)))
    assert fenced(failure(KafkaError._FENCED, fatal=True))
    assert fenced(failure(KafkaError.PRODUCER_FENCED))
    assert fenced(failure(KafkaError.INVALID_PRODUCER_EPOCH, txn_requires_abort=True))
    # A fenced producer's delivery reports carry _FATAL without the fatal flag.
    assert fenced(TransactionFailed("sends failed", KafkaError(KafkaError._FATAL)))
    assert fenced(TransactionFailed("3 records still unsent after the flush"))
    assert fenced(RuntimeError("not a Kafka error"))
    assert not retriable(failure(KafkaError._FENCED, fatal=True, retriable=True))


async def test_an_aborted_transaction_leaves_the_database_at_the_last_commit(
    tmp_path: Path,
) -> None:
    async with eos_rig(tmp_path) as r:
        await assign(r, ("0_0",))
        task = r.thread.tasks["0_0"]
        store = task.stores["counts"]
        await process(r, record(0, 0, "a"))
        await r.thread.committer.commit()
        await process(r, record(0, 1, "a"))
        producers = r.thread.collector.producers  # type: ignore[union-attr]
        await producers.drop("0_0")  # aborts the open transaction
        assert log_of(r).aborted == 1
        store.abort()
        assert store.get("a") == 1 and store.uncommitted == 0
        assert task.restored_input_position() == {TP0: 1}


class _QueueFullOnce:
    """A transactional producer whose queue is full once, after ``room`` records."""

    def __init__(self, inner: object, room: int) -> None:
        self.inner, self.room, self.full_once = inner, room, True

    def produce(self, *args: object, **kwargs: object) -> None:
        if self.full_once and len(self.inner.pending) >= self.room:  # type: ignore[attr-defined]
            self.full_once = False
            raise BufferError("queue full")
        self.inner.produce(*args, **kwargs)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


async def test_records_handed_to_a_full_queue_wait_for_room_and_keep_their_order() -> None:
    from streams.runtime.transactions import TaskTransaction
    from tests.unit.streams.fakes import FakeTransactionalProducer

    log = TransactionLog()
    inner = FakeTransactionalProducer("app-0_0", log)
    inner.init_transactions()
    records = [(f"k{i}".encode(), f"{i}".encode()) for i in range(5)]

    class Output:
        def __init__(self, key: bytes, value: bytes) -> None:
            self.topic, self.key, self.value, self.timestamp_ms = "out", key, value, 0

    outputs = [Output(k, v) for k, v in records]
    transaction = TaskTransaction("0_0", _QueueFullOnce(inner, room=2))
    handed = transaction.hand(outputs, 0)
    assert handed == 2 and transaction.open
    while handed < len(outputs):
        handed = transaction.hand(outputs, handed)
    inner.commit_transaction()
    assert [(c.key, c.value) for c in log.records] == records
    assert transaction.produced == 5 and not transaction.errors


async def test_another_threads_offsets_that_went_through_give_up_a_hung_sending(
    tmp_path: Path,
) -> None:
    """After the coordinator's SIGKILL both tasks of one thread hung on the dead broker while
    another thread's offsets had gone through 3.5 s before: the process's threads share what
    went through, so the hung sending is given up (here 50 ms after the first that went
    through, checked every ms), its task revived, instead of waiting out its own bound. The
    other thread goes on committing meanwhile: the wait counts from its first sending that
    went through, not its latest (which is always recent)."""
    records = [record(0, i, k) for i, k in enumerate("abab")]
    async with eos_rig(tmp_path / "a") as a, eos_rig(tmp_path / "b") as b:
        hung, other = a.thread.committer, b.thread.committer
        assert isinstance(hung, TransactionalCommitter)
        assert isinstance(other, TransactionalCommitter)
        other.evidence = hung.evidence  # as build_stream_thread shares it
        hangs = await hang_the_next_offsets(a, records)
        await assign(b, ("0_1",))
        await b.thread.process({TopicPartition(SOURCE, 1): [record(1, 0, "c")]})
        try:
            hung.offsets_after_another_s = 0.05  # only the other thread's sending counts
            waiting = await commit_until_hung(hung, hangs)
            offset = 1
            while not waiting.done():
                await b.thread.process({TopicPartition(SOURCE, 1): [record(1, offset, "c")]})
                await other.commit()
                offset += 1
                await asyncio.sleep(0.005)
            # How many commits the other made meanwhile depends on the machine's load.
            assert other.failures == 0
            await waiting
            assert hung.failures == 1 and "0_0" in a.thread.registry.restoring
        finally:
            hangs.release.set()


async def test_a_sending_of_offsets_started_before_the_coordinator_moved_is_given_up_after_it(
    tmp_path: Path,
) -> None:
    """After the coordinator's SIGKILL, calls started before the group's coordinator was found
    on a new node returned within 1.7 s of the find, or hung on the dead one; the consumer's
    own coordinator, still loading, was marked dead and found again on the new node for
    seconds, so the time it had one never reached the other rule's 5 s. Such a call is given
    up once the find is ``offsets_after_new_coordinator_s`` old (here at once), its task
    revived."""
    records = [record(0, i, k) for i, k in enumerate("abab")]
    async with eos_rig(tmp_path) as r:
        committer = r.thread.committer
        assert isinstance(committer, TransactionalCommitter)
        hangs = await hang_the_next_offsets(r, records)
        try:
            committer.offsets_after_new_coordinator_s = 0.0
            waiting = await commit_until_hung(committer, hangs)
            await asyncio.sleep(0.01)
            assert not waiting.done()  # found before the call: it is not given up
            r.consumer.coordinator_found = time.monotonic()  # found on another node
            await waiting
            assert committer.failures == 1 and "0_0" in r.thread.registry.restoring
        finally:
            hangs.release.set()


async def test_another_threads_find_of_the_new_coordinator_gives_up_a_hung_sending(
    tmp_path: Path,
) -> None:
    """One thread's consumer found the group's new coordinator 2.6 s before another's (run P):
    the first find, by any thread of the process, counts for every thread's hung call."""
    records = [record(0, i, k) for i, k in enumerate("abab")]
    evidence = OffsetsEvidence()  # the process's, as the app builds its threads
    async with eos_rig(tmp_path / "a", offsets_evidence=evidence) as a, \
            eos_rig(tmp_path / "b", offsets_evidence=evidence) as b:
        hung, other = a.thread.committer, b.thread.committer
        assert isinstance(hung, TransactionalCommitter)
        assert isinstance(other, TransactionalCommitter)
        assert hung.evidence is other.evidence is evidence
        hangs = await hang_the_next_offsets(a, records)
        try:
            hung.offsets_after_new_coordinator_s = 0.0
            waiting = await commit_until_hung(hung, hangs)
            b.consumer.coordinator_found = time.monotonic()  # the other thread's consumer
            await waiting
            assert hung.failures == 1 and "0_0" in a.thread.registry.restoring
            assert a.consumer.coordinator_found == 0.0  # its own consumer found nothing new
        finally:
            hangs.release.set()


async def test_offsets_that_went_through_say_nothing_once_the_coordinator_was_lost(
    tmp_path: Path,
) -> None:
    """Right after the coordinator's SIGKILL, calls whose transaction coordinators were alive
    went through while one hung on the dead broker; given up then, its task revived into a
    fencing that waited 17 s for the coordinators' move (run Q). While the group's
    coordinator was lost during the call, another's going through does not give it up: the
    new coordinator's find does."""
    records = [record(0, i, k) for i, k in enumerate("abab")]
    evidence = OffsetsEvidence()
    async with eos_rig(tmp_path / "a", offsets_evidence=evidence) as a, \
            eos_rig(tmp_path / "b", offsets_evidence=evidence) as b:
        hung, other = a.thread.committer, b.thread.committer
        assert isinstance(hung, TransactionalCommitter)
        assert isinstance(other, TransactionalCommitter)
        hangs = await hang_the_next_offsets(a, records)
        await assign(b, ("0_1",))
        await b.thread.process({TopicPartition(SOURCE, 1): [record(1, 0, "c")]})
        try:
            hung.offsets_after_another_s = 0.0
            hung.offsets_after_new_coordinator_s = 0.0
            waiting = await commit_until_hung(hung, hangs)
            a.consumer.coordinator_lost = time.monotonic()  # marked dead during the call
            await other.commit()
            assert other.failures == 0
            for _ in range(10):  # ten turns of its checks, every ms
                await asyncio.sleep(0.002)
            assert not waiting.done()  # the other's went through: not evidence now
            b.consumer.coordinator_found = time.monotonic()  # the new coordinator
            await waiting
            assert hung.failures == 1 and "0_0" in a.thread.registry.restoring
        finally:
            hangs.release.set()


async def test_a_bad_record_goes_to_the_dead_letters_in_its_tasks_transaction(
    tmp_path: Path,
) -> None:
    """A record that cannot be deserialized is dead-lettered, in the task's transaction, and
    the task goes on (it took the thread down with a TypeError once)."""
    async with eos_rig(tmp_path) as r:
        log = log_of(r)
        await assign(r, ("0_0",))
        bad = dataclasses.replace(record(0, 0, "a"), value=b"\xc1")  # not msgpack
        await process(r, bad, record(0, 1, "b"))
        await r.thread.committer.commit()
        dead = log.to(r.thread.config.dead_letters)
        assert len(dead) == 1 and dead[0].value == b"\xc1"
        assert [msgpack.unpackb(o.value) for o in log.to(SINK)] == [1]
        assert log.offsets == {(SOURCE, 0): 2}
