"""The stream thread's own logic with fake clients (no broker): assignments applied to its
tasks, records processed and committed in order, rebalance callbacks that fail, a join that
takes too long, and stores handed between threads of one process."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import msgpack
import pytest
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from assignor import parse_task_id
from statestore.errors import StoreLockedError
from statestore.record_size import TRUNCATED_BYTES
from statestore.store import KeyValueStore, StoreSpec, changelog_topic_name, store_directory
from streams.group.listener import MAX_REBALANCE_FAILURES
from streams.runtime.state_updater import UNKNOWN_LAG
from streams.runtime.store_handover import ProcessStores
from streams.runtime.thread import FatalThreadError, ThreadState
from streams.runtime.transitions import Role
from tests.conftest import wait_until
from tests.unit.streams.fakes import SINK, SOURCE, Rig, assign, record, rig

pytestmark = pytest.mark.asyncio


@contextlib.asynccontextmanager
async def closing(*rigs: Rig):
    """Close every task the rigs' threads opened (their stores hold file locks)."""
    try:
        yield rigs
    finally:
        for r in rigs:
            r.thread.task_manager.close_all()


async def test_an_assignment_starts_demotes_and_closes_tasks(tmp_path: Path) -> None:
    r = rig(tmp_path)
    async with closing(r):
        assert r.thread.state is ThreadState.CREATED
        await assign(r, ("0_0", "0_1"), standbys=("0_2",))
        assert sorted(r.thread.tasks) == ["0_0", "0_1"]
        assert r.thread.standbys == {"0_2": 0} and r.thread.learners == {}
        assert r.thread.state is ThreadState.RUNNING
        # New actives restore first, then resume where nothing was committed: the beginning.
        assert sorted(r.restorer.restored) == ["counts/0", "counts/1"]
        assert r.consumer.seeks == {TopicPartition(SOURCE, 0): 0, TopicPartition(SOURCE, 1): 0}
        standby_stores = dict(r.thread.registry.copies["0_2"])
        closed = r.thread.tasks["0_0"].stores

        # 0_0 goes, the standby 0_2 becomes active, 0_3 is learned, 0_1 stays.
        r.consumer.seeks.clear()
        r.thread.tasks["0_1"].processed[TopicPartition(SOURCE, 1)] = 7
        await assign(r, ("0_1", "0_2"), learners=("0_3",), restore=False)
        assert sorted(r.thread.tasks) == ["0_1"] and r.thread.restoring == ["0_2"]
        assert r.thread.registry.restoring["0_2"] == standby_stores  # promoted, not reopened
        # The new learner's stores open once the moved active runs: reported meanwhile,
        # with an unknown lag.
        assert r.thread.registry.deferred == {"0_3": Role.LEARNER}
        assert r.thread.learners == {"0_3": UNKNOWN_LAG} and r.thread.standbys == {}
        assert r.consumer.seeks[TopicPartition(SOURCE, 1)] == 7  # kept: where it stopped
        assert TopicPartition(SOURCE, 2) in r.consumer.paused  # restoring: paused
        assert not any(store.is_open for store in closed.values())  # 0_0: closed
        await r.thread.listener.start_restored("0_2", r.thread.registry.restoring["0_2"])
        assert sorted(r.thread.tasks) == ["0_1", "0_2"]
        assert TopicPartition(SOURCE, 2) not in r.consumer.paused
        await r.thread.listener.copy_opener.settled()
        assert r.thread.learners == {"0_3": 0} and not r.thread.registry.deferred

        # 0_1 becomes a standby here: its stores stay open and are followed.
        kept = r.thread.tasks["0_1"].stores
        await assign(r, ("0_2",), standbys=("0_1",))
        assert sorted(r.thread.tasks) == ["0_2"]
        assert r.thread.registry.copies["0_1"] is kept
        assert r.thread.standbys == {"0_1": 0}
        assert r.thread.member.subscription().active == ("0_2",)


async def acked_until_done(r: Rig, commit: asyncio.Task[None]) -> None:
    """Acknowledge what the commit hands the producer, round after round, until it is done."""

    def acked_and_done() -> bool:
        r.producer.ack()
        return commit.done()

    await wait_until(acked_and_done, timeout_s=5, message="the commit")
    await commit


async def stop_acking_all(r: Rig, run: asyncio.Task[None]) -> None:
    """Acknowledge everything from here on, and stop the thread."""
    r.producer.auto_ack = True
    r.producer.ack()
    r.thread.stop()
    await asyncio.wait_for(run, 15)


async def test_records_are_processed_and_committed_acks_then_offsets_then_checkpoints(
    tmp_path: Path,
) -> None:
    events: list[str] = []
    r = rig(tmp_path, events=events, commit_interval_ms=60_000)
    r.producer.auto_ack = False
    run = asyncio.create_task(r.thread.run([SOURCE]))
    try:
        await assign(r, ("0_0",))
        for store in r.thread.tasks["0_0"].stores.values():
            original = store.commit

            def checkpoint(original=original) -> None:  # type: ignore[no-untyped-def]
                events.append("checkpoint")
                original()

            store.commit = checkpoint  # type: ignore[method-assign]
        tp = TopicPartition(SOURCE, 0)
        r.consumer.feed({tp: [record(0, 0, "a"), record(0, 1, "b"), record(0, 2, "a")]})
        await wait_until(lambda: len(r.producer.to(SINK)) == 3, timeout_s=5,
                         message="three outputs")
        assert [msgpack.unpackb(s.value) for s in r.producer.to(SINK)] == [1, 1, 2]
        commit = asyncio.create_task(r.thread.committer.commit())
        await wait_until(lambda: r.producer.flushes_waiting > 0, timeout_s=5,
                         message="the commit waiting for the broker's acks")
        assert not commit.done() and "offsets" not in events  # waits for the broker's acks

        def acked_and_offsets() -> bool:
            # The outputs' acks, then the changelog's (its records carry the input position,
            # so they go once the outputs are acknowledged).
            r.producer.ack()
            return "offsets" in events

        await wait_until(acked_and_offsets, timeout_s=5, message="the offsets")

        await acked_until_done(r, commit)  # what it sent since (the checkpoint's changelog)
        order = [e for e in events if e in ("ack", "offsets", "checkpoint")]
        assert order.index("ack") < order.index("offsets") < order.index("checkpoint")
        assert r.consumer.commits[-1] == {tp: 3}
    finally:
        await stop_acking_all(r, run)
    assert r.thread.state is ThreadState.DEAD


async def test_a_commit_ships_the_input_position_only_once_the_outputs_are_acknowledged(
    tmp_path: Path,
) -> None:
    """The changelog records carry the task's input position, and a task restored from them
    after a crash skips the input they cover: were they acknowledged before the outputs of
    that input (the producer orders nothing across partitions), a SIGKILL in between would
    lose those outputs for good."""
    r = rig(tmp_path, commit_interval_ms=60_000)
    r.producer.auto_ack = False
    run = asyncio.create_task(r.thread.run([SOURCE]))
    try:
        await assign(r, ("0_0",))
        changelog = changelog_topic_name(r.thread.config.application_id, "counts")
        tp = TopicPartition(SOURCE, 0)
        r.consumer.feed({tp: [record(0, 0, "a"), record(0, 1, "b")]})
        await wait_until(lambda: len(r.producer.to(SINK)) == 2, timeout_s=5,
                         message="two outputs handed")
        commit = asyncio.create_task(r.thread.committer.commit())
        await wait_until(lambda: r.producer.flushes_waiting > 0, timeout_s=5,
                         message="the commit waiting for the outputs' acks")
        assert r.producer.to(changelog) == []  # not handed while the outputs are unacked
        r.producer.ack()
        await wait_until(lambda: len(r.producer.to(changelog)) > 0, timeout_s=5,
                         message="the changelog handed once the outputs are acked")

        await acked_until_done(r, commit)
        assert r.consumer.commits[-1] == {tp: 2}
    finally:
        await stop_acking_all(r, run)


async def test_records_already_processed_are_not_processed_again(tmp_path: Path) -> None:
    """A batch fetched before a rebalance sought the partition back holds records the task
    already processed: they are dropped."""
    r = rig(tmp_path, commit_interval_ms=60_000)
    run = asyncio.create_task(r.thread.run([SOURCE]))
    try:
        await assign(r, ("0_0",))
        tp = TopicPartition(SOURCE, 0)
        r.consumer.feed({tp: [record(0, 0, "a"), record(0, 1, "a")]})
        r.consumer.feed({tp: [record(0, 1, "a"), record(0, 2, "a")]})
        # A later batch of another key: once its output is out, so would be any duplicate.
        r.consumer.feed({tp: [record(0, 3, "b")]})
        await wait_until(lambda: len(r.producer.to(SINK)) >= 4, timeout_s=5,
                         message="the outputs of both batches and the next")
        assert [(msgpack.unpackb(s.key), msgpack.unpackb(s.value))
                for s in r.producer.to(SINK)] == [("a", 1), ("a", 2), ("a", 3), ("b", 1)]
    finally:
        r.thread.stop()
        await asyncio.wait_for(run, 15)


def _hold_lock(state_dir: Path, task_id: str) -> KeyValueStore:
    """Open a store of ``task_id`` outside the thread, so the thread's open clashes."""
    partition = parse_task_id(task_id)[1]
    return KeyValueStore(StoreSpec("counts"), store_directory(state_dir, "unit", task_id,
                                                              "counts"),
                         changelog_topic_name("unit", "counts"), partition).open()


async def test_a_failing_rebalance_callback_is_retried_through_a_rejoin(tmp_path: Path) -> None:
    r = rig(tmp_path)
    blocker = _hold_lock(tmp_path, "0_1")
    async with closing(r):
        try:
            await assign(r, ("0_0", "0_1"))
            # Not swallowed: the thread starts over (drops its tasks) and rejoins.
            assert r.consumer.rejoins == 1
            assert r.thread.tasks == {} and r.thread.restoring == []
            assert r.thread.failure is None
        finally:
            blocker.close()
        await assign(r, ("0_0", "0_1"))
        assert sorted(r.thread.tasks) == ["0_0", "0_1"]


async def test_a_rebalance_callback_that_keeps_failing_fails_the_thread(tmp_path: Path) -> None:
    r = rig(tmp_path)
    blocker = _hold_lock(tmp_path, "0_1")
    async with closing(r):
        try:
            for _ in range(MAX_REBALANCE_FAILURES):
                await assign(r, ("0_0", "0_1"))
        finally:
            blocker.close()
        assert isinstance(r.thread.failure, FatalThreadError)
        assert "on_partitions_assigned failed 3 times" in str(r.thread.failure)
        assert "StoreLockedError" in str(r.thread.failure)


async def test_an_assignment_with_an_error_fails_the_thread(tmp_path: Path) -> None:
    r = rig(tmp_path)
    await assign(r, (), error="duplicate group instance id x-thread-0")
    assert isinstance(r.thread.failure, FatalThreadError)


async def test_a_member_joining_for_too_long_asks_the_leader_to_rejoin(tmp_path: Path) -> None:
    r = rig(tmp_path, session_timeout_ms=10_000, heartbeat_interval_ms=1_000)
    stall = r.thread.join_watch.stall_s
    assert stall == 16.0  # about two join rounds with a 10 s session
    now = 1_000.0
    assert not r.thread.join_watch.check_stall(now)  # not joining
    r.consumer.rebalancing, r.consumer.rebalancing_since = True, now
    assert not r.thread.join_watch.check_stall(now + stall - 1)  # a round or so: fine
    assert r.thread.join_watch.check_stall(now + stall)
    assert len(r.control.rebalance_requests) == 1
    assert not r.thread.join_watch.check_stall(now + stall + 1)  # not again at once
    assert r.thread.join_watch.check_stall(now + 2 * stall)  # still stuck: again
    assert len(r.control.rebalance_requests) == 2
    r.consumer.rebalancing = False
    assert not r.thread.join_watch.check_stall(now + 10 * stall)


async def test_a_copy_is_handed_to_another_thread_of_the_process(tmp_path: Path) -> None:
    """Thread 1 is told to run 0_0 while thread 0 of the same process still holds a learner
    copy of it (its own new assignment comes a moment later): no lock clash, the copy's
    stores are handed over."""
    shared = ProcessStores()
    first = rig(tmp_path, index=0, process_stores=shared)
    second = rig(tmp_path, index=1, process_stores=shared)
    async with closing(first, second):
        await assign(first, (), learners=("0_0",))
        copy = dict(first.thread.registry.copies["0_0"])
        await assign(second, ("0_0",), restore=False)
        assert second.consumer.rejoins == 0 and second.thread.failure is None
        assert second.thread.registry.restoring["0_0"] == copy
        assert first.thread.learners == {} and first.thread.member.subscription().learners == {}
        assert not [s for s in first.follower.registered if s in copy.values()]
        await assign(first, ())  # thread 0's own assignment: nothing left to close
        assert all(store.is_open for store in copy.values())
        await second.thread.state_updater.restore_pending()
        assert list(second.thread.tasks) == ["0_0"]


async def test_an_active_task_is_never_taken_from_another_thread(tmp_path: Path) -> None:
    shared = ProcessStores()
    first = rig(tmp_path, index=0, process_stores=shared)
    second = rig(tmp_path, index=1, process_stores=shared)
    async with closing(first, second):
        await assign(first, ("0_0",))
        await assign(second, ("0_0",))
        assert list(first.thread.tasks) == ["0_0"]
        assert second.thread.tasks == {} and second.consumer.rejoins == 1


async def test_a_copy_of_a_task_another_thread_runs_is_not_kept(tmp_path: Path) -> None:
    """An assignment that gives a thread a copy of a task another thread of the same process
    runs (a copy on the same instance adds nothing): skipped, not a lock clash."""
    shared = ProcessStores()
    first = rig(tmp_path, index=0, process_stores=shared)
    second = rig(tmp_path, index=1, process_stores=shared)
    async with closing(first, second):
        await assign(first, ("0_0",))
        await assign(second, ("0_1",), standbys=("0_0",))
        assert list(second.thread.tasks) == ["0_1"] and second.thread.standbys == {}
        assert second.consumer.rejoins == 0 and second.thread.failure is None
        assert list(first.thread.tasks) == ["0_0"]


async def run_assign_and_stop(r: Rig) -> None:
    """Run the thread with one task, stop it, and wait until it has closed."""
    run = asyncio.create_task(r.thread.run([SOURCE]))
    await assign(r, ("0_0",))
    r.thread.stop()
    await asyncio.wait_for(run, 10)


async def test_a_stopping_member_leaves_only_after_its_own_heartbeat_finds_the_group_formed(
    tmp_path: Path,
) -> None:
    # A dynamic member's consumer sends LeaveGroup on stop: first a round under way (the
    # heartbeat answered REBALANCE_IN_PROGRESS) is taken part in, then it stops.
    events: list[str] = []
    r = rig(tmp_path, events=events)
    answers: list[str | None] = ["RebalanceInProgressError", None]

    async def heartbeat() -> str | None:
        events.append("heartbeat")
        return answers.pop(0)

    async def stop() -> None:
        events.append("consumer stop")

    r.consumer.heartbeat = heartbeat  # type: ignore[method-assign]
    r.consumer.stop = stop  # type: ignore[method-assign]
    await run_assign_and_stop(r)
    order = [e for e in events if e in ("heartbeat", "consumer stop")]
    assert order == ["heartbeat", "heartbeat", "consumer stop"]
    assert r.consumer.rejoins == 1
    assert not r.thread.tasks


def raw_record(partition: int, offset: int, key: bytes, value: bytes) -> ConsumerRecord:
    return ConsumerRecord(SOURCE, partition, offset, 1_000, 0, key, value, None, len(key),
                          len(value), [])


async def test_a_bad_record_over_the_producer_s_limit_is_dead_lettered_truncated(
    tmp_path: Path,
) -> None:
    """Not sendable as it is, it goes to the dead-letter topic cut down, with its sizes; the
    records after it are processed and the commit covers them all."""
    r = rig(tmp_path, commit_interval_ms=60_000)
    run = asyncio.create_task(r.thread.run([SOURCE]))
    tp = TopicPartition(SOURCE, 0)
    garbage = b"\xc1" * 5_000_000  # never valid msgpack
    try:
        await assign(r, ("0_0",))
        r.consumer.feed({tp: [raw_record(0, 0, msgpack.packb("a"), garbage), record(0, 1, "a")]})
        await wait_until(lambda: len(r.producer.to(SINK)) == 1, timeout_s=5, message="output")
        (dead,) = r.producer.to("unit-dead-letters")
        headers = dict(dead.headers)
        assert dead.value == garbage[:TRUNCATED_BYTES]
        assert headers["relay.truncated"] == b"true"
        assert headers["relay.value.size"] == b"5000000"
        assert headers["relay.offset"] == b"0" and headers["relay.stage"] == b"deserialize"
        await r.thread.committer.commit()
        assert r.consumer.commits[-1] == {tp: 2}
    finally:
        r.thread.stop()
        await asyncio.wait_for(run, 15)
    assert r.thread.failure is None


async def test_a_bad_record_the_dead_letter_topic_refuses_stops_the_thread_before_it(
    tmp_path: Path,
) -> None:
    """Neither processed nor dead-lettered: the thread stops and no commit passes it, so a
    restart meets it again."""
    r = rig(tmp_path, commit_interval_ms=60_000)
    r.producer.failing["unit-dead-letters"] = KafkaError("the broker refused it")
    run = asyncio.create_task(r.thread.run([SOURCE]))
    tp = TopicPartition(SOURCE, 0)
    await assign(r, ("0_0",))
    r.consumer.feed({tp: [record(0, 0, "a"), raw_record(0, 1, msgpack.packb("a"), b"\xc1"),
                          record(0, 2, "a")]})
    with pytest.raises(KafkaError, match="refused"):
        await asyncio.wait_for(run, 15)
    assert all(offsets.get(tp, 0) <= 1 for offsets in r.consumer.commits)
    assert r.thread.state is ThreadState.DEAD


async def test_a_restored_task_starts_while_its_member_joins_the_next_round(
    tmp_path: Path,
) -> None:
    """A broker answers a connection's requests in order, so a committed-offsets request sent
    while the member's JoinGroup waits is answered only once the round completes. The offsets
    are asked for when the task is assigned; its restore ending mid-round does not wait for
    the round (seen in a fault run: a restored task idle for 6 s, then moved)."""
    r = rig(tmp_path)
    tp = TopicPartition(SOURCE, 0)
    r.consumer.committed_offsets[tp] = 5
    joined = asyncio.Event()
    ask = r.consumer.committed

    async def committed(partition: TopicPartition) -> int | None:
        if r.consumer.rebalancing:
            await joined.wait()  # behind the JoinGroup
        return await ask(partition)

    r.consumer.committed = committed  # type: ignore[method-assign]
    async with closing(r):
        await assign(r, ("0_0",), restore=False)
        await asyncio.sleep(0)  # the request leaves with the assignment
        r.consumer.rebalancing = True  # the member then joins the next round
        await asyncio.wait_for(r.thread.state_updater.restore_pending(), 5)
        assert "0_0" in r.thread.tasks
        assert r.thread.tasks["0_0"].processed == {tp: 5}
        joined.set()


def _lock_is_free(state_dir: Path, task_id: str) -> bool:
    try:
        _hold_lock(state_dir, task_id).close()
    except StoreLockedError:
        return False
    return True


async def test_a_round_completing_while_the_thread_closes_leaves_no_store_open(
    tmp_path: Path,
) -> None:
    """A static member's consumer stays in the group until it stops, so a round under way can
    still deliver an assignment after the thread closed its tasks (seen on a CI run: a static
    restart in the same process found its stores locked by the stopped app, for good)."""
    r = rig(tmp_path, group_instance_id="unit-instance")
    run = asyncio.create_task(r.thread.run([SOURCE]))
    await assign(r, ("0_0",))

    async def stop() -> None:  # the round's SyncGroup answer lands as the consumer stops
        await assign(r, ("0_0", "0_1"), restore=False)

    r.consumer.stop = stop  # type: ignore[method-assign]
    r.thread.stop()
    await asyncio.wait_for(run, 10)
    assert _lock_is_free(tmp_path, "0_0") and _lock_is_free(tmp_path, "0_1")
    assert r.thread.registry.ids() == []


async def test_a_restored_task_stopped_while_it_reads_its_offsets_is_closed_with_the_rest(
    tmp_path: Path,
) -> None:
    """The restore loop is cancelled when the thread stops; a task it was starting must still
    be in a registry then, or closing the thread's tasks misses its stores."""
    r = rig(tmp_path)
    asked = asyncio.Event()

    async def committed(partition: TopicPartition) -> int | None:
        asked.set()
        await asyncio.Event().wait()  # the broker does not answer
        return None

    r.consumer.committed = committed  # type: ignore[method-assign]
    async with closing(r):
        await assign(r, ("0_0",), restore=False)
        stores = r.thread.registry.restoring["0_0"]
        starting = asyncio.create_task(r.thread.listener.start_restored("0_0", stores))
        await asyncio.wait_for(asked.wait(), 5)
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        r.thread.task_manager.close_all()
        assert not any(store.is_open for store in stores.values())
        assert _lock_is_free(tmp_path, "0_0")


async def test_a_restored_task_reads_its_offsets_without_holding_the_thread(
    tmp_path: Path,
) -> None:
    """A revived task's offsets come from a group coordinator that may still be loading (over
    a minute in the fault suite): the thread's other tasks go on meanwhile."""
    r = rig(tmp_path)
    answer, asked = asyncio.Event(), asyncio.Event()

    async def committed(partition: TopicPartition) -> int | None:
        if partition.partition == 1:
            asked.set()
            await answer.wait()
        return None

    r.consumer.committed = committed  # type: ignore[method-assign]
    async with closing(r):
        await assign(r, ("0_0", "0_1"), restore=False)
        stores = r.thread.registry.restoring["0_1"]
        await r.thread.listener.start_restored("0_0", r.thread.registry.restoring["0_0"])
        starting = asyncio.create_task(r.thread.listener.start_restored("0_1", stores))
        await asyncio.wait_for(asked.wait(), 5)
        assert not r.thread.listener.lock.locked()
        async with r.thread.listener.lock:  # a processing pass of the other task
            await r.thread.process({TopicPartition(SOURCE, 0): [record(0, 0, "a")]})
        assert r.thread.tasks["0_0"].processed[TopicPartition(SOURCE, 0)] == 1
        answer.set()
        await asyncio.wait_for(starting, 5)
        assert "0_1" in r.thread.tasks


async def test_a_task_closed_while_its_offsets_are_read_does_not_start(tmp_path: Path) -> None:
    """Closing a restoring task cancels its offsets request; the start that waited on it
    sees the task gone instead of failing with the cancellation."""
    r = rig(tmp_path)
    answer, asked = asyncio.Event(), asyncio.Event()

    async def committed(partition: TopicPartition) -> int | None:
        asked.set()
        await answer.wait()
        return None

    r.consumer.committed = committed  # type: ignore[method-assign]
    async with closing(r):
        await assign(r, ("0_0",), restore=False)
        stores = r.thread.registry.restoring["0_0"]
        starting = asyncio.create_task(r.thread.task_manager.start_restored("0_0", stores))
        await asyncio.wait_for(asked.wait(), 5)  # the start waits for the offsets
        r.thread.task_manager.close_task("0_0")
        answer.set()
        assert await asyncio.wait_for(starting, 5) is False
        assert "0_0" not in r.thread.tasks


async def test_a_leaving_member_checks_the_group_is_formed_after_the_others_synced(
    tmp_path: Path,
) -> None:
    """Its LeaveGroup follows the formed check with nothing awaited between them: a leaving
    leader that checked first, then waited for the others' syncs, left while they started
    their next round, and the embedded broker kept it as that round's leader (a host swap's
    group joining for minutes). A round taken part in meanwhile is waited for again."""
    events: list[str] = []
    r = rig(tmp_path, events=events)
    answers: list[str | None] = ["RebalanceInProgressError", None, None]

    async def heartbeat() -> str | None:
        answer = answers.pop(0)
        events.append(f"heartbeat {answer}")
        if answer is not None:
            r.consumer.generation += 1  # it takes part in that round
        return answer

    async def synced(limit_s: float = 0) -> None:
        events.append("others synced")

    async def stop() -> None:
        events.append("consumer stop")

    r.consumer.heartbeat = heartbeat  # type: ignore[method-assign]
    r.consumer.stop = stop  # type: ignore[method-assign]
    r.thread.hooks.until_others_synced = synced  # type: ignore[method-assign]
    await run_assign_and_stop(r)
    order = [e for e in events if e.startswith(("heartbeat", "others", "consumer"))]
    assert order == ["others synced", "heartbeat RebalanceInProgressError", "heartbeat None",
                     "others synced", "heartbeat None", "consumer stop"]


@pytest.mark.asyncio
async def test_a_rebalance_asked_for_after_the_round_s_subscription_went_out_is_asked_again(
    tmp_path: Path,
) -> None:
    """aiokafka forgets a rejoin requested between its JoinGroup and its SyncGroup: a leaving
    mark that arrived then was in no round, and a host swap's old instances never handed
    over. The member asks again once that round's assignment is applied."""
    r = rig(tmp_path)
    try:
        r.thread.assignor.metadata([SOURCE])  # the round's JoinGroup
        r.thread.member.request_rejoin("marked as leaving")  # arrives mid-round, then dropped
        assert r.consumer.rejoins == 1
        await assign(r, ("0_0",))
        assert r.consumer.rejoins == 2  # asked again: the next round hears of it
        assert r.thread.member.subscription().rejoin_token == 2

        # Asked for before the subscription went out: that round had it, nothing more.
        r.thread.member.request_rejoin("learners ready")
        r.thread.assignor.metadata([SOURCE])
        await assign(r, ("0_0",))
        assert r.consumer.rejoins == 3
        # A request the client still holds (it rejoins by itself) is not doubled either.
        r.thread.member.request_rejoin("learners ready")
        r.consumer.rejoin_pending = True
        await assign(r, ("0_0",))
        assert r.consumer.rejoins == 4
        # A request any round serves (a follow-up, a round for another member) was served
        # by the round that completed after it.
        r.consumer.rejoin_pending = False
        r.thread.assignor.metadata([SOURCE])
        r.thread.member.request_rejoin("follow-up rebalance", news=False)
        await assign(r, ("0_0",))
        assert r.consumer.rejoins == 5
    finally:
        r.thread.task_manager.close_all()
