"""The unit tier's guard catches what it is there for: a connection to a port this process
never bound, a process started, a blocking sleep, and an event loop sitting idle on a timer.
Each runs under a second guard with a lower sleep limit than the tier's, so that what it
catches does not fail this test too."""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.unit.conftest import Guard, NotAFake, UnitTierViolation


@contextlib.contextmanager
def guarded() -> Iterator[Guard]:
    """A guard of its own, inside the test's (the tier's guard is set up and taken down for
    each phase of a test, so this one lives in the test's body)."""
    inner = Guard(sleep_limit_s=0.002)
    inner.install()
    try:
        yield inner
    finally:
        inner.restore()


def test_a_connection_to_a_port_of_another_process_is_refused_and_caught() -> None:
    with guarded() as guard:
        with socket.socket() as held:  # a port this process bound: its own fake may answer there
            held.bind(("127.0.0.1", 0))
            own = held.getsockname()[1]
            held.listen()
            with socket.create_connection(("127.0.0.1", own), timeout=1):
                pass
        assert guard.violations == []
        with pytest.raises(NotAFake), socket.socket() as client:
            client.connect(("127.0.0.1", 1))  # a port it never bound: a broker, say
        assert len(guard.violations) == 1 and "1)" in guard.violations[0]


def test_a_process_is_refused_and_caught() -> None:
    with guarded() as guard:
        with pytest.raises(UnitTierViolation):
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        assert len(guard.violations) == 1 and "subprocess" in guard.violations[0]


def test_a_blocking_sleep_over_the_limit_is_caught() -> None:
    with guarded() as guard:
        time.sleep(0.001)
        assert guard.violations == []
        time.sleep(0.005)
        assert len(guard.violations) == 1 and "time.sleep(0.005)" in guard.violations[0]


def test_a_sleep_in_a_thread_is_caught_when_project_code_calls_it() -> None:
    def nap() -> None:
        time.sleep(0.005)

    with guarded() as guard:
        library = threading.Thread(target=time.sleep, args=(0.005,))  # no frame of ours
        library.start()
        library.join()
        assert guard.violations == []
        ours = threading.Thread(target=nap)
        ours.start()
        ours.join()
        assert len(guard.violations) == 1 and "test_guard.py" in guard.violations[0]


async def test_an_event_loop_idle_on_a_timer_is_caught() -> None:
    with guarded() as guard:
        await asyncio.sleep(0)
        assert guard.violations == []
        loop = asyncio.get_running_loop()
        timer = loop.call_later(60, lambda: None)  # as a poll interval or a timeout sets one
        # What the loop does with nothing ready and a timer due: wait on its selector until
        # then. The 5 ms wait is handed to the selector directly: through a real timer, a busy
        # machine that runs this process late shrinks the wait under the limit.
        with selectors.DefaultSelector() as selector:
            assert selector.select(0.005) == []
        timer.cancel()
        assert any("idle" in v for v in guard.violations), guard.violations


def test_a_host_name_look_up_is_refused_and_caught() -> None:
    with guarded() as guard:
        assert socket.getaddrinfo("127.0.0.1", 9092)  # an address needs no name server
        with pytest.raises(NotAFake):
            socket.getaddrinfo("broker.example", 9092)
        assert len(guard.violations) == 1 and "broker.example" in guard.violations[0]
