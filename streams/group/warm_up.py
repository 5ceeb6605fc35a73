"""Warm-up before joining: a new instance restores the state of the tasks it is about to take
before it joins the group, so that they move to it in its first round.

A new instance that joins at once gets learners in its first round, restores them while their
owners keep running, and takes the tasks over in a later round that its ready learners ask
for. The tasks stop for about one round either way, but the group is balanced only after that
second round. Instead, before its threads join, a new instance reads the members' status
records, runs the leader's own pure assignor on them with itself added, and takes the
learners that round would give it as its warm-up. It opens those copies, restores them while
it is not yet a member (their owners notice nothing), then says on the control topic that it
joins with them caught up (a *joining* promotion ask, see :mod:`streams.group.promotion_asks`), and
joins. Owners that read the ask give those tasks up as they join the round the newcomer
starts, and the leader places an unowned task on its ready learner first: the tasks move in
the newcomer's first round.

The restore and the round need not follow each other. Members publish the shortest of their
last few join rounds; once the copies, at the rate they are being read, will have caught up within
that time, the newcomer announces and joins, its copies restoring on while the round runs.
Its first subscription lists them as ready by the time the assignment arrives, and the leader
counts them as ready learners. The moved tasks still stop for about one round, and the group
is balanced about one round sooner. A rate that drops afterwards costs the moved task only
the restore left when its assignment arrives.

Nothing here decides where a task goes: the leader does, as always. A prediction that turns
out wrong costs nothing beyond the warm-up's restore: a task an owner gave up that the leader
does not give to the newcomer goes back to its owner, which kept its state as a copy, and a
warmed copy the round does not place is closed (its state stays on disk).

An instance warms up only when it is new to a running group: a restart (its instance id in
the status records, or state of its own on disk) rejoins at once, since static membership
promises that a restart moves nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from assignor import AssignorConfig, Member, Task, assign
from streams.group.member_id import thread_member_id

log = logging.getLogger(__name__)

#: Thread states of a member that still runs (its status record is not a leftover).
LIVE_STATES = frozenset({"starting", "rebalancing", "running"})
#: How long a newcomer waits for a settled view of the group before it joins at once.
WARM_UP_PLAN_WAIT_S = 5.0
#: How long a warm-up reads before its rate is trusted to say when it will have caught up.
RATE_TRUSTED_AFTER_S = 1.0
#: A member's measured round beyond this is not a join round to plan on (a round that waited
#: on a member's timeout): such records are ignored.
MAX_TRUSTED_ROUND_S = 60.0


@dataclass(frozen=True)
class WarmUpPlan:
    """What each of this instance's threads restores before it joins, and the generation of
    the group whose members the asks address."""

    generation: int
    by_thread: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    #: How long a join round takes this group (the shortest its members measured lately; 0
    #: when none says): copies that will have caught up within it let the threads join.
    join_lead_s: float = 0.0

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(sorted(t for tasks in self.by_thread.values() for t in tasks))


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _lags(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    return {str(t): _int(lag, 0) for t, lag in value.items()}


def _tasks(value: Any) -> list[str]:
    return [str(t) for t in value] if isinstance(value, list) else []


def join_round_s(records: Mapping[str, Mapping[str, Any]]) -> float:
    """The shortest join round the members measured lately (their status's ``round_s``), 0.0
    when none says: a newcomer's own round takes about as long, and underestimating it only
    makes the newcomer join a little later than it could."""
    rounds = [record.get("round_s") for record in records.values()]
    valid = [float(r) for r in rounds if isinstance(r, (int, float)) and not isinstance(r, bool)
             and 0 < r < MAX_TRUSTED_ROUND_S]
    return min(valid, default=0.0)


def catches_up_within(lead_s: float, elapsed_s: float, records_read: int,
                      records_left: int) -> bool:
    """Whether copies that read ``records_read`` records in ``elapsed_s`` seconds, at that
    rate, read the ``records_left`` they still lag by within ``lead_s`` seconds."""
    if lead_s <= 0 or elapsed_s < RATE_TRUSTED_AFTER_S or records_read <= 0:
        return False
    return records_left * elapsed_s <= lead_s * records_read


def live_records(statuses: Mapping[str, Mapping[str, Any]], now_ms: int,
                 stale_after_ms: int) -> dict[str, Mapping[str, Any]]:
    """Status records of members that still run: a live state, updated lately (a killed
    process leaves its last record behind)."""
    return {key: record for key, record in statuses.items()
            if isinstance(record, Mapping) and record.get("state") in LIVE_STATES
            and now_ms - _int(record.get("updated_ms"), 0) <= stale_after_ms}


def group_settled(statuses: Mapping[str, Mapping[str, Any]], now_ms: int,
            stale_after_ms: int) -> bool:
    """Whether the status records show a group to plan from: every live member running,
    with nothing restoring, or warming up itself (its copies count as learners, so that a
    second newcomer plans around the first one's); true of an empty group too."""
    records = live_records(statuses, now_ms, stale_after_ms)
    return all((record.get("state") == "running" and not record.get("restoring"))
               or record.get("warming_up") is True for record in records.values())


def members_from_status(records: Mapping[str, Mapping[str, Any]]) -> list[Member]:
    """The group as its members' status records describe it, as the assignor's members."""
    members: list[Member] = []
    for key, record in sorted(records.items()):
        instance = record.get("instance_id")
        if not isinstance(instance, str):
            continue
        members.append(Member(
            member_id=key, instance_id=instance, thread=_int(record.get("thread")),
            active=frozenset(_tasks(record.get("active")) + _tasks(record.get("restoring"))),
            standbys=_lags(record.get("standbys")), learners=_lags(record.get("learners")),
            leaving=record.get("leaving") is True,
            leaving_since_ms=(record.get("leaving_since_ms")
                              if isinstance(record.get("leaving_since_ms"), int) else None),
            asks_promotion=False,
        ))
    return members


def plan_warm_up(
    statuses: Mapping[str, Mapping[str, Any]],
    instance_id: str,
    num_threads: int,
    tasks: Iterable[Task],
    config: AssignorConfig,
    now_ms: int,
    stale_after_ms: int,
) -> WarmUpPlan | None:
    """The learners the next round would give this instance if it joined now; None when it
    should join at once: no running group, this instance already in it (a restart), a task
    that runs nowhere (held for a member that is away), or nothing stateful to take."""
    records = live_records(statuses, now_ms, stale_after_ms)
    if any(record.get("instance_id") == instance_id for record in statuses.values()
           if isinstance(record, Mapping)):
        return None  # a restart: its own records are there, live or left behind
    members = members_from_status(records)
    if not members:
        return None
    tasks = list(tasks)
    running = {task for member in members for task in member.active}
    if any(task.stateful and task.task_id not in running for task in tasks):
        # Held for a member that is away (this very instance, maybe, restarted after a
        # clean stop took its records away), or lost: the round will not be a newcomer's.
        return None
    newcomers = [Member(member_id=f"{thread_member_id(instance_id, n)}-warm-up",
                        instance_id=instance_id, thread=n) for n in range(num_threads)]
    assignments, _memory = assign(list(tasks), members + newcomers, config, now_ms, None)
    by_thread = {m.thread: tuple(sorted(assignments[m.member_id].learners))
                 for m in newcomers if assignments[m.member_id].learners}
    if not by_thread:
        return None
    generation = max(_int(record.get("generation"), -1) for record in records.values())
    return WarmUpPlan(generation, by_thread, join_round_s(records))


class WarmUpGate:
    """The threads of one instance join together, once every one of them has warmed up
    (or given up waiting): a thread that joined alone would start the round while its
    siblings' copies still restore."""

    def __init__(self, plan: WarmUpPlan, num_threads: int) -> None:
        self.plan = plan
        self._waiting = num_threads
        self._all_done = asyncio.Event()

    def tasks_of(self, thread: int) -> tuple[str, ...]:
        return tuple(self.plan.by_thread.get(thread, ()))

    async def done(self, thread: int) -> None:
        """This thread has warmed up; returns once all of the instance's threads have."""
        self._waiting -= 1
        if self._waiting <= 0:
            self._all_done.set()
        await self._all_done.wait()
