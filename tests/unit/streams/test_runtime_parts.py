"""The stream thread's parts on their own (no broker): the task registry, the state
updater's learner readiness, the record collector under cancellation, and the aiokafka
driver's reading of the coordinator."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.structs import TopicPartition

from streams.kafka.driver import GroupConsumer
from streams.runtime.record_collector import RecordCollector
from streams.runtime.state_updater import UNKNOWN_LAG, StateUpdater
from streams.runtime.task import StreamTask
from streams.runtime.tasks import Tasks
from streams.runtime.transitions import Role
from tests.conftest import wait_until
from tests.unit.streams.fakes import SINK, SOURCE, FakeChangelogReader, counting_subs


def test_the_registry_finds_tasks_by_id_and_partition() -> None:
    sub = counting_subs()[0]
    tasks = Tasks()
    task = StreamTask("0_1", sub, {})
    tasks.add_running(task)
    tasks.add_restoring("0_2", {})
    tasks.add_copy("0_3", Role.LEARNER, {})
    tasks.add_copy("0_0", Role.STANDBY, {})
    assert tasks.task_for(TopicPartition(SOURCE, 1)) is task
    assert tasks.task_for(TopicPartition(SOURCE, 2)) is None  # restoring: not fed records
    assert tasks.roles() == {"0_1": Role.ACTIVE, "0_2": Role.RESTORING, "0_3": Role.LEARNER,
                             "0_0": Role.STANDBY}
    assert tasks.owned() == ("0_1", "0_2")
    tasks.retag("0_3", Role.STANDBY)
    assert tasks.copies_with(Role.STANDBY) == ["0_0", "0_3"]
    assert tasks.remove_running("0_1") is task
    assert tasks.task_for(TopicPartition(SOURCE, 1)) is None


class _Store:
    changelog_topic: str | None = None

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.name = "counts"


@pytest.mark.parametrize("policy", ["eager", "conservative", "batched"])
def test_learners_ready_are_reported_once_by_policy(policy: str) -> None:
    tasks = Tasks()
    follower = FakeChangelogReader()
    ready: list[list[str]] = []
    updater = StateUpdater(FakeChangelogReader(), follower, tasks, commit_interval_ms=1000,
                           acceptable_lag=10, learner_rejoin=policy,
                           on_restored=lambda t, s: asyncio.sleep(0),  # type: ignore[arg-type,return-value]
                           on_learners_ready=ready.append)
    tasks.add_copy("0_1", Role.LEARNER, {"counts": _Store(1)})  # type: ignore[dict-item]
    tasks.add_copy("0_2", Role.LEARNER, {"counts": _Store(2)})  # type: ignore[dict-item]
    follower.lags = {"1": 5, "2": None}
    assert updater.lags(Role.LEARNER) == {"0_1": 5, "0_2": UNKNOWN_LAG}
    updater.check_learners_ready()
    assert ready == ([["0_1"]] if policy == "eager" else [])
    follower.lags = {"1": 5, "2": 10}
    updater.check_learners_ready()
    updater.check_learners_ready()  # no news: not again
    assert ready == ([["0_1"], ["0_2"]] if policy == "eager" else [["0_1", "0_2"]])


class _ChangelogStore(_Store):
    changelog_topic = "app-counts-changelog"


async def test_a_task_with_no_changelog_starts_before_stateful_tasks_restore() -> None:
    """A stateless first stage (1_x) that feeds a repartition topic must not wait behind the
    restoration of stateful tasks (0_x) that sort before it: the second stage waits on it."""
    tasks = Tasks()
    started: list[str] = []

    async def on_restored(task_id: str, stores: dict[str, Any]) -> None:
        started.append(task_id)
        tasks.restoring.pop(task_id)

    updater = StateUpdater(FakeChangelogReader(), FakeChangelogReader(), tasks,
                           commit_interval_ms=1000, acceptable_lag=10, learner_rejoin="eager",
                           on_restored=on_restored)
    tasks.add_restoring("0_1", {"counts": _ChangelogStore(1)})  # type: ignore[dict-item]
    tasks.add_restoring("0_3", {"counts": _ChangelogStore(3)})  # type: ignore[dict-item]
    tasks.add_restoring("1_2", {})
    tasks.add_restoring("1_4", {"cache": _Store(4)})  # type: ignore[dict-item]  # no changelog
    await updater.restore_pending()
    assert started == ["1_2", "1_4", "0_1", "0_3"]


class _BlockingProducer:
    """Takes ``room`` records, then its queue stays full (confluent-kafka's interface)."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.sent: list[Any] = []

    def produce(self, topic: str, **kwargs: Any) -> None:
        if len(self.sent) >= self.room:
            raise BufferError("Local: Queue full")
        self.sent.append(kwargs.get("value"))

    def poll(self, timeout: float = 0) -> int:
        return 0


async def test_outputs_not_handed_over_stay_queued_when_shipping_is_cancelled(
    tmp_path: Path,
) -> None:
    task = StreamTask("0_0", counting_subs()[0], {})
    task.context.outputs = [SimpleNamespace(topic=SINK, key=None, value=v, timestamp_ms=None)
                            for v in (b"1", b"2", b"3")]
    producer = _BlockingProducer(room=1)
    collector = RecordCollector(producer, "dead-letters")
    shipping = asyncio.create_task(collector.ship([task]))
    await wait_until(lambda: producer.sent == [b"1"], timeout_s=5, message="one handed over")
    shipping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await shipping
    assert producer.sent == [b"1"]
    assert [o.value for o in task.context.outputs] == [b"2", b"3"]


def test_the_driver_reads_the_coordinator() -> None:
    coordinator = SimpleNamespace(member_id="m-1", generation=7, rebalancing=True,
                                  rebalancing_since=100.0, _rejoin_needed_fut=None,
                                  rejoins=0)
    coordinator.request_rejoin = lambda: setattr(coordinator, "rejoins",
                                                 coordinator.rejoins + 1)
    consumer = GroupConsumer(SimpleNamespace(_coordinator=coordinator))  # type: ignore[arg-type]
    assert (consumer.member_id, consumer.generation, consumer.rebalancing) == ("m-1", 7, True)
    assert consumer.rebalancing_for_s(now=130.0) == 30.0
    assert not consumer.rejoin_pending
    consumer.request_rejoin()
    assert coordinator.rejoins == 1
    coordinator.rebalancing = False
    assert consumer.rebalancing_for_s(now=130.0) == 0.0
    # Before the consumer started there is no coordinator: nothing to report.
    idle = GroupConsumer(SimpleNamespace())  # type: ignore[arg-type]
    assert (idle.member_id, idle.generation, idle.rebalancing) == ("", -1, False)
    idle.request_rejoin()


def test_the_driver_sends_a_heartbeat_of_its_own_to_the_coordinator() -> None:
    sent: list[tuple[int, Any]] = []
    codes = [27, 0]  # REBALANCE_IN_PROGRESS, then none

    async def send(node: int, request: Any, group: Any = None) -> Any:
        sent.append((node, request))
        return SimpleNamespace(error_code=codes.pop(0))

    coordinator = SimpleNamespace(member_id="m-1", generation=7, group_id="g",
                                  coordinator_id=3)
    consumer = GroupConsumer(SimpleNamespace(  # type: ignore[arg-type]
        _coordinator=coordinator, _client=SimpleNamespace(send=send)))
    assert asyncio.run(consumer.heartbeat()) == "RebalanceInProgressError"
    assert asyncio.run(consumer.heartbeat()) is None
    assert [node for node, _ in sent] == [3, 3]
    assert asyncio.run(GroupConsumer(SimpleNamespace()).heartbeat()) == "NOT_A_MEMBER"  # type: ignore[arg-type]


async def test_seeking_to_the_beginning_asks_the_fetcher_without_waiting() -> None:
    tp, other = TopicPartition("in", 0), TopicPartition("in", 1)
    never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    resets: list[Any] = []
    waited: list[Any] = []

    def request_offset_reset(tps: list[TopicPartition], strategy: Any) -> asyncio.Future[Any]:
        resets.append(tps)
        return never

    async def seek_to_beginning(*tps: TopicPartition) -> None:
        waited.append(tps)

    consumer = GroupConsumer(SimpleNamespace(  # type: ignore[arg-type]
        _fetcher=SimpleNamespace(request_offset_reset=request_offset_reset),
        assignment=lambda: {tp}, seek_to_beginning=seek_to_beginning))
    await asyncio.wait_for(consumer.seek_to_beginning(tp), 1)
    assert resets == [[tp]] and not waited
    # A partition not assigned goes through the consumer, which refuses it.
    await consumer.seek_to_beginning(other)
    assert waited == [(other,)]
    never.cancel()


async def test_a_member_told_to_shut_down_while_revoking_leaves_after_the_next_round(
        tmp_path: Path) -> None:
    """A leaving member told to shut down in the round that revokes its last tasks takes part
    in the round that assigns them elsewhere; it stops only when told again with nothing left
    to revoke (its departure alone may start no round on the broker)."""
    from tests.unit.streams.fakes import assign, rig

    r = rig(tmp_path)
    try:
        await assign(r, ("0_0",))
        assert r.thread.registry.active
        await assign(r, (), revoked=("0_0",), shutdown=True, rejoin_after_ms=0)
        assert not r.thread.shutdown_requested and not r.thread.lifecycle.stopping
        await assign(r, (), shutdown=True)
        assert r.thread.shutdown_requested and r.thread.lifecycle.stopping
    finally:
        r.thread.task_manager.close_all()


_ROUND_ROBIN = RoundRobinPartitionAssignor


class _BufferingConsumer:
    """aiokafka's hand-out order: fetched records partition by partition, in the order the
    partitions sit in the fetcher's buffer, up to ``max_records`` a call."""

    def __init__(self, buffered: dict[TopicPartition, list[int]]) -> None:
        self._fetcher = SimpleNamespace(_records=buffered)

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        pass

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[int]]:
        out: dict[TopicPartition, list[int]] = {}
        for tp in list(self._fetcher._records):
            records = self._fetcher._records[tp]
            taken, self._fetcher._records[tp] = records[:max_records], records[max_records:]
            if not self._fetcher._records[tp]:
                del self._fetcher._records[tp]
            out[tp] = taken
            max_records -= len(taken)
            if not max_records:
                break
        return out


def test_fetched_records_are_handed_out_in_turns_across_partitions() -> None:
    # A task moved here with two others waited behind their backlogs: aiokafka drained the
    # partitions fetched before its own one after the other.
    a, b, c = (TopicPartition("t", p) for p in range(3))
    consumer = GroupConsumer(_BufferingConsumer(  # type: ignore[arg-type]
        {a: list(range(5000)), b: list(range(5000)), c: list(range(10))}))

    async def first_calls() -> list[list[TopicPartition]]:
        return [list(await consumer.getmany(timeout_ms=0, max_records=2000)) for _ in range(3)]

    assert asyncio.run(first_calls()) == [[a], [b], [c, a]]


async def _handed(consumer: GroupConsumer, calls: int) -> list[list[TopicPartition]]:
    return [list(await consumer.getmany(timeout_ms=0, max_records=2000)) for _ in range(calls)]


def test_a_turn_at_the_fetched_records_lasts_the_commit_interval(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Handed one fetch call each in turn, every task processed records in every commit
    # interval and its store shipped nearly every key it holds at each commit: the counting
    # benchmark's changelog records went up 3 times. Within a turn, one partition's records.
    from streams.config import AppConfig
    from streams.kafka import driver

    now = [100.0]
    monkeypatch.setattr(driver.time, "monotonic", lambda: now[0])
    partitions = [TopicPartition("t", p) for p in range(4)]

    async def scenario() -> None:
        consumer = driver.new_group_consumer(AppConfig("a", commit_interval_ms=1000),
                                             "127.0.0.1:9", None, 0, _ROUND_ROBIN)
        await consumer.stop()  # never started: the real consumer is only let go
        consumer._consumer = _BufferingConsumer(  # type: ignore[assignment]
            {tp: list(range(20_000)) for tp in partitions})
        # Each partition's first records first (none was handed any yet).
        first = await _handed(consumer, 4)
        assert sorted(tp for handed in first for tp in handed) == partitions
        within_the_turn = {tp for handed in await _handed(consumer, 6) for tp in handed}
        assert len(within_the_turn) == 1
        now[0] += 1.0  # the call that finds the turn over ends it: the next partition's
        [[ending], *later] = await _handed(consumer, 4)
        assert {ending} == within_the_turn
        next_turn = {tp for handed in later for tp in handed}
        assert len(next_turn) == 1 and not next_turn & within_the_turn

    asyncio.run(scenario())


def test_a_partition_assigned_meanwhile_is_handed_records_before_the_turn_goes_on() -> None:
    # A task moved here must not wait behind the turns of the backlogs already buffered.
    a, b, moved = (TopicPartition("t", p) for p in range(3))
    fetching = _BufferingConsumer({a: list(range(20_000)), b: list(range(20_000))})
    consumer = GroupConsumer(fetching, turn_ms=60_000,  # type: ignore[arg-type]
                             clock=lambda: 0.0)

    async def scenario() -> None:
        assert await _handed(consumer, 3) == [[a], [b], [b]]
        fetching._fetcher._records[moved] = list(range(10))
        assert await _handed(consumer, 2) == [[moved, b], [b]]

    asyncio.run(scenario())


def test_an_offset_commit_ends_the_turn() -> None:
    # Aligned with the commit interval, a turn dirties one task's stores per commit.
    a, b = (TopicPartition("t", p) for p in range(2))
    consumer = GroupConsumer(_BufferingConsumer(  # type: ignore[arg-type]
        {a: list(range(20_000)), b: list(range(20_000))}), turn_ms=60_000, clock=lambda: 0.0)

    async def scenario() -> None:
        assert await _handed(consumer, 4) == [[a], [b], [b], [b]]
        await consumer.commit({b: 6000})
        assert await _handed(consumer, 2) == [[a], [a]]

    asyncio.run(scenario())
