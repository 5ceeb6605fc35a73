"""Blocking client calls in threads of their own: a call that hangs (librdkafka waiting for a
group coordinator that is gone) holds up no other blocking call of the process."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from streams.runtime.call_threads import in_own_thread
from streams.runtime.transactions import CallHung, call_within


async def test_a_call_that_hangs_holds_no_thread_of_the_event_loops_executor() -> None:
    release, returned = threading.Event(), threading.Event()

    def hangs(timeout: float) -> None:
        release.wait(5)  # returns at last, had the executor's one thread been taken
        returned.set()

    executor = ThreadPoolExecutor(max_workers=1)
    asyncio.get_running_loop().set_default_executor(executor)
    try:
        with pytest.raises(CallHung, match="hangs did not return"):
            await call_within(hangs, timeout_s=0.002, grace_s=0.003)
        # Another blocking call of the process runs while the hung one still waits.
        assert await asyncio.to_thread(returned.is_set) is False
    finally:
        release.set()
    assert await asyncio.to_thread(returned.wait, 5)
    executor.shutdown()


async def test_a_call_in_its_own_thread_returns_its_result_or_raises_its_error() -> None:
    def daemon(value: int) -> tuple[int, bool]:
        return value, threading.current_thread().daemon

    def fails() -> None:
        raise ValueError("refused")

    # A daemon thread: a call that never returns does not hold the interpreter's exit.
    assert await in_own_thread(daemon, 7) == (7, True)
    with pytest.raises(ValueError, match="refused"):
        await in_own_thread(fails)
