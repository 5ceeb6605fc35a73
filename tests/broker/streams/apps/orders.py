"""A multi-stage app run as worker processes by the exactly-once tests (settings from
RELAY_*): orders re-keyed by user through a repartition topic, joined with the users table
(each user's region), then counted per region behind a second repartition topic, and
summed per user in one-second tumbling windows.

Topics come from ORDERS_INPUT, ORDERS_USERS, ORDERS_PER_REGION and ORDERS_WINDOWED."""

from __future__ import annotations

import os

from streams.app import App
from streams.dsl.windows import TumblingWindows

#: Late records are not what these tests are about: none is dropped.
GRACE_MS = 3_600_000

app = App()
users = app.table(os.environ["ORDERS_USERS"], store="users")
joined = (
    app.stream(os.environ["ORDERS_INPUT"])
    .select_key(lambda _order, order: order["user"])
    .repartition()
    .join(users, lambda order, region: {**order, "region": region})
)
(
    joined.group_by(lambda _user, order: order["region"])
    .count(store="orders-per-region")
    .to_stream()
    .to(os.environ["ORDERS_PER_REGION"])
)
(
    joined.group_by_key()
    .windowed_by(TumblingWindows(1_000, grace_ms=GRACE_MS))
    .aggregate(lambda: 0, lambda _user, order, total: total + order["amount"],
               store="amount-per-window")
    .to_stream()
    .map(lambda window, total: ([window.key, window.start], total))
    .to(os.environ["ORDERS_WINDOWED"])
)
