"""A stream-stream left join, run as a worker process of its own by the broker tests
(settings from RELAY_*, topics named after ``JOIN_PREFIX``)."""

from __future__ import annotations

import os

from streams.app import App
from streams.dsl.joins import JoinWindows

#: Wide enough that the records of one phase join whatever order the task takes them in.
WINDOWS = JoinWindows(1000, 1000, grace_ms=0)


def build(app: App, prefix: str) -> App:
    app.stream(f"{prefix}-clicks").left_join(
        app.stream(f"{prefix}-views"), lambda c, v: f"{c}+{v}", WINDOWS,
    ).to(f"{prefix}-joined")
    return app


app = build(App(), os.environ["JOIN_PREFIX"]) if "JOIN_PREFIX" in os.environ else None
