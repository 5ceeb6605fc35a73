"""The rebalance listener aiokafka calls: it only delegates to the stream thread, and hands
any failure of a callback to the thread instead of letting the client log and forget it."""

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
    ) -> None:
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
