"""The sessionized-clicks example gives one final result per session, after it closed."""

from __future__ import annotations

from examples.sessionized_clicks import MINUTE, app
from streams import TopologyTestDriver


def test_each_session_is_emitted_once_when_it_closes() -> None:
    with TopologyTestDriver(app) as driver:
        for user, page, at in [("ann", "/", 0), ("ann", "/a", 10 * MINUTE),
                               ("bob", "/", 12 * MINUTE),
                               ("bob", "/x", 9 * MINUTE),    # late, within the session
                               ("ann", "/b", 60 * MINUTE)]:  # 50 min idle: a new session
            driver.pipe("clicks", user, {"page": page, "at": at}, timestamp_ms=1)
        # Stream time 60 min: sessions that ended 35 min (gap and grace) before are final.
        assert driver.read_key_values("click-sessions") == [
            (["ann", 0, 10 * MINUTE], {"clicks": 2, "pages": ["/", "/a"]}),
            (["bob", 9 * MINUTE, 12 * MINUTE], {"clicks": 2, "pages": ["/", "/x"]}),
        ]
        driver.pipe("clicks", "bob", {"page": "/", "at": 200 * MINUTE}, timestamp_ms=1)
        assert driver.read_key_values("click-sessions") == [
            (["ann", 60 * MINUTE, 60 * MINUTE], {"clicks": 1, "pages": ["/b"]})]
