"""Record metadata in the DSL: a timestamp extractor per source, and ``peek`` callbacks that
read the record's headers.

A source's timestamp extractor, ``fn(key, value, record_timestamp_ms) -> int``, runs first
for each record read from its topic: windows, joins, suppression, stream time and the
outputs' timestamps then go by what it returns (Kafka Streams' ``TimestampExtractor`` per
``Consumed``). A negative or non-integer result is the record's error: dead-lettered like
any bad record.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from streams.dsl.processors import Node, ProcessorContext


class TimestampExtractorNode(Node):
    def __init__(self, name: str, extractor: Callable[[Any, Any, int], int]) -> None:
        super().__init__(name)
        self.extractor = extractor

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        timestamp = self.extractor(key, value, ctx.timestamp_ms)
        if not isinstance(timestamp, int) or isinstance(timestamp, bool) or timestamp < 0:
            raise ValueError(f"{self.name}: the timestamp extractor returned {timestamp!r}; "
                             f"it must return a timestamp in ms, an int >= 0")
        ctx.timestamp_ms = timestamp
        self.forward(ctx, key, value)


class HeadersPeekNode(Node):
    """``peek`` with a callback of three arguments: ``fn(key, value, headers)``."""

    def __init__(self, name: str, fn: Callable[[Any, Any, Any], None]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        self.fn(key, value, tuple(ctx.headers or ()))
        self.forward(ctx, key, value)


def wants_headers(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` asks for the headers: a third positional parameter without a default,
    or one named ``headers``. ``print`` (``*args``) or a third parameter with a default of
    its own does not: it would be handed the headers where it meant something else."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    return len(required) >= 3 or any(p.name == "headers" for p in positional[2:])
