"""Global tables in the DSL: a table every instance holds whole, read from all partitions of
its topic, and the stream join that looks rows up in it by a key the record chooses.

A global table has no changelog: its topic is its changelog. The runtime
(:mod:`streams.runtime.global_tables`) restores it from the topic at start, before any task
runs, and keeps reading the topic while the app runs; the test driver writes what is piped
into the topic straight into it. A stream joins it without co-partitioning or repartition.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statestore.serdes import Serde
from statestore.store import KeyValueStore
from streams.dsl.processors import Node, ProcessorContext

if TYPE_CHECKING:
    from streams.dsl.stream import Stream

log = logging.getLogger(__name__)


@dataclass(eq=False)
class GlobalTable:
    """The latest value per key of ``topic``, all partitions, in the store ``store``."""

    topic: str
    store: str
    key_serde: Serde
    value_serde: Serde
    #: The open store, once the runtime or the test driver opened it.
    opened: KeyValueStore | None = field(default=None, repr=False)

    def get(self, key: Any) -> Any:
        if self.opened is None:
            raise RuntimeError(f"global table {self.store} is not open yet")
        return self.opened.get(key)

    def apply(self, raw_key: bytes | None, raw_value: bytes | None) -> None:
        """One record of the topic: its latest value kept, a tombstone deletes."""
        if raw_key is None or self.opened is None:
            return
        key = self.key_serde.loads(raw_key)
        if raw_value is None:
            self.opened.delete(key)
        else:
            self.opened.put(key, self.value_serde.loads(raw_value))

    def apply_or_skip(self, raw_key: bytes | None, raw_value: bytes | None,
                      where: str) -> bool:
        """:meth:`apply`, a record that cannot be decoded or kept skipped with a warning
        naming ``where`` it came from: one bad record of the topic never stops the app, in
        the runtime as in the test driver. False when skipped."""
        try:
            self.apply(raw_key, raw_value)
        except Exception as exc:
            log.warning("global table %s: record of %s skipped: %s: %s", self.store, where,
                        type(exc).__name__, exc)
            return False
        return True

    def join_stream(self, stream: Stream, key_selector: Callable[[Any, Any], Any],
                    joiner: Callable[[Any, Any], Any], left: bool) -> Stream:
        node = GlobalJoinNode(stream._name("global-join"), self, key_selector, joiner, left)
        return stream._then(node)


class GlobalJoinNode(Node):
    """``joiner(value, row)`` with the global table's row for ``key_selector(key, value)``;
    without a row, nothing (inner) or ``joiner(value, None)`` (left)."""

    def __init__(self, name: str, table: GlobalTable, key_selector: Callable[[Any, Any], Any],
                 joiner: Callable[[Any, Any], Any], left: bool) -> None:
        super().__init__(name)
        self.table = table
        self.key_selector = key_selector
        self.joiner = joiner
        self.left = left

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if value is None:
            return  # Kafka Streams skips a record without a value here
        lookup = self.key_selector(key, value)
        row = None if lookup is None else self.table.get(lookup)
        if row is None and not self.left:
            return
        self.forward(ctx, key, self.joiner(value, row))
