"""The web view's model: from what members publish on the status topic and the leaving marks
on the control topic, each with its arrival time, to the data the page and the JSON show.

Deterministic and free of I/O: :meth:`GroupModel.apply` folds one record in (the clock is the
record's arrival time), :meth:`GroupModel.view` renders the data at a given time, and
:func:`group_view` does both for a whole sequence. The status record does not say everything
the view shows, so some of it is derived from the history of records:

- a task is stateful when the members' status records list it so (every stateful task of the
  topology); before one does, when any member held a learner or standby copy of it, or restored it
  (stateless tasks have no copies); otherwise it is shown as unknown;
- a task is being learned while some member holds a learner copy of it;
- a copy's progress is how far its lag has come down from the highest lag seen for it;
- moves are changes of a task's active member between records, their cause read from the
  state around them (the old owner leaving or gone, a learner that caught up);
- a rebalance is a member's rebalance counter going up; the members that count one in the
  same generation within a few seconds are one round.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from streams.group.control import LeavingMark
from streams.group.member_id import instance_of as member_instance
from streams.group.topology_record import PublishedTopology

#: A member that published nothing for this long is shown as stale (it may have died).
STALE_AFTER_MS = 15_000
#: How far back the timeline reaches by default.
DEFAULT_WINDOW_MS = 10 * 60_000
#: Members counting a rebalance of one generation within this time took part in one round.
ROUND_SPREAD_MS = 10_000
MAX_EVENTS = 2_000
_TASK_ID = re.compile(r"^(\d+)_(\d+)$")

#: What the view derives because the status record does not carry it (also in the JSON).
DERIVED = {
    "isStateful": "the tasks the members' status records list as stateful; before a record "
                  "lists them, a task seen with a learner, a standby or restoring is, and "
                  "the others are unknown",
    "beingLearned": "a task is being learned while a member publishes a learner copy of it "
                    "(or its active lists it as being learned)",
    "progress": "copies: lag against the highest lag seen for the copy; restoring actives: "
                "unknown unless the status record publishes their remaining lag",
    "ready_in_ms": "the lag still above acceptable_lag over the pace at which the copy's lag "
                   "came down between its last records (smoothed); none while it is not coming "
                   "down",
    "deadline_ms": "a leaving mark's since_ms plus its scale_down_timeout_ms; unknown for a "
                   "mark without a timeout unless the status record publishes the deadline",
}


@dataclass(frozen=True)
class StatusRecord:
    """One record of the status topic: a member's status, or None when it stopped."""

    member: str
    value: Mapping[str, Any] | None
    at_ms: int


@dataclass(frozen=True)
class MarkRecord:
    """One leaving mark of the control topic, or None when it was deleted."""

    instance: str
    mark: LeavingMark | None
    at_ms: int


@dataclass(frozen=True)
class TopologyRecord:
    """The app's topology as a process published it on the control topic."""

    published: PublishedTopology
    at_ms: int


@dataclass(frozen=True)
class Event:
    """One entry of the timeline."""

    at_ms: int
    kind: str  # joined, left, rebalance, assigned, moved, resumed, learner, ready, marked, unmarked
    text: str
    task: str | None = None
    members: tuple[str, ...] = ()
    cause: str | None = None
    gap_ms: int | None = None
    generation: int | None = None


@dataclass(frozen=True)
class MemberStatus:
    """The fields of a status record the view reads, checked."""

    instance_id: str
    thread: int
    static_id: str
    pid: int | None
    member_id: str
    generation: int
    leader: bool
    active: tuple[str, ...]
    restoring: tuple[str, ...]
    standbys: dict[str, int]
    learners: dict[str, int]
    acceptable_lag: int
    leaving: bool
    leaving_since_ms: int | None
    rebalances: int
    processed: int
    restored_records: int
    updated_ms: int
    # Published by newer members only (see DERIVED); None when absent.
    leaving_deadline_ms: int | None = None
    restoring_lag: dict[str, int] | None = None
    stateful_tasks: tuple[str, ...] | None = None
    being_learned: tuple[str, ...] | None = None
    #: Per task: records it dropped (by reason) and misrouted records it saw, since it
    #: started on this member.
    dropped: dict[str, dict[str, int]] | None = None
    misrouted: dict[str, int] | None = None


def parse_status(member: str, value: Mapping[str, Any]) -> MemberStatus:
    """The checked fields of a status record; ValueError naming what is wrong."""
    if not isinstance(value, Mapping):
        raise ValueError(f"status of {member!r} is not a map")

    def get(name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if name not in value:
            if default is ...:
                raise ValueError(f"status of {member!r} lacks {name!r}")
            return default
        item = value[name]
        if item is None and default is None:
            return None
        if not isinstance(item, kind) or (kind is int and isinstance(item, bool)):
            raise ValueError(f"status of {member!r}: {name!r} is {item!r}")
        return item

    def tasks(name: str, default: Any = ...) -> tuple[str, ...] | None:
        items = get(name, list | tuple, default)
        if items is None:
            return None
        if not all(isinstance(t, str) for t in items):
            raise ValueError(f"status of {member!r}: {name!r} holds a non-string task")
        return tuple(items)

    def lags(name: str, default: Any = ...) -> dict[str, int] | None:
        items = get(name, Mapping, default)
        if items is None:
            return None
        if not all(isinstance(t, str) and isinstance(n, int) and not isinstance(n, bool)
                   for t, n in items.items()):
            raise ValueError(f"status of {member!r}: {name!r} is not a map of task to lag")
        return dict(items)

    def drops(name: str) -> dict[str, dict[str, int]] | None:
        items = get(name, Mapping, None)
        if items is None:
            return None
        if not all(isinstance(t, str) and isinstance(counts, Mapping)
                   and all(isinstance(r, str) and isinstance(n, int) and not isinstance(n, bool)
                           for r, n in counts.items())
                   for t, counts in items.items()):
            raise ValueError(f"status of {member!r}: {name!r} is not a map of task to counts "
                             f"by reason")
        return {t: dict(counts) for t, counts in items.items()}

    thread = get("thread", int)
    instance = get("instance_id", str, None) or member
    return MemberStatus(
        instance_id=instance,
        thread=thread,
        static_id=get("static_id", str, None) or member,
        pid=get("pid", int, None),
        member_id=get("member_id", str, None) or "",
        generation=get("generation", int, None) or 0,
        leader=bool(get("leader", bool, None)),
        active=tasks("active") or (),
        restoring=tasks("restoring", None) or (),
        standbys=lags("standbys", None) or {},
        learners=lags("learners", None) or {},
        acceptable_lag=get("acceptable_lag", int, None) or 0,
        leaving=bool(get("leaving", bool, None)),
        leaving_since_ms=get("leaving_since_ms", int, None),
        rebalances=get("rebalances", int, None) or 0,
        processed=get("processed", int, None) or 0,
        restored_records=get("restored_records", int, None) or 0,
        updated_ms=get("updated_ms", int),
        leaving_deadline_ms=get("leaving_deadline_ms", int, None),
        restoring_lag=lags("restoring_lag", None),
        stateful_tasks=tasks("stateful_tasks", None),
        being_learned=tasks("being_learned", None),
        dropped=drops("dropped"),
        misrouted=lags("misrouted", None),
    )


def task_order(task: str) -> tuple[int, int, str]:
    match = _TASK_ID.match(task)
    if match is None:
        return (1 << 30, 0, task)
    return (int(match.group(1)), int(match.group(2)), task)


@dataclass
class _Member:
    status: MemberStatus
    at_ms: int


@dataclass
class _Released:
    member: str
    at_ms: int
    cause: str | None  # why its member let go, if known then (it may be gone at the move)


@dataclass
class GroupModel:
    """The group as the records so far show it. Feed records in arrival order."""

    app: str
    window_ms: int = DEFAULT_WINDOW_MS
    unreadable: int = 0
    last_error: str | None = None
    _members: dict[str, _Member] = field(default_factory=dict)
    _marks: dict[str, tuple[LeavingMark, int]] = field(default_factory=dict)
    _known: set[str] = field(default_factory=set)
    _stateful: set[str] = field(default_factory=set)
    #: The stateful tasks the members' status records list; None: no record lists them.
    _listed_stateful: set[str] | None = None
    _active_since: dict[str, dict[str, int]] = field(default_factory=dict)  # task -> member
    _owner: dict[str, str] = field(default_factory=dict)
    _owned_by: dict[str, set[str]] = field(default_factory=dict)  # member -> tasks it runs
    _released: dict[str, _Released] = field(default_factory=dict)
    #: Members that stopped cleanly while leaving (their last status said so, or their
    #: instance was marked): what they held moves for the scale-down.
    _left_leaving: set[str] = field(default_factory=set)
    _peak: dict[tuple[str, str, str], int] = field(default_factory=dict)
    #: Per copy: its last (arrival, lag) and how fast its lag came down (records/s, smoothed).
    _pace: dict[tuple[str, str, str], tuple[int, int, float | None]] = field(
        default_factory=dict)
    _ready: set[tuple[str, str]] = field(default_factory=set)
    _learned_by: dict[str, str] = field(default_factory=dict)
    _events: deque[Event] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))
    #: Who held each task in which role when: open spans by (task, member, role) -> start,
    #: and closed ones by task.
    _open: dict[tuple[str, str, str], int] = field(default_factory=dict)
    _spans: dict[str, deque[tuple[str, str, int, int]]] = field(default_factory=dict)
    _appended: int = 0  # events appended so far
    _round_seq: int | None = None  # the latest rebalance event's number among them
    last_at_ms: int = 0
    #: The latest topology a process published (None: none yet, or an older app).
    topology: PublishedTopology | None = None

    # -- folding records in -----------------------------------------------------------------

    def reject(self, message: str) -> None:
        """Count a record that could not be decoded at all."""
        self.unreadable += 1
        self.last_error = message

    def apply(self, record: StatusRecord | MarkRecord | TopologyRecord) -> None:
        self.last_at_ms = max(self.last_at_ms, record.at_ms)
        if isinstance(record, TopologyRecord):
            self.topology = record.published
            return
        # Only the tasks this record can change are derived again (groups can be large).
        dirty: set[str] = set()
        if isinstance(record, MarkRecord):
            self._apply_mark(record)
        elif record.value is None:
            gone = self._members.pop(record.member, None)
            if gone is not None:
                if gone.status.leaving or gone.status.instance_id in self._marks:
                    # A clean stop of a leaving member: the tasks it held are taken over
                    # later (its mark may be deleted by then), and that is the scale-down.
                    self._left_leaving.add(record.member)
                self._event(record.at_ms, "left", f"{record.member} stopped",
                            members=(record.member,))
                self._forget_copies(record.member, set(), record.at_ms)
                dirty.update(gone.status.active)
                for task in gone.status.active:
                    self._active_since.get(task, {}).pop(record.member, None)
        else:
            try:
                status = parse_status(record.member, record.value)
            except ValueError as exc:
                self.unreadable += 1
                self.last_error = str(exc)
                return
            previous = self._members.get(record.member)
            dirty.update(status.active, previous.status.active if previous else ())
            self._left_leaving.discard(record.member)  # back (a restart under its key)
            self._apply_status(record.member, status, record.at_ms)
        for member, tasks in self._owned_by.items():
            if tasks and not self._live(member, record.at_ms):
                dirty.update(tasks)
        self._derive_owners(record.at_ms, dirty)

    def _apply_mark(self, record: MarkRecord) -> None:
        had = record.instance in self._marks
        if record.mark is None:
            self._marks.pop(record.instance, None)
            if had:
                self._event(record.at_ms, "unmarked", f"{record.instance}: leaving mark removed")
            return
        self._marks[record.instance] = (record.mark, record.at_ms)
        if not had:
            self._event(record.at_ms, "marked", f"{record.instance} marked leaving")

    def _apply_status(self, member: str, status: MemberStatus, at: int) -> None:
        previous = self._members.get(member)
        if previous is None:
            self._event(at, "joined", f"{member} publishes (instance {status.instance_id})",
                        members=(member,))
        elif status.rebalances > previous.status.rebalances:
            self._count_round(member, status.generation, at)
        self._members[member] = _Member(status, at)
        self._known.update(status.active, status.restoring, status.learners, status.standbys)
        self._stateful.update(status.restoring, status.learners, status.standbys)
        if status.stateful_tasks is not None:
            self._listed_stateful = (self._listed_stateful or set()) | set(status.stateful_tasks)
        for task in status.active:
            self._active_since.setdefault(task, {}).setdefault(member, at)
        if previous is not None:
            for task in set(previous.status.active) - set(status.active):
                self._active_since.get(task, {}).pop(member, None)
        held: set[tuple[str, str, str]] = set()
        for role, copies in (("learner", status.learners), ("standby", status.standbys)):
            for task, lag in copies.items():
                key = (task, member, role)
                held.add(key)
                if key not in self._peak:
                    self._open[key] = at
                if key not in self._peak and role == "learner":
                    self._learned_by[task] = member
                    self._event(at, "learner", f"{task}: learner on {member} (lag {lag})",
                                task=task, members=(member,))
                self._peak[key] = max(self._peak.get(key, 0), lag)
                self._track_pace(key, lag, at)
                if role == "learner" and lag <= status.acceptable_lag \
                        and (task, member) not in self._ready:
                    self._ready.add((task, member))
                    self._event(at, "ready", f"{task}: learner on {member} is ready (lag {lag})",
                                task=task, members=(member,))
        for task, lag in (status.restoring_lag or {}).items():
            key = (task, member, "restoring")
            held.add(key)
            self._peak[key] = max(self._peak.get(key, 0), lag)
            self._track_pace(key, lag, at)
        self._forget_copies(member, held, at)

    def _track_pace(self, key: tuple[str, str, str], lag: int, at: int) -> None:
        last = self._pace.get(key)
        if last is None or at <= last[0]:
            self._pace[key] = (at, lag, last[2] if last else None)
            return
        pace = (last[1] - lag) * 1000 / (at - last[0])
        smoothed = pace if last[2] is None else (last[2] + pace) / 2
        self._pace[key] = (at, lag, smoothed)

    def _eta_ms(self, key: tuple[str, str, str], remaining: int | None) -> int | None:
        """How long until ``remaining`` more records are restored at the copy's pace."""
        pace = self._pace.get(key, (0, 0, None))[2]
        if remaining is None or remaining <= 0 or pace is None or pace <= 0:
            return None
        return int(remaining / pace * 1000)

    def _forget_copies(self, member: str, held: set[tuple[str, str, str]], at: int) -> None:
        for key in [k for k in self._peak if k[1] == member and k not in held]:
            del self._peak[key]
            self._pace.pop(key, None)
            self._close(key, at)
            if key[2] == "learner":
                self._ready.discard((key[0], member))

    def _close(self, key: tuple[str, str, str], at: int) -> None:
        start = self._open.pop(key, None)
        if start is not None:
            task, member, role = key
            self._spans.setdefault(task, deque(maxlen=MAX_EVENTS)).append(
                (member, role, start, at))

    def _count_round(self, member: str, generation: int, at: int) -> None:
        index = None if self._round_seq is None \
            else len(self._events) - (self._appended - self._round_seq)
        last = self._events[index] if index is not None and index >= 0 else None
        if last is not None and last.generation == generation \
                and at - last.at_ms <= ROUND_SPREAD_MS:
            if member not in last.members:
                members = (*last.members, member)
                self._events[index] = replace(  # type: ignore[index]
                    last, members=members,
                    text=f"rebalance, generation {generation} ({len(members)} members)")
            return
        self._round_seq = self._appended
        self._event(at, "rebalance", f"rebalance, generation {generation} (1 member)",
                    members=(member,), generation=generation)

    def _live(self, member: str, at: int) -> bool:
        entry = self._members.get(member)
        return entry is not None and at - entry.at_ms < STALE_AFTER_MS

    def _derive_owners(self, at: int, tasks: set[str]) -> None:
        """A task's active is the live member that most recently started listing it: when a
        task moves, the old owner's last record may still list it for a second."""
        for task in sorted(tasks, key=task_order):
            listing = [(since, member) for member, since in self._active_since.get(task, {}).items()
                       if self._live(member, at)]
            new = max(listing)[1] if listing else None
            old = self._owner.get(task)
            if new == old:
                continue
            if old is not None:
                self._owned_by.get(old, set()).discard(task)
            if new is not None:
                self._owned_by.setdefault(new, set()).add(task)
            # A silent owner stopped at its last record (a crash is only seen later, once
            # it has been silent too long): its task was unassigned from then.
            stopped = at if old is None or self._live(old, at) else self._last_seen(old, at)
            if old is not None:
                self._close((task, old, "active"), stopped if new is None else at)
            if new is not None:
                self._open[(task, new, "active")] = at
            if new is None:
                del self._owner[task]
                self._released[task] = _Released(old, stopped,  # type: ignore[arg-type]
                                                  self._release_cause(old, at))  # type: ignore[arg-type]
                continue
            self._owner[task] = new
            released = self._released.pop(task, None)
            source = old if old is not None else (released.member if released else None)
            gap = None if old is not None or released is None else at - released.at_ms
            if source is None:
                self._event(at, "assigned", f"{task}: active on {new}", task=task,
                            members=(new,))
            elif source == new:
                self._event(at, "resumed", f"{task}: active again on {new}", task=task,
                            members=(new,), gap_ms=gap)
            else:
                cause = (released.cause if released is not None else None) \
                    or self._cause(task, source, new, at)
                self._event(at, "moved", f"{task}: {source} → {new} ({cause})", task=task,
                            members=(source, new), cause=cause, gap_ms=gap)
            if self._learned_by.get(task) == new:
                del self._learned_by[task]

    def _last_seen(self, member: str, at: int) -> int:
        entry = self._members.get(member)
        return entry.at_ms if entry is not None else at

    def _release_cause(self, member: str, at: int) -> str | None:
        entry = self._members.get(member)
        if entry is not None and (entry.status.leaving or entry.status.instance_id in self._marks):
            return "scale-down"
        if entry is None and member in self._left_leaving:
            return "scale-down"
        if not self._live(member, at):
            return "failover"
        return None

    def _cause(self, task: str, source: str, target: str, at: int) -> str:
        cause = self._release_cause(source, at)
        if cause is not None:
            return cause
        if self._learned_by.get(task) == target:
            return "learner caught up"
        return "rebalance"

    def _event(self, at: int, kind: str, text: str, **fields: Any) -> None:
        self._events.append(Event(at, kind, text, **fields))
        self._appended += 1

    # -- the view ---------------------------------------------------------------------------

    def view(self, now_ms: int, window_ms: int | None = None) -> dict[str, Any]:
        """The view's data at ``now_ms`` (plain JSON types), timeline over ``window_ms``."""
        window = self.window_ms if window_ms is None else window_ms
        # A member silent for longer than the view's window is gone (a crashed dynamic
        # member never publishes under its name again); the timeline keeps its last events.
        members = {m: e for m, e in self._members.items()
                   if now_ms - e.at_ms <= max(self.window_ms, STALE_AFTER_MS)}
        instance_of = {m: e.status.instance_id for m, e in members.items()}
        leaving = self._leaving(now_ms)
        instances: dict[str, dict[str, Any]] = {}
        for member, entry in sorted(members.items(), key=lambda kv: (kv[1].status.instance_id,
                                                                     kv[1].status.thread)):
            s = entry.status
            inst = instances.setdefault(s.instance_id, {
                "instance_id": s.instance_id, "leaving": s.instance_id in leaving,
                "threads": [],
            })
            age = now_ms - entry.at_ms
            inst["threads"].append({
                "member": member, "static_id": s.static_id, "thread": s.thread, "pid": s.pid,
                "member_id": s.member_id, "generation": s.generation,
                "leader": s.leader and age < STALE_AFTER_MS,
                "active": list(s.active), "restoring": list(s.restoring),
                "learners": dict(sorted(s.learners.items())),
                "standbys": dict(sorted(s.standbys.items())),
                "acceptable_lag": s.acceptable_lag, "leaving": s.leaving,
                "rebalances": s.rebalances, "processed": s.processed,
                "restored_records": s.restored_records, "updated_ms": s.updated_ms,
                "seen_ms": entry.at_ms, "age_ms": age, "stale": age >= STALE_AFTER_MS,
            })
        leaders = sorted((e.at_ms, m) for m, e in members.items()
                         if e.status.leader and now_ms - e.at_ms < STALE_AFTER_MS)
        held = self._copies_by_task(members, instance_of, now_ms)
        tasks = [self._task_view(task, members, instance_of, held.get(task, {}))
                 for task in sorted(self._known, key=task_order)]
        timeline = [self._event_view(e, now_ms) for e in self._events
                    if now_ms - e.at_ms <= window]
        open_spans: dict[str, list[tuple[str, str, int, int, bool]]] = {}
        for (task, member, role), since in self._open.items():
            open_spans.setdefault(task, []).append((member, role, since, now_ms, True))
        lanes = [{"task": task, "spans": self._lane(task, open_spans.get(task, []), instance_of,
                                                    now_ms - window)}
                 for task in sorted(self._known, key=task_order)]
        return {
            "app": self.app,
            "now_ms": now_ms,
            "window_ms": window,
            "leader": leaders[-1][1] if leaders else None,
            "generation": max((e.status.generation for e in members.values()), default=None),
            "instances": list(instances.values()),
            "tasks": tasks,
            "leaving": [leaving[i] for i in sorted(leaving)],
            "timeline": timeline,
            "lanes": lanes,
            "unreadable_records": self.unreadable,
            "last_error": self.last_error,
            "derived": DERIVED,
            "topology": None if self.topology is None else {
                "instance_id": self.topology.instance_id,
                "published_ms": self.topology.published_ms},
        }

    def _copies_by_task(self, members: dict[str, _Member], instance_of: dict[str, str],
                        now_ms: int) -> dict[str, dict[str, Any]]:
        """Per task, its learners, standbys and restoring member: one pass over members."""
        out: dict[str, dict[str, Any]] = {}

        def progress(lag: int | None, peak: int | None) -> float | None:
            if lag is None or peak is None:
                return None
            return 1.0 if peak <= 0 else round(max(0.0, 1 - lag / peak), 4)

        for member, entry in sorted(members.items()):
            s = entry.status
            stale = now_ms - entry.at_ms >= STALE_AFTER_MS
            for role, copies in (("learner", s.learners), ("standby", s.standbys)):
                for task, lag in copies.items():
                    key = (task, member, role)
                    peak = self._peak.get(key, lag)
                    pace = self._pace.get(key, (0, 0, None))[2]
                    out.setdefault(task, {}).setdefault(f"{role}s", []).append({
                        "member": member, "instance": instance_of[member], "role": role,
                        "lag": lag, "acceptable_lag": s.acceptable_lag, "peak_lag": peak,
                        "progress": progress(lag, peak), "isLearner": role == "learner",
                        "isReady": lag <= s.acceptable_lag, "stale": stale,
                        "catch_up_per_s": None if pace is None else round(pace, 1),
                        "ready_in_ms": self._eta_ms(key, lag - s.acceptable_lag),
                    })
            for task in s.restoring:
                lag = (s.restoring_lag or {}).get(task)
                key = (task, member, "restoring")
                out.setdefault(task, {})["restoring"] = {
                    "member": member, "instance": instance_of[member], "lag": lag,
                    "progress": progress(lag, self._peak.get(key, lag)),
                    "done_in_ms": self._eta_ms(key, lag),
                }
        return out

    def _task_view(self, task: str, members: dict[str, _Member], instance_of: dict[str, str],
                   held: dict[str, Any]) -> dict[str, Any]:
        learners = held.get("learners", [])
        standbys = held.get("standbys", [])
        restoring = held.get("restoring")
        active = self._owner.get(task)
        released = self._released.get(task) if active is None else None
        # Every new active task is restoring a moment, a stateless one too: the members'
        # list of stateful tasks, once one sends it, says which are.
        stateful: bool | None = (task in self._listed_stateful
                                 if self._listed_stateful is not None
                                 else True if task in self._stateful else None)
        owner = members.get(active) if active else None
        being_learned = bool(learners) or bool(
            owner and task in (owner.status.being_learned or ()))
        return {
            "task": task,
            "active": active,
            "active_instance": instance_of.get(active) if active else None,
            "active_since_ms": self._active_since.get(task, {}).get(active) if active else None,
            "unassigned_since_ms": released.at_ms if released else None,
            "previous_active": released.member if released else None,
            "restoring": restoring,
            "learners": learners,
            "standbys": standbys,
            "isStateful": stateful,
            "beingLearned": being_learned,
            "dropped": dict((owner.status.dropped or {}).get(task, {})) if owner else {},
            "misrouted": (owner.status.misrouted or {}).get(task, 0) if owner else 0,
            "tags": [t for t, on in (("isStateful", stateful), ("beingLearned", being_learned))
                     if on],
        }

    def _lane(self, task: str, open_spans: list[tuple[str, str, int, int, bool]],
              instance_of: dict[str, str], start: int) -> list[dict[str, Any]]:
        """Who held ``task`` in which role between ``start`` and now: closed spans, then
        open ones (ending now), each clipped to the window."""
        spans = [(*s, False) for s in self._spans.get(task, ()) if s[3] >= start]
        spans += open_spans
        return [{"member": m, "instance": instance_of.get(m, member_instance(m)),
                 "role": r, "start_ms": max(a, start), "end_ms": b, "open": is_open}
                for m, r, a, b, is_open in sorted(spans, key=lambda s: (s[2], s[1]))]

    def _leaving(self, now_ms: int) -> dict[str, dict[str, Any]]:
        """Leaving instances by id: from their marks, and from members publishing the flag."""
        out: dict[str, dict[str, Any]] = {}
        for instance, (mark, at) in self._marks.items():
            out[instance] = {"instance": instance, "since_ms": mark.since_ms,
                             "timeout_ms": mark.scale_down_timeout_ms, "marked_ms": at,
                             "source": "mark"}
        for entry in self._members.values():
            s = entry.status
            if not s.leaving and s.instance_id not in out:
                continue
            item = out.setdefault(s.instance_id, {
                "instance": s.instance_id, "since_ms": s.leaving_since_ms, "timeout_ms": None,
                "marked_ms": None, "source": "status",
            })
            if item["since_ms"] is None:
                item["since_ms"] = s.leaving_since_ms
            if s.leaving_deadline_ms is not None:
                item["deadline_ms"] = s.leaving_deadline_ms
            item["acknowledged"] = item.get("acknowledged", False) or s.leaving
            item["members"] = item.get("members", 0) + 1
        for item in out.values():
            if "deadline_ms" not in item:
                item["deadline_ms"] = (item["since_ms"] + item["timeout_ms"]
                                       if item["since_ms"] is not None
                                       and item["timeout_ms"] is not None else None)
            item.setdefault("acknowledged", False)
            # handing over: its members publish the flag; marked: they have not picked the
            # mark up yet; gone: none of its members publishes (it left, or died)
            item["state"] = ("handing over" if item["acknowledged"]
                             else "marked" if item.pop("members", 0) else "gone")
            item.pop("members", None)
            item["remaining_ms"] = (None if item["deadline_ms"] is None
                                    else item["deadline_ms"] - now_ms)
        return out

    @staticmethod
    def _event_view(event: Event, now_ms: int) -> dict[str, Any]:
        return {"at_ms": event.at_ms, "ago_ms": now_ms - event.at_ms, "kind": event.kind,
                "text": event.text, "task": event.task, "members": list(event.members),
                "cause": event.cause, "gap_ms": event.gap_ms, "generation": event.generation}


def group_view(app: str, records: Iterable[StatusRecord | MarkRecord], now_ms: int,
               window_ms: int = DEFAULT_WINDOW_MS) -> dict[str, Any]:
    """The view after ``records`` (in arrival order), as seen at ``now_ms``."""
    model = GroupModel(app, window_ms)
    for record in records:
        model.apply(record)
    return model.view(now_ms)
