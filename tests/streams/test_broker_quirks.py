"""The broker's quirks: detected from the broker, chosen by the setting, and each one turning
its workaround on or off in a stream thread (no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.config import AppConfig, ConfigError
from streams.quirks.detect import broker_quirks
from streams.quirks.switch import (
    BrokerQuirks,
    Quirk,
    QuirksSettingError,
    detected,
    parse_setting,
    resolve,
)
from streams.quirks.synced_round import RoundReports
from streams.runtime.factory import ThreadClients, build_stream_thread
from tests.streams.fakes import (
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


@pytest.mark.parametrize("quirks", [BrokerQuirks.every(), BrokerQuirks()],
                         ids=["all", "none"])
def test_each_quirk_turns_its_workaround_on_in_the_thread(quirks: BrokerQuirks,
                                                         tmp_path: Path) -> None:
    producer = FakeProducer()
    clients = ThreadClients(FakeConsumer(), producer, FakeChangelogReader(),
                            FakeChangelogReader(), data_producer=producer)
    thread = build_stream_thread(config(tmp_path), 0, counting_subs(), clients=clients,
                                 instance_id="unit-instance", control=FakeControl(),
                                 round_reports=RoundReports(), quirks=quirks)
    on = quirks == BrokerQuirks.every()
    # late-follower-sync: rounds reported and waited for; leader-wedge: leave when formed.
    assert (thread._round_reports is not None) is on
    assert thread._leave_from_formed_group is on
