"""The app's watch over its stream threads (no broker): a stop stops every thread, the first
failure stops the others and is returned, and the watch waits for threads that take a while
to end without spinning the event loop meanwhile."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streams.runtime import supervision
from streams.runtime.supervision import supervise


class _Thread:
    """Ends some event-loop turns after it is told to stop (a final commit, say)."""

    def __init__(self, turns: int = 200, fails: bool = False) -> None:
        self.stopped = asyncio.Event()
        self.turns = turns
        self.fails = fails

    async def run(self) -> None:
        if self.fails:
            raise RuntimeError("boom")
        await self.stopped.wait()
        for _ in range(self.turns):
            await asyncio.sleep(0)

    def stop(self) -> None:
        self.stopped.set()


def _stop_all(threads: list[_Thread]) -> Any:
    return lambda: [t.stop() for t in threads]


async def test_a_stop_stops_every_thread_and_the_watch_waits_without_spinning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    waits = 0
    wait = asyncio.wait

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal waits
        waits += 1
        return await wait(*args, **kwargs)

    monkeypatch.setattr(supervision.asyncio, "wait", counted)
    threads = [_Thread(), _Thread(turns=300)]
    stop = asyncio.Event()
    runs = [asyncio.create_task(t.run()) for t in threads]
    stopper = asyncio.create_task(stop.wait())
    stop.set()
    assert await supervise(runs, stopper, _stop_all(threads)) is None
    assert all(t.stopped.is_set() for t in threads) and all(r.done() for r in runs)
    assert waits <= 3  # the stop, then each thread's end: not one wait per loop turn


async def test_the_first_failure_stops_the_others_and_is_returned() -> None:
    threads = [_Thread(fails=True), _Thread(turns=1)]
    runs = [asyncio.create_task(t.run()) for t in threads]
    stopper = asyncio.create_task(asyncio.Event().wait())
    error = await supervise(runs, stopper, _stop_all(threads))
    stopper.cancel()
    assert isinstance(error, RuntimeError) and threads[1].stopped.is_set()
