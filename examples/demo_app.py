"""The demo's stream app: clicks per user in 10-second tumbling windows, and totals per user.

Run by ``python -m examples.demo`` as two worker processes; settings come from RELAY_*.
"""

from __future__ import annotations

from streams.app import App
from streams.dsl.windows import TumblingWindows

CLICKS = "demo-clicks"
WINDOWED = "demo-clicks-per-window"
TOTALS = "demo-clicks-per-user"
APP_ID = "relay-demo"

app = App(APP_ID)
clicks = app.stream(CLICKS)
(
    clicks.group_by_key()
    .windowed_by(TumblingWindows(10_000, grace_ms=2_000))
    .count(store="clicks-per-window")
    .to_stream()
    .map(lambda window, n: ([window.key, window.start], n))
    .to(WINDOWED)
)
clicks.group_by_key().count(store="clicks-per-user").to_stream().to(TOTALS)
