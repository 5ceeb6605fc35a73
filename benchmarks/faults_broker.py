"""Broker faults of the fault suite, on the Apache Kafka cluster it started (three KRaft
nodes, each broker and controller; every topic replicated 3 times, ``min.insync.replicas``
2): which broker to hit, and hitting it.

- ``broker-kill``: SIGKILL of the broker that coordinates the apps' groups and leads the
  most of their input and changelog partitions, restarted ``down_s`` later;
- ``broker-stop``: SIGSTOP of a broker for longer than its session with the controller
  (``broker.session.timeout.ms``, 9 s by default) and the workers' sessions, then SIGCONT;
- ``broker-rolling``: every broker in turn stopped cleanly (SIGTERM: controlled shutdown)
  and started again, the next one only once every partition is back in sync.

After each, the fault waits (bounded) until no partition is under-replicated, so the next
fault starts from a whole cluster, and reports how long that took.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from streams.testing.apache_kafka import KafkaCluster
from streams.testing.cluster_roles import group_coordinator, partition_leaders, under_replicated

#: Apache Kafka's default ``broker.session.timeout.ms``: a broker silent this long is fenced
#: and its partitions get other leaders.
BROKER_SESSION_S = 9.0
IN_SYNC_TIMEOUT_S = 120.0


class BrokerFaultUnavailable(RuntimeError):
    """The broker faults need a cluster of three or more nodes that the benchmark started."""


@dataclass
class Roles:
    """What each node does for the apps now."""

    #: node id -> what it leads (``input <topic>-<p>``, ``changelog <topic>-<p>``).
    leads: dict[int, list[str]] = field(default_factory=dict)
    #: group (application id) -> its coordinator's node id.
    coordinators: dict[str, int] = field(default_factory=dict)


def pick_leader(roles: Roles) -> int:
    """The node whose loss hurts the apps most: the coordinator of most groups, then the
    leader of most of their partitions (ties: the lowest node id)."""
    coordinating = Counter(roles.coordinators.values())
    nodes = set(roles.leads) | set(coordinating)
    if not nodes:
        raise BrokerFaultUnavailable("no node leads any of the apps' partitions")
    return min(nodes, key=lambda n: (-coordinating[n], -len(roles.leads.get(n, [])), n))


def describe_roles(roles: Roles, node: int) -> str:
    groups = sorted(g for g, n in roles.coordinators.items() if n == node)
    led = roles.leads.get(node, [])
    kinds = Counter(item.split(" ")[0] for item in led)
    parts = [f"coordinator of {', '.join(groups)}" if groups else "coordinator of no group"]
    parts += [f"leader of {count} {kind} partitions" for kind, count in sorted(kinds.items())]
    return "; ".join(parts)


async def roles_now(bootstrap: str, inputs: list[str], app_ids: list[str],
                    all_topics: list[str]) -> Roles:
    """Leaders of the apps' input and changelog partitions, and their groups' coordinators."""
    changelogs = sorted(t for t in all_topics
                        if t.endswith("-changelog") and any(t.startswith(a) for a in app_ids))
    leaders = await partition_leaders(bootstrap, [*inputs, *changelogs])
    roles = Roles()
    for (topic, partition), node in sorted(leaders.items()):
        kind = "changelog" if topic in changelogs else "input"
        roles.leads.setdefault(node, []).append(f"{kind} {topic}-{partition}")
    for app_id in app_ids:
        roles.coordinators[app_id] = await group_coordinator(bootstrap, app_id)
    return roles


async def wait_in_sync(bootstrap: str, timeout_s: float = IN_SYNC_TIMEOUT_S) -> float | None:
    """Seconds until no partition is under-replicated or leaderless (None: not in time)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if not await under_replicated(bootstrap, timeout_s=10):
                return time.monotonic() - started
        except Exception:  # a cluster still electing: ask again
            pass
        await asyncio.sleep(0.5)
    return None


def _synced(seconds: float | None) -> str:
    return ("not every partition back in sync within "
            f"{IN_SYNC_TIMEOUT_S:.0f}s" if seconds is None
            else f"every partition in sync {seconds:.1f}s later")


def require_cluster(cluster: KafkaCluster | None) -> KafkaCluster:
    if cluster is None or len(cluster.nodes) < 3:
        raise BrokerFaultUnavailable(
            "needs --engine kafka with --kafka-nodes 3 or more (a cluster this benchmark "
            "starts: replication 3, min.insync.replicas 2)")
    return cluster


async def kill_leader(cluster: KafkaCluster, bootstrap: str, roles: Roles,
                      down_s: float) -> str:
    """SIGKILL the node :func:`pick_leader` names, start it again ``down_s`` later."""
    node_id = pick_leader(roles)
    node = cluster.node(node_id)
    what = describe_roles(roles, node_id)
    node.kill()
    await asyncio.sleep(down_s)
    restarted = time.monotonic()
    await asyncio.to_thread(cluster.restart, node)
    back = time.monotonic() - restarted
    synced = await wait_in_sync(bootstrap)
    return (f"node {node_id} ({what}) SIGKILLed, restarted {down_s:.0f}s later, answering "
            f"{back:.1f}s after its start; {_synced(synced)}")


async def stop_node(cluster: KafkaCluster, bootstrap: str, node_id: int,
                    pause_s: float) -> str:
    """SIGSTOP a node for ``pause_s``, then SIGCONT."""
    node = cluster.node(node_id)
    node.pause()
    try:
        await asyncio.sleep(pause_s)
    finally:
        node.resume()
    synced = await wait_in_sync(bootstrap)
    return f"node {node_id} SIGSTOPped for {pause_s:.0f}s, then SIGCONT; {_synced(synced)}"


async def rolling_restart(cluster: KafkaCluster, bootstrap: str) -> str:
    """Every node in turn: a clean stop, a start, and a wait until all is in sync."""
    steps = []
    for node in list(cluster.nodes):
        started = time.monotonic()
        await asyncio.to_thread(node.stop, 60.0)
        stopped = time.monotonic() - started
        await asyncio.to_thread(cluster.restart, node)
        answering = time.monotonic() - started
        synced = await wait_in_sync(bootstrap)
        steps.append(f"node {node.node_id} stopped in {stopped:.1f}s, answering "
                     f"{answering:.1f}s after its stop began, "
                     + ("in sync " + f"{synced:.1f}s later" if synced is not None
                        else "not in sync in time"))
        if synced is None:
            break
    return "rolling restart (SIGTERM, start, in sync): " + "; ".join(steps)

