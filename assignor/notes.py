"""The leader's notes: its memory spread over the members, so that a new leader can rebuild it.

Each assignment carries notes, and each member echoes its copy in its next subscription. A
member's notes hold what it is about to receive (tasks revoked elsewhere for it) and, for one
member on another instance (its buddy), what that member runs and is about to receive; the
tasks held back for a vanished member are noted on two members of two other instances (a
vanished thread's sibling threads count when fewer other instances are left). So a leader
that crashes or restarts, or any one instance restarting with it, loses no note where two
instances are left: what it carried is also carried elsewhere. Each member's own running
tasks are not repeated in its own notes (its subscription lists them), which keeps the group's
metadata to about two copies of the task list beyond what the protocol already carries.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence

from assignor.model import LeaderMemory, LeaderNotes, Member, MemberKey, MemberNotes


def _carriers(keys: Sequence[MemberKey], about: MemberKey, count: int) -> list[MemberKey]:
    """``count`` members other than ``about``, half way round the sorted list of members from
    it: on other instances than ``about``'s and than each other's first, then ``about``'s
    sibling threads (so that a thread's notes survive where its instance is the only other
    one, or a restart of another instance), then any."""
    n = len(keys)
    if not n:
        return []
    start = (bisect_left(keys, about) + n // 2) % n
    chosen: list[MemberKey] = []
    for sibling, distinct in ((False, True), (True, True), (True, False)):
        for step in range(n):
            key = keys[(start + step) % n]
            if key == about or key in chosen or (key[0] == about[0] and not sibling):
                continue
            if distinct and any(key[0] == c[0] for c in chosen):
                continue
            chosen.append(key)
            if len(chosen) == count:
                return chosen
    return chosen


def build_notes(
    noted_at_ms: int,
    formed_at_ms: int,
    members: Sequence[Member],
    actives: Mapping[MemberKey, Sequence[str]],
    incoming: Mapping[MemberKey, Sequence[str]],
    held: Mapping[MemberKey, Mapping[str, int]],
) -> dict[str, LeaderNotes]:
    """Every member's notes for this round (member id -> notes), stamped ``noted_at_ms``."""
    keys = sorted(m.key for m in members)
    carried: dict[MemberKey, dict[MemberKey, MemberNotes]] = {key: {} for key in keys}
    for key in keys:
        arriving = tuple(incoming.get(key, ()))
        if arriving:
            carried[key][key] = MemberNotes(incoming=arriving)
        owned = tuple(actives.get(key, ()))
        if owned or arriving:
            for carrier in _carriers(keys, key, 1):
                carried[carrier][key] = MemberNotes(owned=owned, incoming=arriving)
    for key, tasks in sorted(held.items()):
        if tasks:
            for carrier in _carriers(keys, key, 2):
                carried[carrier][key] = MemberNotes(held=dict(tasks))
    return {
        m.member_id: LeaderNotes(round_ms=noted_at_ms, formed_at_ms=formed_at_ms,
                                 members=carried[m.key])
        for m in members
    }


def memory_from_notes(members: Sequence[Member]) -> LeaderMemory:
    """The leader's memory as the members' echoed notes describe it: for each member, the
    newest notes anyone carries about it. Empty when nobody carries notes."""
    newest: dict[MemberKey, int] = {}
    merged: dict[MemberKey, tuple[set[str], set[str], dict[str, int]]] = {}
    formed: int | None = None
    for member in members:
        notes = member.notes
        if notes is None:
            continue
        if notes.formed_at_ms is not None:
            formed = notes.formed_at_ms if formed is None else min(formed, notes.formed_at_ms)
        for key, record in notes.members.items():
            seen = newest.get(key)
            if seen is not None and notes.round_ms < seen:
                continue
            if seen is None or notes.round_ms > seen:
                newest[key] = notes.round_ms
                merged[key] = (set(), set(), {})
            owned, arriving, held = merged[key]
            owned.update(record.owned)
            arriving.update(record.incoming)
            held.update(record.held)
    owners: dict[str, MemberKey] = {}
    moving: dict[str, MemberKey] = {}
    lost: dict[str, tuple[MemberKey, int]] = {}
    for key in sorted(merged):
        owned, arriving, held = merged[key]
        for task in sorted(owned):
            owners[task] = key
        for task in sorted(arriving):
            moving[task] = key
        for task, since in sorted(held.items()):
            owners[task] = key
            lost[task] = (key, since)
    return LeaderMemory(
        instances=frozenset(key[0] for key in merged),
        owners=owners,
        lost=lost,
        formed_at_ms=formed,
        moving=moving,
        noted_at_ms=max(newest.values(), default=None),
    )


def owners_noted_at(members: Sequence[Member]) -> dict[str, int]:
    """task -> the stamp of the newest notes that name a member running it, about to
    receive it, or it held for: the round a memory rebuilt from the notes has its owner
    from."""
    noted: dict[str, int] = {}
    for member in members:
        notes = member.notes
        if notes is None:
            continue
        for record in notes.members.values():
            for task in (*record.owned, *record.incoming, *record.held):
                noted[task] = max(noted.get(task, notes.round_ms), notes.round_ms)
    return noted
