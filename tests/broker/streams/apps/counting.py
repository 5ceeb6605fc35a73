"""A counting app run as a separate worker process by the tests (settings from RELAY_*).

With ``COUNTING_STAGES=2`` the records go through a repartition topic first: a stateless
first stage whose tasks all write that topic, then the counting stage."""

from __future__ import annotations

import os

from streams.app import App

app = App()
stream = app.stream(os.environ["COUNTING_INPUT"])
if os.environ.get("COUNTING_STAGES", "1") == "2":
    stream = stream.select_key(lambda key, _value: key).repartition()
(
    stream
    .group_by_key()
    .count(store="counts")
    .to_stream()
    .to(os.environ["COUNTING_OUTPUT"])
)
