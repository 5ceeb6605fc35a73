"""The embedded protocol: what members tell the leader (subscription) and what the leader
tells each member (assignment), versioned and msgpack-encoded, in the user_data of the
consumer group protocol.

Layout: one byte format version, one byte compression (0 none, 1 zlib), then msgpack. Task
lists are grouped by sub-topology (``{sub: [partition, ...]}``); in the leader's notes (see
:mod:`assignor.notes`), a field older members ignore, each sub-topology's partitions are the
varint-encoded gaps between them (``{sub: bytes}``), which the decoder reads anywhere. Large
payloads are compressed, so a member's payload grows with its own tasks and the notes it
carries: no cluster-wide maps.

The notes are optional in both directions: a subscription from a member that has none (a new
member, or an older Relay) decodes with ``notes=None``. A member builds its subscription with
:func:`with_echo`, giving it the last assignment it received.
"""

from __future__ import annotations

import itertools
import logging
import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from assignor.model import (
    LeaderNotes,
    Member,
    MemberAssignment,
    MemberNotes,
    parse_task_id,
    task_sort_key,
)

log = logging.getLogger(__name__)

VERSION = 1
_NONE, _ZLIB = 0, 1
_COMPRESS_OVER = 256


class ProtocolError(ValueError):
    """Metadata that cannot be decoded: unknown version or corrupt bytes."""


@dataclass(frozen=True)
class Subscription:
    instance_id: str
    thread: int
    pid: int
    active: tuple[str, ...] = ()
    standbys: Mapping[str, int] = field(default_factory=dict)
    learners: Mapping[str, int] = field(default_factory=dict)
    leaving: bool = False
    leaving_since_ms: int | None = None
    scale_down_timeout_ms: int | None = None
    rejoin_token: int = 0
    #: A static member (group.instance.id); the leader tells those to fetch new assignments.
    static: bool = False
    #: The leader's notes from the last assignment this member received (echoed).
    notes: LeaderNotes | None = None
    #: It asks this round to promote its ready learners (see ``Member.asks_promotion``).
    asks_promotion: bool = True
    #: Learners it expects to have caught up by the time this round's assignment arrives
    #: (see ``Member.ready_by_assignment``).
    ready_by_assignment: tuple[str, ...] = ()
    #: Actives it restores from far behind and asks to hand over (see
    #: ``Member.slow_restores``), with the records each has left.
    slow_restores: Mapping[str, int] = field(default_factory=dict)
    version: int = VERSION


def _varints(numbers: Iterable[int]) -> bytes:
    out = bytearray()
    for number in numbers:
        while number >= 0x80:
            out.append((number & 0x7F) | 0x80)
            number >>= 7
        out.append(number)
    return bytes(out)


def _from_varints(data: bytes) -> list[int]:
    numbers, value, shift = [], 0, 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            if shift > 63:
                raise ProtocolError("varint too long in a task list")
        else:
            numbers.append(value)
            value, shift = 0, 0
    if shift:
        raise ProtocolError("task list ends in the middle of a number")
    return numbers


def _pack_tasks(tasks: Iterable[str]) -> dict[int, list[int]]:
    """Per sub-topology, its sorted partitions: the layout every Relay version reads."""
    grouped: dict[int, list[int]] = defaultdict(list)
    for task in tasks:
        sub, partition = parse_task_id(task)
        grouped[sub].append(partition)
    return {sub: sorted(partitions) for sub, partitions in sorted(grouped.items())}


def _pack_task_gaps(tasks: Iterable[str]) -> dict[int, bytes]:
    """Per sub-topology, the varint gaps between sorted partitions: the compact layout of
    the leader's notes (a field older members ignore)."""
    packed = {}
    for sub, partitions in _pack_tasks(tasks).items():
        gaps = [partitions[0]] + [b - a for a, b in itertools.pairwise(partitions)]
        packed[sub] = _varints(gaps)
    return packed


def _partitions(raw: Any) -> list[Any]:
    """A sub-topology's partitions: varint gaps (bytes), or a plain list (older members)."""
    if isinstance(raw, bytes):
        total, partitions = 0, []
        for gap in _from_varints(raw):
            total += gap
            partitions.append(total)
        return partitions
    if isinstance(raw, list):
        return raw
    raise ProtocolError("task list entries must be sub-topology -> partitions")


def _is_count(value: Any) -> bool:
    """A sub-topology or partition number: msgpack's booleans are Python ints, and a corrupt
    byte can make one (``True_1`` is no task)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _unpack_tasks(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, dict):
        raise ProtocolError(f"task list must be a map, not {type(raw).__name__}")
    tasks = []
    for sub, partitions in raw.items():
        if not _is_count(sub):
            raise ProtocolError("task list entries must be sub-topology -> partitions")
        for partition in _partitions(partitions):
            if not isinstance(partition, int) or isinstance(partition, bool) or (
                    partition < 0 or sub < 0):
                raise ProtocolError(f"bad task {sub}_{partition!r}")
            tasks.append(f"{sub}_{partition}")
    return tuple(sorted(set(tasks), key=task_sort_key))


def _pack_lags(lags: Mapping[str, int]) -> dict[int, list[list[int]]]:
    grouped: dict[int, list[list[int]]] = defaultdict(list)
    for task, lag in lags.items():
        sub, partition = parse_task_id(task)
        grouped[sub].append([partition, int(lag)])
    return {sub: sorted(entries) for sub, entries in sorted(grouped.items())}


def _unpack_lags(raw: Any) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise ProtocolError(f"lag map must be a map, not {type(raw).__name__}")
    lags = {}
    for sub, entries in raw.items():
        if not _is_count(sub):
            raise ProtocolError("lag entries must be sub-topology -> (partition, lag) pairs")
        if isinstance(entries, bytes):
            numbers = _from_varints(entries)
            if len(numbers) % 2:
                raise ProtocolError(f"lag entries of sub-topology {sub} are not pairs")
            partition = 0
            for gap, lag in zip(numbers[::2], numbers[1::2], strict=False):
                partition += gap
                lags[f"{sub}_{partition}"] = lag
            continue
        if not isinstance(entries, list):
            raise ProtocolError("lag entries must be sub-topology -> (partition, lag) pairs")
        for entry in entries:  # the older layout: [[partition, lag], ...]
            if (not isinstance(entry, list) or len(entry) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in entry)
                    or entry[0] < 0):
                raise ProtocolError(f"bad lag entry {entry!r}")
            lags[f"{sub}_{entry[0]}"] = entry[1]
    return lags


def _pack_notes(notes: LeaderNotes | None) -> dict[str, Any] | None:
    if notes is None:
        return None
    entries = []
    for (instance, thread), record in sorted(notes.members.items()):
        by_since: dict[int, list[str]] = defaultdict(list)
        for task, since in record.held.items():
            by_since[since].append(task)
        entries.append([instance, thread, _pack_task_gaps(record.owned),
                        _pack_task_gaps(record.incoming),
                        [[since, _pack_task_gaps(tasks)]
                         for since, tasks in sorted(by_since.items())]])
    return {"r": notes.round_ms, "f": notes.formed_at_ms, "m": entries}


def _notes_or_none(raw: Any, what: str) -> LeaderNotes | None:
    """The leader's notes, or None when they cannot be decoded: the rest of the metadata
    stays usable (a new leader then only knows less)."""
    try:
        return _unpack_notes(raw, what)
    except ProtocolError as exc:
        log.warning("%s: ignoring the leader's notes it carries: %s", what, exc)
        return None


def _unpack_notes(raw: Any, what: str) -> LeaderNotes | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ProtocolError(f"{what}: leader notes must be a map, not {type(raw).__name__}")
    entries = raw.get("m", [])
    if not isinstance(entries, list):
        raise ProtocolError(f"{what}: leader notes' members must be a list")
    members: dict[tuple[str, int], MemberNotes] = {}
    for entry in entries:
        if (not isinstance(entry, list) or len(entry) != 5 or not isinstance(entry[0], str)
                or not isinstance(entry[1], int) or not isinstance(entry[4], list)):
            raise ProtocolError(f"{what}: bad leader notes entry {entry!r:.80}")
        held: dict[str, int] = {}
        for pair in entry[4]:
            if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], int):
                raise ProtocolError(f"{what}: bad held-task entry {pair!r:.80}")
            held.update(dict.fromkeys(_unpack_tasks(pair[1]), pair[0]))
        members[(entry[0], entry[1])] = MemberNotes(
            owned=_unpack_tasks(entry[2]), incoming=_unpack_tasks(entry[3]), held=held)
    return LeaderNotes(
        round_ms=_field(raw, "r", int, what),
        formed_at_ms=_field(raw, "f", int, what, optional=True),
        members=members,
    )


def _frame(payload: dict[str, Any]) -> bytes:
    body = msgpack.packb(payload, use_bin_type=True)
    if len(body) > _COMPRESS_OVER:
        return bytes([VERSION, _ZLIB]) + zlib.compress(body, 6)
    return bytes([VERSION, _NONE]) + body


def _unframe(data: bytes | None, what: str) -> dict[str, Any]:
    if not data or len(data) < 2:
        raise ProtocolError(f"{what}: {len(data or b'')} bytes, too short for a Relay header")
    version, compression = data[0], data[1]
    if version != VERSION:
        raise ProtocolError(
            f"{what}: format version {version}, this Relay speaks {VERSION} "
            f"({len(data)} bytes)"
        )
    body = data[2:]
    if compression == _ZLIB:
        try:
            body = zlib.decompress(body)
        except zlib.error as exc:
            raise ProtocolError(f"{what}: corrupt compressed body ({len(data)} bytes)") from exc
    elif compression != _NONE:
        raise ProtocolError(f"{what}: unknown compression {compression}")
    try:
        payload = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:
        raise ProtocolError(f"{what}: corrupt msgpack body ({len(data)} bytes): {exc}") from exc
    if not isinstance(payload, dict):
        raise ProtocolError(f"{what}: body is {type(payload).__name__}, not a map")
    return payload


def _field(payload: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str,
           optional: bool = False) -> Any:
    value = payload.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ProtocolError(f"{what}: field {key!r} is {value!r}, expected {kind}")
    return value


def encode_subscription(sub: Subscription) -> bytes:
    return _frame({
        "i": sub.instance_id, "t": sub.thread, "p": sub.pid,
        "a": _pack_tasks(sub.active), "s": _pack_lags(sub.standbys),
        "l": _pack_lags(sub.learners), "L": sub.leaving, "ls": sub.leaving_since_ms,
        "st": sub.scale_down_timeout_ms, "r": sub.rejoin_token,
        "S": sub.static, "n": _pack_notes(sub.notes), "P": sub.asks_promotion,
        **({"R": _pack_tasks(sub.ready_by_assignment)} if sub.ready_by_assignment else {}),
        **({"sr": _pack_lags(sub.slow_restores)} if sub.slow_restores else {}),
    })


def decode_subscription(data: bytes | None) -> Subscription:
    what = "subscription"
    payload = _unframe(data, what)
    return Subscription(
        instance_id=_field(payload, "i", str, what),
        thread=_field(payload, "t", int, what),
        pid=_field(payload, "p", int, what),
        active=_unpack_tasks(payload.get("a", {})),
        standbys=_unpack_lags(payload.get("s", {})),
        learners=_unpack_lags(payload.get("l", {})),
        leaving=bool(_field(payload, "L", bool, what)),
        leaving_since_ms=_field(payload, "ls", int, what, optional=True),
        scale_down_timeout_ms=_field(payload, "st", int, what, optional=True),
        rejoin_token=_field(payload, "r", int, what),
        static=bool(payload.get("S", False)),
        notes=_notes_or_none(payload.get("n"), what),
        # Absent in subscriptions of older members, which ask on each ready learner.
        asks_promotion=bool(payload.get("P", True)),
        ready_by_assignment=_unpack_tasks(payload.get("R", {})),
        slow_restores=_unpack_lags(payload.get("sr", {})),
    )


def decode_subscription_or_none(member_id: str, data: bytes | None) -> Subscription | None:
    """The leader's view: an undecodable member is treated as new, with no state."""
    try:
        return decode_subscription(data)
    except ProtocolError as exc:
        log.warning("member %s: cannot decode its subscription (%s); treating it as a new "
                    "member with no state", member_id, exc)
        return None


def member_from_subscription(member_id: str, sub: Subscription) -> Member:
    return Member(
        member_id=member_id, instance_id=sub.instance_id, thread=sub.thread,
        active=frozenset(sub.active), standbys=dict(sub.standbys),
        learners=dict(sub.learners), leaving=sub.leaving,
        leaving_since_ms=sub.leaving_since_ms,
        scale_down_timeout_ms=sub.scale_down_timeout_ms,
        notes=sub.notes, asks_promotion=sub.asks_promotion,
        # Only learners it holds: anything else in it would place a task on no copy at all.
        ready_by_assignment=frozenset(sub.ready_by_assignment) & frozenset(sub.learners),
        # Only actives it runs: a slow restore is of a task it has.
        slow_restores={t: lag for t, lag in sub.slow_restores.items() if t in sub.active},
    )


def with_echo(subscription: Subscription, last: MemberAssignment | None) -> Subscription:
    """``subscription`` echoing the leader's notes of ``last``, the last assignment the member
    received (None: nothing to echo). This is all a member does to let any new leader rebuild
    the previous leader's memory."""
    return replace(subscription, notes=None if last is None else last.notes)


def encode_assignment(assignment: MemberAssignment) -> bytes:
    return _frame({
        "a": _pack_tasks(assignment.active), "b": _pack_tasks(assignment.being_learned),
        "l": _pack_tasks(assignment.learners), "s": _pack_tasks(assignment.standbys),
        "r": _pack_tasks(assignment.revoked), "j": assignment.rejoin_after_ms,
        "x": assignment.shutdown, "e": assignment.error, "n": _pack_notes(assignment.notes),
        "g": assignment.group_size, "gl": assignment.group_learners,
    })


def decode_assignment(data: bytes | None) -> MemberAssignment:
    what = "assignment"
    payload = _unframe(data, what)
    return MemberAssignment(
        active=_unpack_tasks(payload.get("a", {})),
        being_learned=_unpack_tasks(payload.get("b", {})),
        learners=_unpack_tasks(payload.get("l", {})),
        standbys=_unpack_tasks(payload.get("s", {})),
        revoked=_unpack_tasks(payload.get("r", {})),
        rejoin_after_ms=_field(payload, "j", int, what, optional=True),
        shutdown=bool(_field(payload, "x", bool, what)),
        error=_field(payload, "e", str, what, optional=True),
        notes=_notes_or_none(payload.get("n"), what),
        # Absent in assignments of older leaders: unknown, nobody waits for it.
        group_size=_field(payload, "g", int, what, optional=True) or 0,
        group_learners=_field(payload, "gl", int, what, optional=True) or 0,
    )
