"""The web view knows every record kind Relay writes to the control topic: its own messages
are skipped, leaving marks read, and only a record of no known kind is reported; a broker
that stops answering is reported too, and cleared once it answers again."""

from __future__ import annotations

import asyncio
import importlib
import logging
import pkgutil

import msgpack
import pytest
from aiokafka.structs import ConsumerRecord, TopicPartition

import streams.group
from streams.app import App
from streams.group.control import CONTROL_MESSAGE_KEYS, control_topic_name
from streams.group.promotion_asks import PromotionAsk, encode_ask
from streams.group.status_topic import status_topic_name
from streams.group.topology_record import TOPOLOGY_KEY, encode_topology_record
from tools.web import follower
from tools.web.follower import GroupFollower, to_model_record
from tools.web.model import GroupModel, TopologyRecord


def record(topic: str, key: bytes, value: bytes | None) -> ConsumerRecord:
    return ConsumerRecord(topic, 0, 0, 1_000, 0, key, value, None, len(key),
                          -1 if value is None else len(value), ())


def test_a_promotion_ask_is_not_reported_as_a_malformed_mark() -> None:
    model = GroupModel("app")
    ask = encode_ask(PromotionAsk("app-thread-0", 3, ("0_1",)))
    raw = record(control_topic_name("app"), b"__promotion__", ask)
    assert to_model_record(status_topic_name("app"), raw, model) is None
    assert model.unreadable == 0 and model.last_error is None
    assert model.view(2_000)["last_error"] is None


def test_every_message_key_relay_writes_on_the_control_topic_is_known_to_the_view() -> None:
    keys = set()
    for module in pkgutil.iter_modules(streams.group.__path__):
        loaded = importlib.import_module(f"streams.group.{module.name}")
        keys |= {value for name, value in vars(loaded).items()
                 if name.endswith("_KEY") and isinstance(value, bytes)}
    assert b"__promotion__" in keys
    assert keys <= set(CONTROL_MESSAGE_KEYS)
    model = GroupModel("app")
    for key in keys - {TOPOLOGY_KEY}:  # the view reads the topology (below)
        assert to_model_record("app-status", record("app-control", key, b"\x90"), model) is None
    assert model.unreadable == 0


def published() -> bytes:
    app = App("app", bootstrap_servers="127.0.0.1:1")
    app.stream("in").group_by_key().count(store="counts").to_stream().to("out")
    return encode_topology_record(app.describe(), "node-a", 1_234)


def test_the_view_keeps_the_latest_topology_a_process_published() -> None:
    model = GroupModel("app")
    converted = to_model_record("app-status", record("app-control", TOPOLOGY_KEY, published()),
                                model)
    assert isinstance(converted, TopologyRecord)
    model.apply(converted)
    assert model.topology is not None
    assert model.topology.instance_id == "node-a" and model.topology.published_ms == 1_234
    assert [n.name for n in model.topology.description.sub_topologies[0].nodes] == [
        "source-0001", "aggregate-0002", "sink-0003"]
    assert model.view(2_000)["topology"] == {"instance_id": "node-a", "published_ms": 1_234}
    assert model.unreadable == 0


@pytest.mark.parametrize(("value", "why"), [
    (b"\xc1", "undecodable"),
    (msgpack.packb([1, 2]), "is a map"),
    (msgpack.packb({**msgpack.unpackb(published()), "format": 2}), "format 2"),
    (msgpack.packb({**msgpack.unpackb(published()), "description": {"version": 9}}),
     "version 9"),
    (msgpack.packb({**msgpack.unpackb(published()),
                    "description": {"version": 1, "sub_topologies": [{"id": "x"}]}}),
     "malformed topology description"),
])
def test_a_corrupt_or_newer_topology_record_is_skipped_with_a_warning(
        value: bytes, why: str, caplog: pytest.LogCaptureFixture) -> None:
    model = GroupModel("app")
    model.apply(to_model_record("app-status", record("app-control", TOPOLOGY_KEY, published()),
                                model) or pytest.fail("a valid record"))
    with caplog.at_level(logging.WARNING):
        assert to_model_record("app-status", record("app-control", TOPOLOGY_KEY, value),
                               model) is None
    assert why in caplog.text and "skipping the topology record" in caplog.text
    assert model.unreadable == 1 and why in (model.last_error or "")
    # The topology published before stays shown; a tombstone is not a record to show.
    assert model.topology is not None and model.topology.instance_id == "node-a"
    assert to_model_record("app-status", record("app-control", TOPOLOGY_KEY, None),
                           model) is None


class SilentBroker:
    """A consumer whose broker is gone: it asks and never hears back, until it is back."""

    def __init__(self) -> None:
        self.back = False

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        if not self.back:
            await asyncio.Event().wait()
        return dict.fromkeys(tps, 0)


async def test_the_view_says_when_its_broker_stops_answering_and_when_it_answers_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follower, "PROBE_TIMEOUT_S", 0.001)
    changes: list[str | None] = []
    watcher = GroupFollower("127.0.0.1:9", GroupModel("app"), lambda: changes.append(
        watcher.error))
    watcher._answered_ms = 1_000
    broker = SilentBroker()
    tps = [TopicPartition(status_topic_name("app"), 0)]
    await watcher._probe(broker, tps)  # type: ignore[arg-type]
    assert watcher.error is not None and changes == [watcher.error]
    assert "no answer from the broker at 127.0.0.1:9 since" in watcher.error
    assert "(TimeoutError): the view shows the group as of then" in watcher.error
    await watcher._probe(broker, tps)  # type: ignore[arg-type]
    assert len(changes) == 1  # said once, not at every probe
    broker.back = True
    await watcher._probe(broker, tps)  # type: ignore[arg-type]
    assert watcher.error is None and changes[-1] is None
