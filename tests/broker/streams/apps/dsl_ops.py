"""An app with a session window, final results, a table-table join and a foreign-key join,
run as a worker
process of its own by the broker tests (settings from RELAY_*, topics named after
``DSL_PREFIX``)."""

from __future__ import annotations

import os

from streams.app import App
from streams.dsl.sessions import SessionWindows


def build(app: App, prefix: str) -> App:
    (
        app.stream(f"{prefix}-clicks").group_by_key()
        .windowed_by(SessionWindows(inactivity_gap_ms=1000, grace_ms=0))
        .count(store="sessions")
        .suppress(until_window_closes=True)
        .to_stream().to(f"{prefix}-sessions")
    )
    left = app.table(f"{prefix}-left", store="left")
    right = app.table(f"{prefix}-right", store="right")
    left.join(right, lambda lv, rv: [lv, rv]).to_stream().to(f"{prefix}-joined")
    orders = app.table(f"{prefix}-orders", store="orders")
    (orders.left_join(right, lambda order, row: [order["n"], row],
                      foreign_key=lambda order: order["ref"])
     .to_stream().to(f"{prefix}-enriched"))
    return app


app = build(App(), os.environ["DSL_PREFIX"]) if "DSL_PREFIX" in os.environ else None
