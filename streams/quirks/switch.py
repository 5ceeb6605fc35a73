"""The broker's quirks: which workarounds for a broker's group-coordinator behaviour are on.

Each workaround Relay carries for a broker that departs from Apache Kafka's group protocol
has a name here, lives in one module, and is on only when the broker needs it:

- ``cached-static-rejoin`` (:mod:`streams.quirks.static_followers`): a static follower that
  rejoins a
  stable group gets its cached assignment back and no rebalance starts, so static members ask
  the leader on the control topic and check the leader's digest of their assignment; a
  leaving member lets a round under way finish first.
- ``late-follower-sync`` (:mod:`streams.quirks.synced_round`): followers' SyncGroup answers come
  late
  and a JoinGroup sent meanwhile stalls them, so a member asks for the next round (or leaves)
  only once every member of its round has its assignment, and a member frozen past its
  session joins again only once the others' round ended.
- ``leader-wedge`` (:mod:`streams.quirks.formed_group`): a leader that leaves a forming group stays
  its leader, so a member leaves only from a formed group.
- ``departed-static-leader`` (:mod:`streams.quirks.departed_members`): an expired static leader
  keeps leading the rounds that follow, and a member frozen just after it joined a round
  stays in the rounds that follow past its session, so a member stuck joining, or any
  member once another's status has been silent that long, removes static members silent
  for over a session timeout.
- ``stuck-last-stable-offset`` (:func:`streams.kafka.driver.read_committed_by_markers`): a
  partition's last stable offset does not move while any transaction on it is open, so an
  exactly-once member reads its input (a repartition topic several tasks write) up to the
  high watermark and keeps only committed transactions, told by their markers.
- ``deferred-transactional-offsets`` (:mod:`streams.quirks.task_positions`): a committed
  transaction's input offsets reach the group only once no transaction overlapping it on a
  partition is open, which with several tasks writing one topic may be never while input
  flows; so each exactly-once task also writes its input offsets, in its transaction, to an
  internal positions topic it alone writes, and starts from the later of the two.
- ``leave-needs-member-id`` (``relay remove-members``, :mod:`tools.cli`): a LeaveGroup
  naming a static member by its instance id alone (KIP-345) is answered UNKNOWN_MEMBER_ID and
  ignored, so the tool looks each member id up (DescribeGroups) and sends both.
- ``no-delete-records`` (:mod:`streams.runtime.repartition_purge`): the broker lists
  DeleteRecords among its API versions but closes the connection when asked for it, so
  repartition topics are not purged after commits (they grow until deleted by hand).
- ``skipped-batches`` (:func:`streams.kafka.driver.skipped_batches`): a fetch at the end of a
  partition that several producers append to (a repartition topic) can return a later
  batch while an earlier one is not yet readable, and a consumer taking it never reads the
  earlier one; so an at-least-once member fetches a gap in a partition's offsets again
  until the missing records come, or the gap has stood long enough to be the log's own.
- ``group-deleted-with-members`` (``relay reset``, :mod:`tools.reset`): DeleteGroups deletes
  a group that still lists stopped static members (Apache Kafka refuses it, NON_EMPTY_GROUP),
  so a dry run of the reset does not foretell a refusal for them.

Tansu (the embedded broker) needs all ten. Apache Kafka needs none of them; they are
harmless there but cost messages and waits. The setting ``broker_quirks`` chooses: ``auto``
(detected: all for the embedded broker and for brokers whose cluster id says Tansu, none
otherwise), ``all``, ``none``, or a comma-separated list of names.

Workarounds that are correct on every broker have no switch: reading a changelog's end from
the fetch high watermark, finding aborted transactions from their markers when a fetch
response lists none (:mod:`statestore.fetch`), creating topics explicitly, refusing a
duplicate static id from the status topic, a leaving member's LeaveGroup with both its
member and instance id (it knows both), and giving up a SyncGroup that the group's next round
made vain (:meth:`streams.kafka.cooperative.CooperativeGroupCoordinator.abandon_sync`: Tansu
answers it only at 0.8 of a session, Apache Kafka at once).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from enum import StrEnum


class Quirk(StrEnum):
    CACHED_STATIC_REJOIN = "cached-static-rejoin"
    LATE_FOLLOWER_SYNC = "late-follower-sync"
    LEADER_WEDGE = "leader-wedge"
    DEPARTED_STATIC_LEADER = "departed-static-leader"
    STUCK_LAST_STABLE_OFFSET = "stuck-last-stable-offset"
    DEFERRED_TRANSACTIONAL_OFFSETS = "deferred-transactional-offsets"
    LEAVE_NEEDS_MEMBER_ID = "leave-needs-member-id"
    NO_DELETE_RECORDS = "no-delete-records"
    SKIPPED_BATCHES = "skipped-batches"
    GROUP_DELETED_WITH_MEMBERS = "group-deleted-with-members"


#: Cluster ids (prefixes, lower case) of brokers that have every quirk.
BROKERS_WITH_QUIRKS = ("tansu",)


class QuirksSettingError(ValueError):
    """A ``broker_quirks`` setting that names no known choice or quirk."""


@dataclass(frozen=True)
class BrokerQuirks:
    """The workarounds that are on."""

    enabled: frozenset[Quirk] = frozenset()

    def __contains__(self, quirk: object) -> bool:
        return quirk in self.enabled

    @classmethod
    def every(cls) -> BrokerQuirks:
        return cls(frozenset(Quirk))

    def describe(self) -> str:
        return ", ".join(sorted(self.enabled)) or "none"


#: Static membership on a broker with late follower syncs (Tansu) holds with sessions this
#: long or more: its rounds run on its timers (a JoinGroup answered half a session after it
#: is sent, a static member's SyncGroup 3 s after), so that with shorter ones a restarting
#: member can be evicted before its round ends, and the group rejoins again and again.
STATIC_SESSION_FLOOR_MS = 30_000


def static_session_warning(quirks: BrokerQuirks, group_instance_id: str | None,
                           session_timeout_ms: int) -> str | None:
    """What to tell an app whose static membership will not hold on this broker; None when
    it will."""
    if (group_instance_id is None or Quirk.LATE_FOLLOWER_SYNC not in quirks
            or session_timeout_ms >= STATIC_SESSION_FLOOR_MS):
        return None
    return (f"group_instance_id {group_instance_id!r} with a {session_timeout_ms} ms session "
            f"on a broker whose rounds run on its timers (the embedded Tansu): a static "
            f"member that restarts or joins can be evicted before its round ends, its tasks "
            f"moving and the group rejoining for tens of seconds; give static members "
            f"sessions of {STATIC_SESSION_FLOOR_MS} ms or more (RELAY_SESSION_TIMEOUT_MS), or "
            f"run them on Apache Kafka")


def parse_setting(setting: str) -> BrokerQuirks | None:
    """The quirks a ``broker_quirks`` setting names; None for ``auto`` (detect them).

    Raises :class:`QuirksSettingError` naming the closest quirk for a misspelt one."""
    text = setting.strip().lower()
    if text in ("", "auto"):
        return None
    if text == "all":
        return BrokerQuirks.every()
    if text == "none":
        return BrokerQuirks()
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = {q.value: q for q in Quirk}
    unknown = [n for n in names if n not in known]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, known, n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise QuirksSettingError(
            f"broker_quirks: unknown {', '.join(hints)}; use auto, all, none or names from "
            f"{', '.join(sorted(known))}")
    return BrokerQuirks(frozenset(known[n] for n in names))


def detected(cluster_id: str | None, embedded: bool) -> BrokerQuirks:
    """The quirks of a broker, from whether it is the embedded one and its cluster id."""
    if embedded or (cluster_id or "").lower().startswith(BROKERS_WITH_QUIRKS):
        return BrokerQuirks.every()
    return BrokerQuirks()


def resolve(setting: str, static_follower_digests: bool | None, cluster_id: str | None,
            embedded: bool) -> BrokerQuirks:
    """The quirks in force: the setting, else detected; ``static_follower_digests`` (the
    older setting for one quirk), when set, decides ``cached-static-rejoin`` alone."""
    chosen = parse_setting(setting)
    quirks = chosen if chosen is not None else detected(cluster_id, embedded)
    if static_follower_digests is not None:
        enabled = set(quirks.enabled)
        if static_follower_digests:
            enabled.add(Quirk.CACHED_STATIC_REJOIN)
        else:
            enabled.discard(Quirk.CACHED_STATIC_REJOIN)
        quirks = BrokerQuirks(frozenset(enabled))
    return quirks
