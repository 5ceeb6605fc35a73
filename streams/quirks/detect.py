"""Which quirks are in force for the broker the app talks to: the setting, else asked of the
broker (its cluster id). The decision itself is :func:`streams.quirks.switch.resolve`, free
of any client."""

from __future__ import annotations

import logging

from streams.kafka.driver import broker_cluster_id
from streams.quirks.switch import BrokerQuirks, parse_setting, resolve

log = logging.getLogger(__name__)


async def broker_quirks(setting: str, static_follower_digests: bool | None,
                        bootstrap_servers: str, embedded: bool) -> BrokerQuirks:
    """The quirks in force for this broker; asks it for its cluster id only when the
    setting is ``auto`` and the broker is not the embedded one."""
    cluster_id: str | None = None
    if not embedded and parse_setting(setting) is None:
        try:
            cluster_id = await broker_cluster_id(bootstrap_servers)
        except Exception as exc:
            log.warning("could not ask the broker for its cluster id (%s): no broker quirks "
                        "assumed; set broker_quirks to choose", exc)
    quirks = resolve(setting, static_follower_digests, cluster_id, embedded)
    log.info("broker %s: quirks %s", "embedded" if embedded else repr(cluster_id),
             quirks.describe())
    return quirks
