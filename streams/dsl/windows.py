"""Time windows for windowed aggregations: tumbling and hopping, each with a grace period.

Windows go by the record's timestamp (the producer's, or the broker's log-append time), never
by the clock of the machine processing it. A windowed result is keyed by
``Windowed(key, start, end)``; a record later than its window's end plus the grace period (by
the task's stream time: the largest timestamp the task has processed, kept in its state) is
late and dropped, and counted.

Written to a topic, a ``Windowed`` key is the array ``[key, start_ms, end_ms]`` encoded with
the topic's key serde (msgpack by default, or json); :class:`WindowedSerde` reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from statestore.serdes import (
    JsonSerde,
    MsgPackSerde,
    Serde,
    SerdeError,
    register_serde,
    serde_from_name,
)
from streams.dsl.errors import TopologyError, WindowError


@dataclass(frozen=True)
class Windowed:
    """A key together with the window it was aggregated in, ``start <= t < end`` (ms)."""

    key: Any
    start: int
    end: int


def whole_ms(window: object, *names: str) -> None:
    """Each field ``names`` of the frozen dataclass ``window`` is a whole number of
    milliseconds: an int, a float without a fraction, or a ``timedelta`` (made an int); else
    a ``TypeError`` naming the field, when the app is built rather than at its first record.
    A float under a second is refused too: it is seconds meant, as faust takes them
    (``TumblingWindows(60.0)`` would be 60 ms windows)."""
    for name in names:
        value = getattr(window, name)
        if isinstance(value, timedelta):
            object.__setattr__(window, name, value // timedelta(milliseconds=1))
            continue
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            continue
        if isinstance(value, float) and value.is_integer() and (
                value >= 1000 or value == 0 or "grace" in name):
            object.__setattr__(window, name, int(value))
            continue
        if isinstance(value, float) and value.is_integer():
            kind = repr(window).split("(", 1)[0]
            raise WindowError(f"{kind}: {name}={value!r} is {int(value)} milliseconds; Relay's "
                            f"windows are in milliseconds (faust's in seconds): write "
                            f"{int(value * 1000):_} for {value:g} s, or "
                            f"timedelta(seconds={value:g})")
        # As its repr names it: tumbling windows are hopping ones that advance by their size.
        kind = repr(window).split("(", 1)[0]
        raise WindowError(f"{kind}: {name} must be a whole number of milliseconds, not "
                        f"{value!r}")


@dataclass(frozen=True)
class HoppingWindows:
    """Windows of ``size_ms`` starting every ``advance_ms``; a record falls in
    ``size_ms / advance_ms`` of them. Records may arrive up to ``grace_ms`` late."""

    size_ms: int
    advance_ms: int
    grace_ms: int = 0

    def __post_init__(self) -> None:
        whole_ms(self, "size_ms", "advance_ms", "grace_ms")
        if self.size_ms <= 0:
            raise TopologyError(f"window size_ms must be > 0, not {self.size_ms}")
        if not 0 < self.advance_ms <= self.size_ms:
            raise TopologyError(
                f"window advance_ms must be in (0, size_ms={self.size_ms}], not {self.advance_ms}"
            )
        if self.grace_ms < 0:
            raise TopologyError(f"window grace_ms must be >= 0, not {self.grace_ms}")

    def windows_for(self, timestamp_ms: int) -> list[tuple[int, int]]:
        """The (start, end) of every window that contains ``timestamp_ms``, oldest first."""
        last_start = timestamp_ms - timestamp_ms % self.advance_ms
        starts = []
        start = last_start
        while start > timestamp_ms - self.size_ms and start >= 0:
            starts.append(start)
            start -= self.advance_ms
        return [(s, s + self.size_ms) for s in reversed(starts)]

    @property
    def retention_ms(self) -> int:
        return self.size_ms + self.grace_ms

    def __repr__(self) -> str:
        if self.advance_ms == self.size_ms:
            return f"TumblingWindows(size_ms={self.size_ms}, grace_ms={self.grace_ms})"
        return (f"HoppingWindows(size_ms={self.size_ms}, advance_ms={self.advance_ms}, "
                f"grace_ms={self.grace_ms})")


def TumblingWindows(size_ms: int, grace_ms: int = 0) -> HoppingWindows:
    """Back-to-back windows of ``size_ms``: each record falls in exactly one."""
    return HoppingWindows(size_ms=size_ms, advance_ms=size_ms, grace_ms=grace_ms)


class WindowedSerde:
    """Encodes ``Windowed(key, start, end)`` as ``[key, start, end]`` with an inner serde that
    can encode arrays (msgpack by default, or json), and decodes it back to ``Windowed``."""

    name = "windowed"

    def __init__(self, inner: str | Serde = "msgpack") -> None:
        self.inner = serde_from_name(inner)

    def dumps(self, value: Any) -> bytes:
        if not isinstance(value, Windowed):
            raise SerdeError(f"the windowed serde takes Windowed keys, not {type(value).__name__}")
        return self.inner.dumps([value.key, value.start, value.end])

    def loads(self, data: bytes) -> Any:
        decoded = self.inner.loads(data)
        if not (isinstance(decoded, list | tuple) and len(decoded) == 3
                and isinstance(decoded[1], int) and isinstance(decoded[2], int)):
            raise SerdeError(f"not a windowed key [key, start, end]: {decoded!r:.80}")
        key = tuple(decoded[0]) if isinstance(decoded[0], list) else decoded[0]
        return Windowed(key, decoded[1], decoded[2])


def row_key(key: Any) -> Any:
    """A table row's key as a key-value store keeps it: a windowed table's ``Windowed`` key
    as the tuple ``(key, start, end)``."""
    return (key.key, key.start, key.end) if isinstance(key, Windowed) else key


def windowed_key_serde(key_serde: Serde) -> Serde:
    """The serde a sink writes a ``Windowed`` key with, given the topic's key serde: msgpack and
    json carry the ``[key, start, end]`` array; any other serde gets the key as it is."""
    if isinstance(key_serde, MsgPackSerde | JsonSerde):
        return WindowedSerde(key_serde)
    return key_serde


register_serde("windowed", WindowedSerde)
