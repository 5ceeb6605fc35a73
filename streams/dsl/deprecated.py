"""Deprecated DSL names, kept working for a release while they warn.

Each alias does what it did before and says, in a ``DeprecationWarning``, what replaces it.
CHANGELOG.md records when it began to warn; it is removed in a later release (see the
deprecation policy in docs/deprecations.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statestore.serdes import Serde
    from streams.dsl.stream import Stream, Table
    from streams.dsl.topology import TopicDecl


def warn_deprecated(old: str, new: str) -> None:
    """Warn once per call site that ``old`` is deprecated and ``new`` replaces it."""
    warnings.warn(
        f"{old} is deprecated and will be removed in a later release; use {new}",
        DeprecationWarning,
        stacklevel=3,
    )


class DeprecatedTableOperations:
    """Operations a windowed aggregation's result had while it was a stream: windowed
    aggregations returned a ``Stream`` before they returned a ``Table`` like the others, and
    apps called ``.map`` and ``.to`` on it. They act on the table's updates, as
    ``to_stream()`` gives them."""

    def map(self: Table, fn: Callable[[Any, Any], tuple[Any, Any]]) -> Stream:
        """Deprecated: use ``table.to_stream().map(fn)``."""
        warn_deprecated("Table.map(fn)", "table.to_stream().map(fn)")
        return self.to_stream().map(fn)

    def to(
        self: Table,
        topic: str | TopicDecl,
        key_serde: str | Serde | None = None,
        value_serde: str | Serde | None = None,
    ) -> None:
        """Deprecated: use ``table.to_stream().to(topic, ...)``."""
        warn_deprecated("Table.to(topic)", "table.to_stream().to(topic)")
        self.to_stream().to(topic, key_serde, value_serde)
