"""Sessionized clicks with final results: per user, the clicks of each browsing session
(sessions end after 30 minutes without a click; clicks may arrive up to 5 minutes late),
emitted once per session when it closes, never as a stream of partial counts.

    RELAY_BOOTSTRAP_SERVERS=host:9092 python -m streams run examples.sessionized_clicks:app

Input ``clicks``: key the user, value ``{"page": ..., "at": ms}`` (the click's time, which the
windows go by, rather than the time it was produced). Output ``click-sessions``: key
``[user, session_start_ms, session_end_ms]``, value ``{"clicks": n, "pages": [...]}``.
Run it without a broker in its test: ``tests/examples/test_sessionized_clicks.py``.
"""

from __future__ import annotations

from typing import Any

from streams import App, SessionWindows

MINUTE = 60_000


def add_click(_user: str, click: dict[str, Any], session: dict[str, Any]) -> dict[str, Any]:
    return {"clicks": session["clicks"] + 1, "pages": [*session["pages"], click["page"]]}


def merge_sessions(_user: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"clicks": a["clicks"] + b["clicks"], "pages": [*a["pages"], *b["pages"]]}


app = App("sessionized-clicks")
app.topic("clicks", key_serde="str", value_serde="json")
app.topic("click-sessions", key_serde="json", value_serde="json")
(
    app.stream("clicks", timestamp=lambda _user, click, _produced: click["at"])
    .group_by_key()
    .windowed_by(SessionWindows(inactivity_gap_ms=30 * MINUTE, grace_ms=5 * MINUTE))
    .aggregate(lambda: {"clicks": 0, "pages": []}, add_click, store="click-sessions",
               merger=merge_sessions)
    .suppress(until_window_closes=True)
    .to_stream()
    .to("click-sessions")
)
