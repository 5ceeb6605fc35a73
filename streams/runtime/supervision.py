"""The app's watch over its stream threads: it waits until every thread's run has ended; a
stop asked of the app, or one thread's failure, stops them all, and the first failure is
what the app raises."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any


async def supervise(runs: Iterable[asyncio.Task[Any]], stopper: asyncio.Task[Any],
                    stop_all: Callable[[], None]) -> BaseException | None:
    """Wait for ``runs`` to end. When ``stopper`` ends or a run fails, ``stop_all`` is called
    (a thread told to shut down on its own, a leaving member with nothing left, ends without
    it); returns the first run's failure, None if none failed."""
    pending = set(runs)
    error: BaseException | None = None
    while pending:
        # Once the stopper has ended, only the runs are waited for: the stopper, done, would
        # end every wait at once and spin the event loop until the runs end.
        waited = [*pending] if stopper.done() else [*pending, stopper]
        done, _ = await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        pending -= done
        failed = [d for d in done if d is not stopper and d.exception() is not None]
        if failed and error is None:
            error = failed[0].exception()
        if stopper in done or failed:
            stop_all()
    return error
