"""The scaling benchmark's stream app: per key, a running count and the last payload (so
every task holds real state), and for every record an output that says which task and which
process handled it, when, and the input's sequence number (to count records processed twice).
Settings come from RELAY_* and BENCH_* variables."""

from __future__ import annotations

import os
import time
from typing import Any

from streams.app import App

PID = os.getpid()


class Track:
    def init(self, context: Any) -> None:
        self.context = context
        self.state = context.store("state")

    def process(self, key: Any, value: Any) -> None:
        previous = self.state.get(key)
        count = (previous["n"] if previous else 0) + 1
        self.state.put(key, {"n": count, "blob": value["blob"]})
        self.context.forward(key, {"n": count, "task": self.context.task_id, "pid": PID,
                                   "t": time.time(), "seq": value.get("seq", -1)})


app = App(os.environ.get("BENCH_APP_ID", "scaling"))
app.stream(os.environ.get("BENCH_INPUT", "scaling-in")).process(
    Track, stores=["state"]
).to(os.environ.get("BENCH_OUTPUT", "scaling-out"))
