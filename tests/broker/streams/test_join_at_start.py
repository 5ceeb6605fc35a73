"""A stream joined with a table that was written before it sees the table's rows at start,
even when the table's backlog takes many fetches (timestamp synchronization, see
streams.runtime.partition_group), on the real runtime and broker."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.broker.streams.harness import (
    BASE_MS,
    create_topics,
    make_app,
    produce,
    read_all,
    running,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.broker

USERS = 3_000
ORDERS = 200
#: Big enough rows that the users' backlog (about 6 MB) takes several fetches of a partition.
PADDING = "x" * 2_000


async def test_orders_written_after_their_users_all_join_from_a_cold_start(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str],
) -> None:
    app_id = unique("join-start")
    users, orders, out = f"{app_id}-users", f"{app_id}-orders", f"{app_id}-out"
    await create_topics(bootstrap, {users: 1, orders: 1, out: 1})
    await produce(bootstrap, users, ((f"u{i}", {"name": f"n{i}", "pad": PADDING},
                                      BASE_MS + 1_000 + i)
                                     for i in range(USERS)))
    # Each order names one of the last users: their rows come in the backlog's last fetches.
    await produce(bootstrap, orders, ((f"u{USERS - 1 - i % 100}", {"id": i},
                                       BASE_MS + 100_000 + i)
                                      for i in range(ORDERS)))
    app = make_app(app_id, bootstrap, tmp_path)
    table = app.table(users, store="users")
    app.stream(orders).join(table, lambda order, user: {"id": order["id"],
                                                        "name": user["name"]}).to(out)
    async with running(app) as run:
        joined: list[object] = []

        async def all_out() -> bool:
            if run.done():
                run.result()
            joined[:] = await read_all(bootstrap, out, 1)
            return len(joined) >= ORDERS

        await wait_until(all_out, timeout_s=90, interval_s=1.0, message="every order joined")
    assert sorted(v["id"] for _k, v in joined) == list(range(ORDERS))
