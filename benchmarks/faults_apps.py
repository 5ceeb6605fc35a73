"""The fault benchmark's two stream apps, run as worker processes
(``python -m streams run benchmarks.faults_apps:orders`` or ``…:counts``).

``orders``: orders keyed by order id are stamped with the source task, re-keyed by user
through one repartition topic, and then feed a running total per user, 1-minute windowed
counts per user and a stream-table join with the ``users`` table. ``counts``: a plain count
per key. Every output's value is ``{"v": result, "task": …, "pid": …, "t": …}``: the result,
and which task produced it in which process and when (the benchmark measures each task's
output stalls from these). Topic names come from ``BENCH_*`` variables, settings from
``RELAY_*`` ones.
"""

from __future__ import annotations

import os
import time
from typing import Any

from streams.app import App
from streams.dsl.windows import TumblingWindows

PID = os.getpid()
#: Records are never late in this benchmark: a task that stalls for minutes still counts its
#: records into their windows, so the expected counts need no model of stream time.
WINDOW_GRACE_MS = 3_600_000


class StampOutput:
    """Wraps a result with the task, process and time that produced it."""

    def init(self, context: Any) -> None:
        self.context = context

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, {"v": value, "task": self.context.task_id, "pid": PID,
                                   "t": time.time()})


class StampSource:
    """Notes in an order which source task read it, and when (the first stage's outputs
    leave in the repartition topic, so its stalls are read from the join's outputs)."""

    def init(self, context: Any) -> None:
        self.context = context

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, {**value, "src": self.context.task_id, "src_t": time.time()})


def _add_amount(_user: Any, order: dict[str, Any], total: int) -> int:
    return total + order["amount"]


def _named(order: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    return {"id": order["id"], "amount": order["amount"], "name": user["name"],
            "src": order["src"], "src_t": order["src_t"]}


def _topic(name: str, default: str) -> str:
    return os.environ.get(f"BENCH_{name}", default)


def orders_app() -> App:
    app = App(_topic("ORDERS_APP_ID", "faults-orders"))
    users = app.table(_topic("USERS", "users"), store="users")
    by_user = (app.stream(_topic("ORDERS", "orders")).process(StampSource)
               .select_key(lambda _id, order: order["user"]).repartition())
    grouped = by_user.group_by_key()
    (grouped.aggregate(lambda: 0, _add_amount, store="totals").to_stream()
     .process(StampOutput).to(_topic("TOTALS", "orders-totals")))
    (grouped.windowed_by(TumblingWindows(60_000, grace_ms=WINDOW_GRACE_MS))
     .count(store="per-minute").to_stream()
     .process(StampOutput).to(_topic("PER_MINUTE", "orders-per-minute")))
    by_user.join(users, _named).process(StampOutput).to(_topic("NAMED", "orders-named"))
    return app


def counts_app() -> App:
    app = App(_topic("COUNTS_APP_ID", "faults-counts"))
    (app.stream(_topic("COUNTS_IN", "counts-in")).group_by_key().count(store="counts")
     .to_stream().process(StampOutput).to(_topic("COUNTS_OUT", "counts-out")))
    return app


def __getattr__(name: str) -> App:
    """Build only the app a worker runs (``module:orders`` or ``module:counts``)."""
    if name == "orders":
        return orders_app()
    if name == "counts":
        return counts_app()
    raise AttributeError(name)
