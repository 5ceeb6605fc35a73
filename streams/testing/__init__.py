"""Public: what tests of a Relay app use: the topology test driver, and the embedded broker
for tests that need a real one.

The driver is imported on first use: the broker launcher beside it is imported by the
runtime's own modules, which the driver imports in turn."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streams.testing.driver import TopologyTestDriver

__all__ = ["TopologyTestDriver"]


def __getattr__(name: str) -> Any:
    if name == "TopologyTestDriver":
        return importlib.import_module("streams.testing.driver").TopologyTestDriver
    raise AttributeError(f"module 'streams.testing' has no attribute {name!r}")
