"""Interactive queries of a process's own stores: ``app.store("counts").get(key)``.

A key lives in one task: the partition the runtime's producer (aiokafka's default murmur2
partitioner) sends it to, hashed from the key as the store's sub-topology reads it from its
source topic. :class:`StoreLayout` computes that task from plain data; the choice of which
local copy may answer (:func:`choose_copy`) is a pure decision over what the threads hold.

What a read guarantees:

- It reads **committed** state: the database as of the store's last commit (a copy: the last
  changelog batch it applied), never the writes buffered since. A commit is what the
  changelog vouches for, so a read never shows a value a crash could take back; it trails
  the processing by up to one ``commit_interval_ms``.
- By default only a running active answers. A standby or learner copy answers only when the
  caller passes ``allow_standby=True``, and the answer carries its changelog lag.
- A key whose task is not here, restoring, or between owners raises
  :class:`StoreUnavailable` (retry later, or ask the owner), never an older value.

Reads run on the app's event loop, between two steps of the stream threads (which run on the
same loop), and do not await: a read never sees half a commit, and no store closes under it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statestore.serdes import SerdeError
from streams.queries.store_layout import StoreKeyError, StoreLayout, store_layouts
from streams.runtime.lifecycle import ThreadState
from streams.runtime.state_updater import UNKNOWN_LAG
from streams.runtime.transitions import Role

if TYPE_CHECKING:
    from statestore.store import KeyValueStore
    from streams.dsl.global_tables import GlobalTable
    from streams.runtime.thread import StreamThread

#: The latest time a window fetch reaches when not told (ms; a session store's bound).
TIME_MAX = (1 << 62) - 1
#: A range read returns at most this many entries unless told otherwise.
DEFAULT_RANGE_LIMIT = 1_000
#: The task and the role a global table's readings name: every process holds all of it.
GLOBAL = "global"


class UnknownStoreError(KeyError):
    """The app declares no store of that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown store"


class StoreUnavailable(Exception):
    """The key's state cannot be read here right now; retry (or ask its owner).

    ``reason``: ``not_local`` (no copy of the task here), ``standby_only`` (only a copy,
    and the caller did not allow reading one), ``restoring`` (the task's state is being
    restored, or a copy's lag is not known yet), ``moving`` (the task is changing hands or
    the app is stopping), ``too_far_behind`` (a copy above ``max_lag``), ``not_running``.
    """

    def __init__(self, store: str, task: str | None, reason: str, message: str,
                 retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.store = store
        self.task = task
        self.reason = reason
        self.retry_after_s = retry_after_s


# -- which local copy answers ---------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """One local thread's hold on a task: its role there, the copy's lag, and whether the
    thread is in a state to serve it (running, or rebalancing with the task kept)."""

    task: str
    thread: str
    role: str  # "active", "restoring", "standby", "learner"
    lag: int | None = 0
    serving: bool = True


def choose_copy(store: str, task: str, holdings: Sequence[Holding], allow_standby: bool,
                max_lag: int | None = None) -> Holding:
    """The copy that answers for ``task``: a serving active, else (when allowed) the copy
    with the smallest known lag. Raises :class:`StoreUnavailable` saying why none can."""
    mine = [h for h in holdings if h.task == task]
    for holding in mine:
        if holding.role == "active" and holding.serving:
            return holding
    if any(h.role == "restoring" for h in mine):
        raise StoreUnavailable(store, task, "restoring",
                               f"task {task} of store {store} is restoring its state here; "
                               f"retry")
    if any(h.role == "active" for h in mine):
        raise StoreUnavailable(store, task, "moving",
                               f"task {task} of store {store} is changing hands here; retry")
    copies = [h for h in mine if h.role in ("standby", "learner") and h.serving]
    if not copies:
        raise StoreUnavailable(store, task, "not_local",
                               f"task {task} of store {store} is not held by this process; "
                               f"ask its owner (GET /stores/{store}/<key> on any worker)")
    if not allow_standby:
        raise StoreUnavailable(store, task, "standby_only",
                               f"this process holds only a {copies[0].role} copy of task "
                               f"{task} (lag {copies[0].lag}); pass allow_standby=True to "
                               f"read it, or ask its owner")
    known = [h for h in copies if h.lag is not None]
    if not known:
        raise StoreUnavailable(store, task, "restoring",
                               f"the copy of task {task} has no known lag yet; retry")
    best = min(known, key=lambda h: (h.lag, h.role != "standby"))
    if max_lag is not None and best.lag is not None and best.lag > max_lag:
        raise StoreUnavailable(store, task, "too_far_behind",
                               f"the local copy of task {task} is {best.lag} records behind "
                               f"(max_lag {max_lag}); retry")
    return best


# -- readings -------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyReading:
    """One key read from a local copy: its value (None when absent), which task and copy
    answered, and how far that copy trails the changelog (0 for the active)."""

    store: str
    key: Any
    value: Any
    found: bool
    task: str
    role: str
    lag: int | None
    thread: str

    def to_json(self) -> dict[str, Any]:
        return {"store": self.store, "key": self.key, "value": self.value,
                "found": self.found, "task": self.task, "role": self.role, "lag": self.lag,
                "thread": self.thread}


@dataclass(frozen=True)
class WindowsReading:
    """A key's windows (or sessions) read from one local copy, oldest first: each
    ``{"start": ms, "value": ...}`` (a session's with its ``"end"`` too)."""

    store: str
    key: Any
    windows: list[dict[str, Any]]
    task: str
    role: str
    lag: int | None
    thread: str
    truncated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"store": self.store, "key": self.key, "windows": self.windows,
                "truncated": self.truncated, "task": self.task, "role": self.role,
                "lag": self.lag, "thread": self.thread}


@dataclass(frozen=True)
class RangeReading:
    """Entries of a range read from the local copies, in key order, with the copy that
    answered for each task, and the store's tasks this process could not read (their keys
    are missing from ``entries``)."""

    store: str
    entries: list[tuple[Any, Any]]
    tasks: dict[str, Holding]
    unavailable: dict[str, str] = field(default_factory=dict)
    truncated: bool = False


class LocalStores:
    """What the process's stream threads hold, for queries: the layouts of the app's stores
    and, per task, each thread's copy."""

    def __init__(self, threads: Callable[[], Sequence[StreamThread]],
                 global_tables: Callable[[], Sequence[GlobalTable]] = lambda: ()) -> None:
        self._threads = threads
        self._global_tables = global_tables
        self._layouts: dict[str, StoreLayout] | None = None

    def global_stores(self) -> list[str]:
        """The stores of the app's global tables."""
        return [t.store for t in self._global_tables()]

    def global_table(self, store: str) -> GlobalTable | None:
        """The global table kept in ``store``, if it is one."""
        return next((t for t in self._global_tables() if t.store == store), None)

    def layouts(self) -> dict[str, StoreLayout]:
        threads = self._threads()
        if self._layouts is None and threads:
            self._layouts = store_layouts(threads[0].layout.subs)
        return self._layouts or {}

    def holdings(self, task: str) -> list[Holding]:
        found: list[Holding] = []
        for thread in self._threads():
            found.extend(thread_holdings(thread, task))
        return found

    def store_of(self, holding: Holding, store: str) -> KeyValueStore | None:
        for thread in self._threads():
            if thread.status_key.decode() != holding.thread:
                continue
            registry = thread.registry
            if holding.role == "active":
                task = registry.active.get(holding.task)
                return None if task is None else task.stores.get(store)
            return registry.copies.get(holding.task, {}).get(store)
        return None


def thread_holdings(thread: StreamThread, task: str) -> list[Holding]:
    """The thread's hold on ``task`` (none, or one)."""
    registry = thread.registry
    label = thread.status_key.decode()
    # A kept active serves through a cooperative round (its state does not change then); a
    # stopping thread's tasks are about to close.
    serving = thread.state in (ThreadState.RUNNING, ThreadState.REBALANCING)
    if task in registry.active:
        return [Holding(task, label, "active", 0, serving)]
    if task in registry.restoring:
        return [Holding(task, label, "restoring", None, False)]
    role = registry.copy_roles.get(task)
    if role is None:
        return []
    lag = thread.state_updater.copy_lag(task)
    return [Holding(task, label, "standby" if role is Role.STANDBY else "learner",
                    None if lag >= UNKNOWN_LAG else lag, serving)]


class StoreQuery:
    """``app.store(name)``: reads of one store's committed state held by this process."""

    def __init__(self, name: str, local: LocalStores) -> None:
        self.name = name
        self._local = local

    @property
    def layout(self) -> StoreLayout:
        layout = self._local.layouts().get(self.name)
        if layout is None:
            raise StoreUnavailable(self.name, None, "not_running",
                                   f"store {self.name}: the app is not running yet; retry")
        return layout

    def task_of(self, key: Any) -> str:
        """The task that holds ``key``."""
        return self.layout.task_of(key)

    def get(self, key: Any, default: Any = None, *, allow_standby: bool = False,
            max_lag: int | None = None) -> Any:
        """The committed value of ``key``, else ``default``. Raises
        :class:`StoreUnavailable` when no local copy may answer (see :meth:`read`)."""
        reading = self.read(key, allow_standby=allow_standby, max_lag=max_lag)
        return reading.value if reading.found else default

    def read(self, key: Any, *, allow_standby: bool = False,
             max_lag: int | None = None) -> KeyReading:
        """The committed value of ``key`` with the copy that answered and its lag."""
        layout = self.layout
        store_key = layout.store_key(key)
        task = layout.task_of(key)
        holding = choose_copy(self.name, task, self._local.holdings(task), allow_standby,
                              max_lag)
        store = self._open_store(holding)
        sentinel = object()
        try:
            value = store.get_committed(store_key, sentinel)
        except SerdeError as exc:
            raise StoreKeyError(f"store {self.name}: cannot encode key {key!r}: {exc}") \
                from None
        found = value is not sentinel
        return KeyReading(self.name, key, value if found else None, found, task,
                          holding.role, holding.lag, holding.thread)

    def fetch(self, key: Any, time_from: int | None = None, time_to: int | None = None, *,
              allow_standby: bool = False, max_lag: int | None = None,
              limit: int = DEFAULT_RANGE_LIMIT) -> WindowsReading:
        """A windowed store's windows of the record key ``key`` that start from
        ``time_from`` to ``time_to`` (both included; None: no bound), as Kafka Streams'
        ``WindowStore.fetch``; a session store's sessions of ``key`` that end at or after
        ``time_from`` and start at or before ``time_to`` (``SessionStore.fetch``). Oldest
        first (sessions: by end), at most ``limit``; from the one task that holds the key."""
        layout = self.layout
        if not (layout.windowed or layout.sessions):
            raise StoreKeyError(f"store {self.name} is neither windowed nor of sessions: read "
                                f"its keys one by one")
        if limit < 1:
            raise ValueError(f"limit must be >= 1, not {limit}")
        low = 0 if time_from is None else time_from
        high = TIME_MAX if time_to is None else time_to
        task = layout.task_of(key, record_key_given=True)
        holding = choose_copy(self.name, task, self._local.holdings(task), allow_standby,
                              max_lag)
        store = self._open_store(holding)
        windows: list[dict[str, Any]] = []
        truncated = False
        try:
            if layout.sessions:
                # Keyed (key, end, start): sessions ending from ``low`` on, in end order.
                for (_, end, start), value in store.range_committed((key, low),
                                                                   (key, TIME_MAX + 1)):
                    if start > high:
                        continue
                    if len(windows) >= limit:
                        truncated = True
                        break
                    windows.append({"start": start, "end": end, "value": value})
            else:
                for (_, start), value in store.range_committed((key, low), (key, high + 1)):
                    if len(windows) >= limit:
                        truncated = True
                        break
                    windows.append({"start": start, "value": value})
        except SerdeError as exc:
            raise StoreKeyError(f"store {self.name}: cannot encode key {key!r}: {exc}") \
                from None
        return WindowsReading(self.name, key, windows, task, holding.role, holding.lag,
                              holding.thread, truncated)

    def range(self, start: Any = None, end: Any = None, *, allow_standby: bool = False,
              max_lag: int | None = None, limit: int = DEFAULT_RANGE_LIMIT) -> RangeReading:
        """Committed entries with ``start <= key < end`` across the tasks this process can
        read, in key order, at most ``limit``. Keys are spread over every task by hash, so
        the tasks it could not read are listed in ``unavailable``."""
        layout = self.layout
        if limit < 1:
            raise ValueError(f"limit must be >= 1, not {limit}")
        lower = None if start is None else layout.store_key(start)
        upper = None if end is None else layout.store_key(end)
        tasks: dict[str, Holding] = {}
        unavailable: dict[str, str] = {}
        entries: list[tuple[bytes, tuple[Any, Any]]] = []
        truncated = False
        for partition in range(layout.partitions):
            task = f"{layout.sub_topology}_{partition}"
            try:
                holding = choose_copy(self.name, task, self._local.holdings(task),
                                      allow_standby, max_lag)
            except StoreUnavailable as exc:
                unavailable[task] = exc.reason
                continue
            tasks[task] = holding
            store = self._open_store(holding)
            dumps = store.spec.key_serde.dumps
            # Each task's entries are materialized now, without awaiting: no commit and no
            # close can come between (see the module's docstring).
            try:
                for n, entry in enumerate(store.range_committed(lower, upper)):
                    if n >= limit:
                        truncated = True
                        break
                    entries.append((dumps(entry[0]), entry))
            except SerdeError as exc:
                raise StoreKeyError(f"store {self.name}: cannot encode the range's bounds: "
                                    f"{exc}") from None
        # Merged in the order the store keeps its keys (its encoding's byte order).
        entries.sort(key=lambda item: item[0])
        if len(entries) > limit:
            truncated = True
            entries = entries[:limit]
        return RangeReading(self.name, [entry for _, entry in entries], tasks, unavailable,
                            truncated)

    def _open_store(self, holding: Holding) -> KeyValueStore:
        store = self._local.store_of(holding, self.name)
        if store is None or not store.is_open:
            raise StoreUnavailable(self.name, holding.task, "moving",
                                   f"task {holding.task}'s store {self.name} is not open "
                                   f"here right now; retry")
        return store


class GlobalStoreQuery:
    """``app.store(name)`` of a global table. Every process holds all of the table, so any
    process answers every key, from the table's committed state (committed every second).
    The keyword arguments of :class:`StoreQuery`'s reads are taken and have nothing to
    choose: there is one copy here, always complete."""

    def __init__(self, table: GlobalTable) -> None:
        self.name = table.store
        self._table = table

    def get(self, key: Any, default: Any = None, *, allow_standby: bool = False,
            max_lag: int | None = None) -> Any:
        reading = self.read(key)
        return reading.value if reading.found else default

    def read(self, key: Any, *, allow_standby: bool = False,
             max_lag: int | None = None) -> KeyReading:
        sentinel = object()
        try:
            value = self._store().get_committed(key, sentinel)
        except SerdeError as exc:
            raise StoreKeyError(f"store {self.name}: cannot encode key {key!r}: {exc}") \
                from None
        found = value is not sentinel
        return KeyReading(self.name, key, value if found else None, found, GLOBAL, GLOBAL,
                          0, GLOBAL)

    def range(self, start: Any = None, end: Any = None, *, allow_standby: bool = False,
              max_lag: int | None = None, limit: int = DEFAULT_RANGE_LIMIT) -> RangeReading:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, not {limit}")
        entries: list[tuple[Any, Any]] = []
        truncated = False
        try:
            for entry in self._store().range_committed(start, end):
                if len(entries) >= limit:
                    truncated = True
                    break
                entries.append(entry)
        except SerdeError as exc:
            raise StoreKeyError(f"store {self.name}: cannot encode the range's bounds: "
                                f"{exc}") from None
        return RangeReading(self.name, entries, {}, {}, truncated)

    def _store(self) -> KeyValueStore:
        store = self._table.opened
        if store is None or not store.is_open:
            raise StoreUnavailable(self.name, None, "not_running",
                                   f"global table {self.name} is not open here: the app is "
                                   f"not running yet, or still reading the table; retry")
        return store
