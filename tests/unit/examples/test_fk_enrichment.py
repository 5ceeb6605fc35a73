"""The foreign-key enrichment example follows orders and customers as either changes."""

from __future__ import annotations

from examples.fk_enrichment import app
from streams import TopologyTestDriver


def test_orders_follow_their_customer() -> None:
    with TopologyTestDriver(app, partitions={"orders": 4, "customers": 2}) as driver:
        driver.pipe("customers", "c1", {"name": "Ann", "tier": "gold"})
        driver.pipe("orders", "o1", {"customer": "c1", "total": 10})
        driver.pipe("orders", "o2", {"customer": "c2", "total": 5})   # no such customer yet
        driver.pipe("customers", "c2", {"name": "Bob", "tier": "new"})
        driver.pipe("customers", "c1", {"name": "Ann", "tier": "platinum"})
        driver.pipe("orders", "o2", None)
        assert driver.read_key_values("enriched-orders") == [
            ("o1", {"customer": "c1", "total": 10, "name": "Ann", "tier": "gold"}),
            ("o2", {"customer": "c2", "total": 5, "name": None, "tier": "unknown"}),
            ("o2", {"customer": "c2", "total": 5, "name": "Bob", "tier": "new"}),
            ("o1", {"customer": "c1", "total": 10, "name": "Ann", "tier": "platinum"}),
            ("o2", None),
        ]
