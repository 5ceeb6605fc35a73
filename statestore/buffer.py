"""The write buffer: a store's writes since its last commit, indexed by encoded key.

Reads see the buffer over the database (a buffered delete hides the database's value), and
ordered scans merge the two. Nothing here touches RocksDB: the store applies the buffer in
one WriteBatch when it commits, once the changelog holds every write in it, and drops it to
abort. So the database never holds a write the changelog might not have.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator

#: A buffered value; None is a delete.
Buffered = bytes | None


class WriteBuffer:
    """Encoded key -> latest value (or None for a delete), with an ordered view for scans."""

    def __init__(self) -> None:
        #: The writes by encoded key. The store's hot path reads and writes it directly: a
        #: key, once in, stays until ``clear`` (a delete is a None value).
        self.entries: dict[bytes, Buffered] = {}
        # Sorted keys, rebuilt on the first scan after a new key arrived (the count of keys
        # grew, as keys only leave all at once): processing writes far more often than it
        # scans.
        self._sorted: list[bytes] = []

    def __len__(self) -> int:
        return len(self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self.entries

    def get(self, key: bytes) -> Buffered:
        """The buffered value (None: a delete); check ``in`` first to tell from absence."""
        return self.entries[key]

    def put(self, key: bytes, value: Buffered) -> None:
        self.entries[key] = value

    def clear(self) -> None:
        self.entries.clear()
        self._sorted = []

    def items(self) -> Iterator[tuple[bytes, Buffered]]:
        """Every buffered write in key order."""
        return ((key, self.entries[key]) for key in self._keys())

    def scan(
        self, lower: bytes | None, upper: bytes | None, reverse: bool = False
    ) -> list[tuple[bytes, Buffered]]:
        """Buffered writes with ``lower <= key < upper`` (None: unbounded), in key order."""
        keys = self._keys()
        start = 0 if lower is None else bisect.bisect_left(keys, lower)
        end = len(keys) if upper is None else bisect.bisect_left(keys, upper)
        chosen = keys[start:end]
        if reverse:
            chosen.reverse()
        return [(key, self.entries[key]) for key in chosen]

    def _keys(self) -> list[bytes]:
        known = len(self._sorted)
        if known != len(self.entries):
            if 0 < len(self.entries) - known <= known // 8:
                # Keys only arrive (the dict keeps their order): a few new ones since the
                # last scan are inserted, where sorting them all again cost a scan per
                # record O(n log n). A new list, so that an iteration under way keeps its own.
                keys = self._sorted.copy()
                for key in itertools.islice(self.entries, known, None):
                    bisect.insort(keys, key)
                self._sorted = keys
            else:
                self._sorted = sorted(self.entries)
        return self._sorted


def merge(
    database: Iterator[tuple[bytes, bytes]],
    buffered: list[tuple[bytes, Buffered]],
    reverse: bool = False,
) -> Iterator[tuple[bytes, bytes]]:
    """Merge an ordered database scan with the buffered writes of the same range: a buffered
    value replaces the database's, a buffered delete removes it."""
    pending = iter(buffered)
    next_buffered = next(pending, None)
    before = (lambda a, b: a > b) if reverse else (lambda a, b: a < b)
    for key, value in database:
        while next_buffered is not None and before(next_buffered[0], key):
            if next_buffered[1] is not None:
                yield next_buffered  # type: ignore[misc]
            next_buffered = next(pending, None)
        if next_buffered is not None and next_buffered[0] == key:
            if next_buffered[1] is not None:
                yield next_buffered  # type: ignore[misc]
            next_buffered = next(pending, None)
            continue
        yield key, value
    while next_buffered is not None:
        if next_buffered[1] is not None:
            yield next_buffered  # type: ignore[misc]
        next_buffered = next(pending, None)
