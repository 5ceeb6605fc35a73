"""The rebalance listener aiokafka calls: it only delegates to the stream thread, and hands
any failure of a callback to the thread instead of letting the client log and forget it.
Beyond aiokafka's two callbacks, the cooperative coordinator calls ``before_join`` as the
member joins a round (:mod:`streams.kafka.cooperative`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import ConsumerRebalanceListener


class RebalanceListener(ConsumerRebalanceListener):
    def __init__(
        self,
        on_revoked: Callable[[], Awaitable[None]],
        on_assigned: Callable[[], Awaitable[None]],
        on_failure: Callable[[str, BaseException], None],
        before_join: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._before_join = before_join
        self._on_revoked = on_revoked
        self._on_assigned = on_assigned
        self._on_failure = on_failure

    async def on_partitions_revoked(self, revoked: Any) -> None:
        try:
            await self._on_revoked()
        except Exception as exc:
            self._on_failure("on_partitions_revoked", exc)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        try:
            await self._on_assigned()
        except Exception as exc:
            self._on_failure("on_partitions_assigned", exc)

    async def before_join(self) -> None:
        if self._before_join is None:
            return
        try:
            await self._before_join()
        except Exception as exc:
            self._on_failure("before_join", exc)
