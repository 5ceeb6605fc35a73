"""The error of a topology that cannot run, shared by the DSL's modules (the topology and the
processors it is built of) and caught by ``relay run`` as a configuration error (exit 4)."""

from __future__ import annotations


class TopologyError(ValueError):
    """The declared topology cannot run: a clear message says what to change."""


class WindowError(TopologyError, TypeError):
    """A window's size, advance, gap or grace is not a whole number of milliseconds (a
    ``TypeError`` as well, which it was)."""
