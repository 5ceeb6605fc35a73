"""The members a crashed run of this process left in the group, removed when it restarts.

A member that crashes stays in the group until its session times out. A round started in the
meantime (the restart itself starts one) waits for it, so the crashed member's tasks stay
stopped for the whole session timeout and a round more; on a broker that keeps such a member
as the round's leader, for further rounds after that.

A restarted process knows better than the broker that its predecessor is gone. Each stream
thread keeps its member id in a small file of the state directory and holds a lock on that
file while it runs; the kernel drops the lock when the process dies, however it dies. So a
process that starts, finds such a file unlocked and a member id in it, knows that member is
dead and removes it from the group with LeaveGroup before its own threads join. The crashed
member's tasks then move in the restart's round instead of after the session timeout.

A static member that the restart takes over (the same ``<instance>-thread-<n>``) is never
removed: the broker gives its place to the restart without a round, which is what static
membership is for. A thread that stops cleanly clears its file (it left the group, or as a
static member means to come back).

:func:`stale_members` and :func:`eviction_step` are the decisions over plain data;
:class:`MemberFiles` and :func:`evict_predecessors` are the shell around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from aiokafka.client import AIOKafkaClient

from streams.kafka.membership import describe_group, leave_group

log = logging.getLogger(__name__)

#: Where in ``<state_dir>/<application_id>`` the member files live.
MEMBERS_DIRECTORY = ".members"

#: A group that is not rebalancing, in DescribeGroups' words.
STABLE = "Stable"

#: How often the group's state is asked for while it rebalances.
POLL_S = 0.5


class StateDirectoryInUse(RuntimeError):
    """Another live process runs the app from this state directory: its stores and member
    files would be shared, and the second process fail on the first store they both open."""


@dataclass(frozen=True)
class MemberRecord:
    """What a thread of an earlier run left: its member id and, when static, its group
    instance id."""

    member_id: str
    static_id: str | None
    pid: int


def stale_members(records: Iterable[MemberRecord], own_static_ids: Iterable[str],
                  ) -> list[tuple[str, str | None]]:
    """``(member_id, static_id)`` of the earlier run's members to remove: every one with a
    member id, except the static members this run takes over, once each."""
    own = set(own_static_ids)
    seen: set[str] = set()
    out: list[tuple[str, str | None]] = []
    for record in records:
        if not record.member_id or record.member_id in seen or record.static_id in own:
            continue
        seen.add(record.member_id)
        out.append((record.member_id, record.static_id))
    return out


class Step(enum.Enum):
    EVICT = "evict"
    WAIT = "wait for the group to form"
    DONE = "nothing to do"


def eviction_step(state: str, listed: Iterable[str], stale: Iterable[tuple[str, str | None]],
                  leave_from_formed_group: bool, waited_s: float, limit_s: float,
                  maybe_leaders: Iterable[str] = (),
                  ) -> tuple[Step, list[tuple[str, str | None]]]:
    """What to do about the stale members given the group's state and the member ids the
    broker lists.

    Members the broker no longer lists are gone already. Under the leader-wedge quirk a
    broker keeps a member that leaves mid-round as the round's leader (see
    :mod:`streams.quirks.formed_group`). So while the group rebalances, a stale member that may
    have been the leader (``maybe_leaders``: its last status said so, or it left none) is
    removed only once the group has formed, waiting up to ``limit_s``; after that the
    session timeout has done the work anyway. Followers are removed mid-round too: a round
    that waits for a dead follower is the very stall this removal ends (a crash during
    another crash's round)."""
    present = set(listed)
    targets = [(m, s) for m, s in stale if m in present]
    if not targets:
        return Step.DONE, []
    leaders = set(maybe_leaders)
    if leave_from_formed_group and state != STABLE and any(m in leaders for m, _ in targets):
        return (Step.WAIT, targets) if waited_s < limit_s else (Step.DONE, [])
    return Step.EVICT, targets


def possible_leaders(stale: Iterable[tuple[str, str | None]],
                     statuses: Iterable[dict[str, object]]) -> set[str]:
    """The stale member ids whose last status record says they led the group, or that left
    no record to tell."""
    known: dict[str, bool] = {}
    for status in statuses:
        member = status.get("member_id")
        if isinstance(member, str) and member:
            known[member] = known.get(member, False) or bool(status.get("leader"))
    return {m for m, _ in stale if known.get(m, True)}


class MemberFiles:
    """This run's member files, one per stream thread, locked while the process lives."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[int, int] = {}
        #: What earlier runs left in files this run could lock.
        self.predecessors: list[MemberRecord] = []

    @classmethod
    def claim(cls, state_dir: Path, application_id: str, threads: int) -> MemberFiles:
        """Lock a file for each of ``threads`` threads and read what earlier, now dead, runs
        left in every unlocked file (files of threads this run does not have included, which
        are then removed). A file a live process holds is left alone, unless it is one of this
        run's own: then another live process runs the app from this state directory, and
        :class:`StateDirectoryInUse` is raised with nothing claimed. A file that cannot be
        made or read is logged and skipped: the session timeout then does the work."""
        files = cls(Path(state_dir) / application_id / MEMBERS_DIRECTORY)
        try:
            files.directory.mkdir(parents=True, exist_ok=True)
            names = {p.name for p in files.directory.iterdir() if p.suffix == ".json"}
        except OSError as exc:
            log.warning("member files under %s unusable (%s); a crashed earlier run's members "
                        "will leave the group when their sessions time out", files.directory, exc)
            return files
        names |= {_file_name(i) for i in range(threads)}
        for name in sorted(names):
            index = _index_of(name)
            fd = files._lock(name)
            if fd is None:
                if index is not None and index < threads and files._held(name):
                    files.release()
                    raise StateDirectoryInUse(
                        f"another live process{files._holder(name)} runs application "
                        f"{application_id!r} from state_dir {str(state_dir)!r}: give each "
                        f"process on one host its own state_dir (RELAY_STATE_DIR)")
                continue
            # Locked by nobody: whoever wrote it is dead, whatever its pid (a restarted
            # container often runs under the same one).
            record = _read(fd)
            if record is not None:
                files.predecessors.append(record)
            if index is not None and index < threads:
                files._fds[index] = fd
                _write(fd, None)
            else:
                os.close(fd)
                with contextlib.suppress(OSError):
                    (files.directory / name).unlink()
        return files

    @classmethod
    def live_holder(cls, state_dir: Path, application_id: str) -> str | None:
        """Who runs ``application_id`` from ``state_dir`` now (``"a live process (pid N)"``),
        or None when no live process holds any of its member files."""
        files = cls(Path(state_dir) / application_id / MEMBERS_DIRECTORY)
        try:
            names = sorted(p.name for p in files.directory.iterdir() if p.suffix == ".json")
        except OSError:
            return None
        for name in names:
            if files._held(name):
                return f"a live process{files._holder(name)}"
        return None

    def _lock(self, name: str) -> int | None:
        try:
            fd = os.open(self.directory / name, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            log.warning("cannot open member file %s: %s", self.directory / name, exc)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            # A live process holds it: not a predecessor (two processes on one state
            # directory are refused by the stores' own locks).
            os.close(fd)
            return None
        return fd

    def _held(self, name: str) -> bool:
        """Whether a live process holds the lock of member file ``name`` (rather than the
        file being unusable)."""
        try:
            fd = os.open(self.directory / name, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
        return False

    def _holder(self, name: str) -> str:
        """`` (pid N)`` when the file names the process holding it, else nothing."""
        try:
            data = json.loads((self.directory / name).read_bytes() or b"{}")
            pid = data.get("pid") if isinstance(data, dict) else None
        except (OSError, ValueError):
            return ""
        return f" (pid {pid})" if isinstance(pid, int) else ""

    def record(self, index: int, member_id: str, static_id: str | None) -> None:
        """Thread ``index`` is now member ``member_id`` of the group."""
        fd = self._fds.get(index)
        if fd is not None:
            _write(fd, MemberRecord(member_id, static_id, os.getpid()))

    def clear(self, index: int) -> None:
        """Thread ``index`` stopped cleanly: nothing to remove after it."""
        fd = self._fds.get(index)
        if fd is not None:
            _write(fd, None)

    def release(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


async def evict_predecessors(
    client: AIOKafkaClient, group: str, stale: list[tuple[str, str | None]],
    leave_from_formed_group: bool, limit_s: float, maybe_leaders: Iterable[str] = (),
) -> list[str]:
    """Remove ``stale`` members from ``group``; returns the member ids removed. Errors are
    logged, never raised: the session timeout is the fallback."""
    if not stale:
        return []
    started = time.monotonic()
    try:
        while True:
            described = await describe_group(client, group)
            step, targets = eviction_step(
                described.state, (m.member_id for m in described.members), stale,
                leave_from_formed_group, time.monotonic() - started, limit_s, maybe_leaders)
            if step is Step.DONE:
                return []
            if step is Step.EVICT:
                break
            await asyncio.sleep(POLL_S)
        answers = await leave_group(client, group, targets)
    except Exception as exc:
        log.warning("could not remove the members a crashed earlier run left in group %s "
                    "(%s: %s); they leave when their sessions time out",
                    group, type(exc).__name__, exc)
        return []
    removed = [m for m, s in targets if answers.get(s or m) is None]
    log.warning("removed %d member(s) a crashed earlier run of this process left in group %s, "
                "instead of waiting for their sessions to time out: %s", len(removed), group,
                ", ".join(f"{m} ({answers.get(s or m) or 'removed'})" for m, s in targets))
    return removed


def _file_name(index: int) -> str:
    return f"thread-{index}.json"


def _index_of(name: str) -> int | None:
    stem = name.removesuffix(".json")
    prefix = "thread-"
    if stem.startswith(prefix) and stem[len(prefix):].isdigit():
        return int(stem[len(prefix):])
    return None


def _read(fd: int) -> MemberRecord | None:
    try:
        raw = os.pread(fd, 4096, 0)
        if not raw.strip():
            return None
        data = json.loads(raw)
        member_id, static_id, pid = data["member_id"], data.get("static_id"), data["pid"]
        if (not isinstance(member_id, str) or not isinstance(pid, int)
                or not (static_id is None or isinstance(static_id, str))):
            raise ValueError(f"unexpected fields {sorted(data)!r}")
        return MemberRecord(member_id, static_id, pid)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring an unreadable member file (%s)", exc)
        return None


def _write(fd: int, record: MemberRecord | None) -> None:
    payload = b"" if record is None else json.dumps(
        {"member_id": record.member_id, "static_id": record.static_id,
         "pid": record.pid}).encode()
    try:
        os.ftruncate(fd, 0)
        if payload:
            os.pwrite(fd, payload, 0)
    except OSError as exc:
        log.warning("cannot write a member file (%s); if this process crashes, its members "
                    "leave the group when their sessions time out", exc)
