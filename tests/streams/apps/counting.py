"""A counting app run as a separate worker process by the tests (settings from RELAY_*)."""

from __future__ import annotations

import os

from streams.app import App

app = App()
(
    app.stream(os.environ["COUNTING_INPUT"])
    .group_by_key()
    .count(store="counts")
    .to_stream()
    .to(os.environ["COUNTING_OUTPUT"])
)
