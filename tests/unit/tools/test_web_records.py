"""The web view knows every record kind Relay writes to the control topic: its own messages
are skipped, leaving marks read, and only a record of no known kind is reported."""

from __future__ import annotations

import importlib
import pkgutil

from aiokafka.structs import ConsumerRecord

import streams.group
from streams.group.control import CONTROL_MESSAGE_KEYS, control_topic_name
from streams.group.promotion_asks import PromotionAsk, encode_ask
from streams.group.status_topic import status_topic_name
from tools.web.follower import to_model_record
from tools.web.model import GroupModel


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
    for key in keys:
        assert to_model_record("app-status", record("app-control", key, b"\x90"), model) is None
    assert model.unreadable == 0
