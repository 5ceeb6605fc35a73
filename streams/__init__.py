"""Relay streams: the App, its DSL, stream threads, tasks and the cooperative rebalance layer.

The public names are importable from here (``from streams import App, TumblingWindows``).
Each is imported on first use, so that ``import streams`` stays light: a tool or a test that
needs one module does not load the runtime, aiokafka or RocksDB.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "App": "streams.app",
    "AppConfig": "streams.config",
    "ConfigError": "streams.config",
    "GlobalTable": "streams.dsl.global_tables",
    "GroupedStream": "streams.dsl.stream",
    "GroupedTable": "streams.dsl.stream",
    "JoinWindows": "streams.dsl.joins",
    "PunctuationType": "streams.dsl.punctuation",
    "SessionWindows": "streams.dsl.sessions",
    "SlidingWindows": "streams.dsl.sliding",
    "Stream": "streams.dsl.stream",
    "Table": "streams.dsl.stream",
    "WindowedStream": "streams.dsl.stream",
    "TopicDecl": "streams.dsl.topology",
    "TopologyError": "streams.dsl.topology",
    "HoppingWindows": "streams.dsl.windows",
    "TumblingWindows": "streams.dsl.windows",
    "Windowed": "streams.dsl.windows",
    "WindowedSerde": "streams.dsl.windows",
    "RecordError": "streams.runtime.task",
    "TopologyTestDriver": "streams.testing",
    "read_committed": "streams.kafka.committed_reader",
}

__all__ = [
    "App",
    "AppConfig",
    "ConfigError",
    "GlobalTable",
    "GroupedStream",
    "GroupedTable",
    "HoppingWindows",
    "JoinWindows",
    "PunctuationType",
    "RecordError",
    "SessionWindows",
    "SlidingWindows",
    "Stream",
    "Table",
    "TopicDecl",
    "TopologyError",
    "TopologyTestDriver",
    "TumblingWindows",
    "Windowed",
    "WindowedSerde",
    "WindowedStream",
    "read_committed",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'streams' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what editors and type checkers see
    from streams.app import App
    from streams.config import AppConfig, ConfigError
    from streams.dsl.global_tables import GlobalTable
    from streams.dsl.joins import JoinWindows
    from streams.dsl.punctuation import PunctuationType
    from streams.dsl.sessions import SessionWindows
    from streams.dsl.sliding import SlidingWindows
    from streams.dsl.stream import GroupedStream, GroupedTable, Stream, Table, WindowedStream
    from streams.dsl.topology import TopicDecl, TopologyError
    from streams.dsl.windows import HoppingWindows, TumblingWindows, Windowed, WindowedSerde
    from streams.kafka.committed_reader import read_committed
    from streams.runtime.task import RecordError
    from streams.testing import TopologyTestDriver
