"""Blocking client calls that may never return, each run in a daemon thread of its own.

librdkafka's ``send_offsets_to_transaction`` can wait without end for a group coordinator
that is gone (librdkafka issues 5456 and 5511). Run on the event loop's default executor (six
threads on a 2-core machine, shared by every ``asyncio.to_thread`` of the process), a few
such calls took its threads for good, and every other blocking call of the process, a new
producer's ``init_transactions`` included, queued behind them; the interpreter's exit would
wait for them too. A daemon thread per call holds nothing but itself while it hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


async def in_own_thread(call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)`` in a new daemon thread; its result or error. Cancelled (a timeout), the
    caller goes on at once, and the call, left to its thread, is logged once it returns."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    name = getattr(call, "__name__", "call")
    started = time.monotonic()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.cancelled():
            outcome = "returned" if error is None else f"raised {type(error).__name__}: {error}"
            log.info("%s %s %.1f s after it started, after it was given up",
                     name, outcome, time.monotonic() - started)
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = call(*args)
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=f"relay-{name}", daemon=True).start()
    return await future
