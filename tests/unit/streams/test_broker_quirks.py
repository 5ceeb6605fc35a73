"""The broker's quirks: detected from the broker, chosen by the setting, and each one turning
its workaround on or off in a stream thread (no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from assignor import MemberAssignment
from assignor.protocol import encode_assignment
from streams.config import AppConfig, ConfigError
from streams.quirks.detect import broker_quirks
from streams.quirks.hooks import RoundHooks, hooks_for
from streams.quirks.switch import (
    BrokerQuirks,
    Quirk,
    QuirksSettingError,
    detected,
    parse_setting,
    resolve,
    static_session_warning,
)
from streams.runtime.factory import ThreadClients, build_stream_thread
from streams.runtime.thread import StreamThread
from tests.unit.streams.fakes import (
    FakeChangelogReader,
    FakeConsumer,
    FakeControl,
    FakeProducer,
    config,
    counting_subs,
)

APACHE_KAFKA_CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qk"


def test_tansu_and_the_embedded_broker_have_every_quirk_and_apache_kafka_none() -> None:
    assert detected("tansu_cluster", embedded=False) == BrokerQuirks.every()
    assert detected(None, embedded=True) == BrokerQuirks.every()
    assert detected(APACHE_KAFKA_CLUSTER_ID, embedded=False) == BrokerQuirks()
    assert detected(None, embedded=False) == BrokerQuirks()


def test_the_setting_names_all_none_or_single_quirks() -> None:
    assert parse_setting("auto") is None
    assert parse_setting("ALL") == BrokerQuirks.every()
    assert parse_setting("none") == BrokerQuirks()
    assert parse_setting("leader-wedge, late-follower-sync") == BrokerQuirks(
        frozenset({Quirk.LEADER_WEDGE, Quirk.LATE_FOLLOWER_SYNC}))


def test_a_misspelt_quirk_is_refused_naming_the_closest() -> None:
    with pytest.raises(QuirksSettingError, match="did you mean 'leader-wedge'"):
        parse_setting("leader-wedg")
    with pytest.raises(ConfigError, match="broker_quirks: unknown 'sticky'"):
        AppConfig(application_id="quirky", broker_quirks="sticky")


def test_the_setting_wins_over_detection_and_the_older_digest_setting_decides_its_quirk() -> None:
    assert resolve("none", None, "tansu", embedded=True) == BrokerQuirks()
    assert resolve("auto", None, APACHE_KAFKA_CLUSTER_ID, embedded=False) == BrokerQuirks()
    on_kafka = resolve("auto", True, APACHE_KAFKA_CLUSTER_ID, embedded=False)
    assert on_kafka == BrokerQuirks(frozenset({Quirk.CACHED_STATIC_REJOIN}))
    on_tansu = resolve("auto", False, "tansu", embedded=False)
    assert Quirk.CACHED_STATIC_REJOIN not in on_tansu
    assert Quirk.LEADER_WEDGE in on_tansu


async def test_the_broker_is_asked_only_when_the_quirks_are_detected() -> None:
    unreachable = "127.0.0.1:1"  # never asked: these answers need no broker
    assert await broker_quirks("auto", None, unreachable, embedded=True) == BrokerQuirks.every()
    assert await broker_quirks("none", None, unreachable, embedded=False) == BrokerQuirks()
    assert await broker_quirks("all", False, unreachable, embedded=False) == BrokerQuirks(
        frozenset(Quirk) - {Quirk.CACHED_STATIC_REJOIN})


def quirks_with(quirk: Quirk, on: bool) -> BrokerQuirks:
    """Every quirk but ``quirk``, or ``quirk`` alone: each is seen on and off."""
    return BrokerQuirks(frozenset({quirk})) if on else BrokerQuirks(frozenset(Quirk) - {quirk})


def thread_with(hooks: RoundHooks, tmp_path: Path, consumer: FakeConsumer | None = None,
                **settings: object) -> StreamThread:
    producer = FakeProducer()
    clients = ThreadClients(consumer or FakeConsumer(), producer, FakeChangelogReader(),
                            FakeChangelogReader(), data_producer=producer)
    return build_stream_thread(config(tmp_path, **settings), 0, counting_subs(),
                               clients=clients, instance_id="unit-instance",
                               control=FakeControl(), hooks=hooks)


def test_static_members_with_short_sessions_are_warned_on_tansu_only() -> None:
    tansu = BrokerQuirks.every()
    warning = static_session_warning(tansu, "node-2", 10_000)
    assert warning is not None and "'node-2' with a 10000 ms session" in warning
    assert "30000 ms or more" in warning and "RELAY_SESSION_TIMEOUT_MS" in warning
    assert static_session_warning(tansu, "node-2", 30_000) is None
    assert static_session_warning(tansu, None, 10_000) is None  # dynamic members
    assert static_session_warning(BrokerQuirks(), "node-2", 10_000) is None  # Apache Kafka


def test_where_the_broker_needs_nothing_the_hooks_add_nothing() -> None:
    hooks = hooks_for(BrokerQuirks(), FakeControl())
    assert hooks == RoundHooks()
    assert hooks.fresh_subscription("a-thread-0") is None
    assert hooks.unsynced(["a", "b"], "a") == set()
    assert not hooks.waits_for_synced_round


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_cached_static_rejoin_asks_the_leader_too(on: bool, tmp_path: Path) -> None:
    control = FakeControl()
    hooks = hooks_for(quirks_with(Quirk.CACHED_STATIC_REJOIN, on), control)
    thread = thread_with(hooks, tmp_path, group_instance_id="node-a")
    thread.member.request_rejoin("learners ready")
    assert bool(control.rebalance_requests) is on


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
async def test_late_follower_sync_defers_a_rejoin_until_the_round_synced(
        on: bool, tmp_path: Path) -> None:
    consumer = FakeConsumer()
    thread = thread_with(hooks_for(quirks_with(Quirk.LATE_FOLLOWER_SYNC, on)), tmp_path,
                         consumer)
    try:
        await assign_to(thread, consumer, group_size=2)
        thread.member.request_rejoin_once_synced("learners ready")
        # On: member-b has not reported its assignment, so the member waits to ask.
        assert consumer.rejoins == (0 if on else 1)
    finally:
        thread.member.close()
        thread.task_manager.close_all()


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
async def test_leader_wedge_leaves_only_from_a_formed_group(on: bool, tmp_path: Path) -> None:
    consumer = FakeConsumer()
    heartbeats: list[str | None] = []

    async def heartbeat() -> str | None:
        heartbeats.append(None)
        return None

    consumer.heartbeat = heartbeat  # type: ignore[method-assign]
    hooks = hooks_for(quirks_with(Quirk.LEADER_WEDGE, on))
    thread = thread_with(hooks, tmp_path, consumer)
    await hooks.before_leave(thread.member, consumer, 6000, 1000, handed_over=False,
                             sends_leave_group=True, waits_for_syncs=True, name="unit")
    assert bool(heartbeats) is on


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_departed_static_leader_removes_departed_members_when_stuck(on: bool) -> None:
    hooks = hooks_for(quirks_with(Quirk.DEPARTED_STATIC_LEADER, on))
    remover = hooks.departed_remover(FakeProducer(), "127.0.0.1:1", "app", 6000, None)
    assert (remover is not None) is on


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_the_transaction_quirks_switch_what_exactly_once_reads_and_writes(on: bool) -> None:
    assert hooks_for(quirks_with(Quirk.STUCK_LAST_STABLE_OFFSET, on)).committed_by_markers is on
    assert hooks_for(
        quirks_with(Quirk.DEFERRED_TRANSACTIONAL_OFFSETS, on)).records_positions is on


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_no_delete_records_keeps_the_repartition_topics_records(on: bool) -> None:
    assert hooks_for(quirks_with(Quirk.NO_DELETE_RECORDS, on)).keeps_repartition_records is on


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_skipped_batches_switches_the_refetch_of_gaps(on: bool) -> None:
    assert hooks_for(quirks_with(Quirk.SKIPPED_BATCHES, on)).refetch_skipped is on


async def assign_to(thread: StreamThread, consumer: FakeConsumer, **extra: object) -> None:
    assignment = MemberAssignment(**extra)  # type: ignore[arg-type]
    thread.assignor.on_assignment(ConsumerProtocolMemberAssignment(
        0, [], encode_assignment(assignment)))
    await thread.listener.on_partitions_assigned(set())
