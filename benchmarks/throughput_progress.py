"""How a throughput benchmark worker tells the benchmark how far it got: the app counts each
record it finished (its output sent, or for a consume-only ceiling, the record consumed), and a
daemon thread writes ``<count> <wall time> <process CPU time>`` to the pipe the benchmark
passed in ``BENCH_PROGRESS_FD``, every ``BENCH_PROGRESS_S`` seconds.

Counting costs one attribute increment per record in every strategy alike; the CPU time is
the whole process's (every thread: the client library's, RocksDB's), read in the process
itself so that the benchmark can take it over the steady part of the run alone.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any


class Progress:
    def __init__(self) -> None:
        self.count = 0
        fd = os.environ.get("BENCH_PROGRESS_FD")
        self._out = os.fdopen(int(fd), "w", buffering=1) if fd else None
        self._every_s = float(os.environ.get("BENCH_PROGRESS_S", "0.02"))

    def hit(self, *_: Any) -> None:
        """One record done (usable as a peek/update callback)."""
        self.count += 1

    def add(self, records: int) -> None:
        self.count += records

    def start(self) -> Progress:
        if self._out is not None:
            threading.Thread(target=self._report, name="bench-progress", daemon=True).start()
        return self

    def _report(self) -> None:
        assert self._out is not None
        # Every tick, changed or not: the benchmark interpolates between neighbouring
        # samples, which must therefore be one tick apart.
        while True:
            self._out.write(f"{self.count} {time.time():.6f} {time.process_time():.6f}\n")
            time.sleep(self._every_s)


def settings() -> dict[str, str]:
    """The worker's BENCH_* settings."""
    return {k.removeprefix("BENCH_").lower(): v for k, v in os.environ.items()
            if k.startswith("BENCH_")}
