"""The unit tier's guard: a test under tests/unit fails if it opens a socket to anything but a
server of its own process (or looks a host name up), starts a process, or sleeps for real.

Which tier a test goes to: a test that needs a broker (the ``bootstrap`` fixture, the embedded
broker), another process (a worker, the CLI in a subprocess, a JVM, Spark, a browser) or the
wall clock (waiting out a timeout, a retry) goes to ``tests/broker/<area>/``; everything else,
the fakes in ``tests/unit/streams/fakes.py``, the topology test driver, hypothesis and in-process
HTTP servers included, goes to ``tests/unit/<area>/``. When one file holds both kinds, it is
split by test into a file of the same name in each tier. ``make test-fast`` runs this tier;
the guard below keeps it honest.

"Sleeping for real" is the event loop sitting idle on a timer for more than
:data:`SLEEP_LIMIT_S` (an ``asyncio.sleep``, a ``wait_for`` that times out), a blocking
``time.sleep`` that long, or a fixed ``asyncio.sleep`` that long in a test's own code: wait on
a condition (``wait_until`` in tests/conftest.py) instead.
"""

from __future__ import annotations

import asyncio
import ipaddress
import multiprocessing.util
import os
import selectors
import socket
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

#: The longest real sleep a unit test may take, in seconds.
SLEEP_LIMIT_S = 0.01
_LOOPBACK = ("127.", "::1", "localhost")
#: Loopback ports this process bound (its servers, and ports it holds or held to stand for an
#: endpoint that does not answer): a unit test may connect to those, its in-process fakes.
_own_ports: set[int] = set()


class UnitTierViolation(RuntimeError):
    """A unit test reached for a broker, a process or the clock."""


class NotAFake(ConnectionRefusedError):
    """A connection the guard refused: the code under test sees a refused connection, and the
    test fails at its end."""


def _numeric(host: str) -> bool:
    """Whether ``host`` is an address, which needs no name server."""
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return True


def _project_frames(skip: int) -> str:
    frames = [f for f in traceback.extract_stack()[:-skip]
              if "/lib/python" not in f.filename and f.filename != __file__]
    return " < ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in frames[::-1][:3])


def _task_place(handle: asyncio.TimerHandle | None) -> str:
    """Where the task that a timer will wake waits: file:line of its innermost frames."""
    for arg in getattr(handle, "_args", None) or ():
        if not isinstance(arg, asyncio.Future):
            continue
        for callback, _ in getattr(arg, "_callbacks", None) or []:
            task = getattr(callback, "__self__", None)
            if isinstance(task, asyncio.Task):
                places = []
                coro: Any = task.get_coro()
                while coro is not None:
                    frame = getattr(coro, "cr_frame", None)
                    if frame is not None and "/lib/python" not in frame.f_code.co_filename:
                        name = frame.f_code.co_filename.rsplit("/", 1)[-1]
                        places.append(f"{name}:{frame.f_lineno}")
                    coro = getattr(coro, "cr_await", None)
                return " > ".join(places[-3:])
    return repr(handle)[:100]


class Guard:
    """The patches of one test phase, and what they caught."""

    def __init__(self, sleep_limit_s: float = SLEEP_LIMIT_S) -> None:
        self.sleep_limit_s = sleep_limit_s
        self.violations: list[str] = []
        self._saved: list[tuple[Any, str, Any]] = []

    def caught(self, what: str) -> None:
        self.violations.append(what)

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def restore(self) -> None:
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)

    def install(self) -> None:
        self._guard_sockets()
        self._guard_processes()
        self._guard_sleeps()

    def _guard_sockets(self) -> None:
        real_bind, real_getaddrinfo = socket.socket.bind, socket.getaddrinfo
        real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

        def bind(sock: socket.socket, address: Any) -> None:
            real_bind(sock, address)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                _own_ports.add(sock.getsockname()[1])

        def check(sock: socket.socket, address: Any) -> None:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                return
            host, port = str(address[0]), address[1]
            if host.startswith(_LOOPBACK) and port in _own_ports:
                return
            self.caught(f"a connection to {address} (not a server of this process) at "
                        f"{_project_frames(3)}")
            raise NotAFake(f"unit tier: no connection to {address}")

        def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
            name = host.decode() if isinstance(host, bytes) else host
            if name is not None and name != "localhost" and not _numeric(name):
                self.caught(f"a look-up of {name!r} (a name server, not a fake) at "
                            f"{_project_frames(2)}")
                raise NotAFake(f"unit tier: no name look-up of {name!r}")
            return real_getaddrinfo(host, *args, **kwargs)

        def connect(sock: socket.socket, address: Any) -> None:
            check(sock, address)
            return real_connect(sock, address)

        def connect_ex(sock: socket.socket, address: Any) -> int:
            check(sock, address)
            return real_connect_ex(sock, address)

        self._patch(socket.socket, "bind", bind)
        self._patch(socket, "getaddrinfo", getaddrinfo)
        self._patch(socket.socket, "connect", connect)
        self._patch(socket.socket, "connect_ex", connect_ex)

    def _guard_processes(self) -> None:
        def refuse(name: str) -> Callable[..., Any]:
            def no_process(*args: Any, **kwargs: Any) -> Any:
                self.caught(f"a process started ({name}) at {_project_frames(2)}")
                raise UnitTierViolation("unit tier: no processes (see tests/unit/conftest.py)")
            return no_process

        self._patch(subprocess.Popen, "__init__", refuse("subprocess"))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            self._patch(os, name, refuse(f"os.{name}"))
        self._patch(multiprocessing.util, "spawnv_passfds", refuse("multiprocessing"))

    def _guard_sleeps(self) -> None:
        real_sleep, real_async_sleep = time.sleep, asyncio.sleep
        real_select = selectors.DefaultSelector.select

        def sleep(seconds: float) -> None:
            if seconds > self.sleep_limit_s:
                place = _project_frames(2)
                # A library's own thread sleeping (the session-wide Spark that broker tests
                # run in the same worker keeps some) is no test waiting.
                if place or threading.current_thread() is threading.main_thread():
                    self.caught(f"time.sleep({seconds}) at {place}")
            real_sleep(seconds)

        async def async_sleep(delay: float, result: Any = None) -> Any:
            caller = traceback.extract_stack(limit=2)[0]
            if (delay > self.sleep_limit_s and "/tests/" in caller.filename
                    and caller.name != "wait_until"):
                self.caught(f"a fixed asyncio.sleep({delay}) at {_project_frames(2)}")
            return await real_async_sleep(delay, result)

        def select(selector: selectors.BaseSelector, timeout: float | None = None) -> Any:
            loop: Any = asyncio.events._get_running_loop()
            timer = loop._scheduled[0] if loop is not None and loop._scheduled else None
            started = time.monotonic()
            events = real_select(selector, timeout)  # type: ignore[arg-type]
            waited = time.monotonic() - started
            if (not events and timeout is not None and min(timeout, waited) > self.sleep_limit_s
                    and threading.current_thread() is threading.main_thread()):
                self.caught(f"the event loop sat idle {waited * 1000:.0f} ms on a timer "
                            f"({_task_place(timer)})")
            return events

        self._patch(time, "sleep", sleep)
        self._patch(asyncio, "sleep", async_sleep)
        self._patch(selectors.DefaultSelector, "select", select)


def _guarded() -> Iterator[None]:
    guard = Guard()
    guard.install()
    try:
        yield
    finally:
        guard.restore()
    if guard.violations:
        shown = sorted(set(guard.violations))
        raise UnitTierViolation(
            f"{len(guard.violations)} unit-tier violation(s) (see tests/unit/conftest.py):\n  "
            + "\n  ".join(shown[:8]))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if nextitem is None:
        # The run's last test: its teardown also ends the session's fixtures, which broker
        # tests of the same run may have set up (a Spark session, say).
        return (yield)
    return (yield from _guarded())
