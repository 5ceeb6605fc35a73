"""Foreign-key enrichment: orders, keyed by order id, each joined with the customer its
``customer`` field names (customers are keyed by customer id, and partitioned apart from the
orders). When an order moves to another customer, or a customer changes or goes, every
order that names it is updated.

    RELAY_BOOTSTRAP_SERVERS=host:9092 python -m streams run examples.fk_enrichment:app

Inputs ``orders`` (value ``{"customer": id, "total": n}``) and ``customers`` (value
``{"name": ..., "tier": ...}``); output ``enriched-orders`` keyed by order id, a tombstone
when the order goes. Its test: ``tests/examples/test_fk_enrichment.py``.
"""

from __future__ import annotations

from typing import Any

from streams import App


def enrich(order: dict[str, Any], customer: dict[str, Any] | None) -> dict[str, Any]:
    if customer is None:
        return {**order, "name": None, "tier": "unknown"}
    return {**order, "name": customer["name"], "tier": customer["tier"]}


app = App("fk-enrichment")
for topic in ("orders", "customers", "enriched-orders"):
    app.topic(topic, key_serde="str", value_serde="json")
orders = app.table("orders", store="orders")
customers = app.table("customers", store="customers")
(
    orders.left_join(customers, enrich, foreign_key=lambda order: order["customer"])
    .to_stream()
    .to("enriched-orders")
)
