"""The positions topic's records and reader, without a broker (a fake fetcher that serves a
partition's committed records in offset order)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from aiokafka.structs import TopicPartition

from statestore.errors import StateStoreError
from statestore.fetch import FetchedPartition, FetchSettings
from streams.quirks.task_positions import (
    TAIL_OFFSETS,
    PositionReader,
    TaskPositions,
    decode_position,
    encode_position,
    positions_topic_name,
)

ORDERS = TopicPartition("orders", 3)
USERS = TopicPartition("users", 3)


class FakeFetcher:
    """One partition's committed records at given offsets; each fetch answers up to
    ``per_fetch`` offsets. ``latest`` is what ListOffsets(latest) answers."""

    def __init__(self, records: Mapping[int, tuple[bytes | None, bytes | None]], end: int,
                 earliest: int = 0, latest: int | None = None, per_fetch: int = 100,
                 failures: int = 0) -> None:
        self.settings = FetchSettings(committed_by_markers=True)
        self.records, self.end, self.earliest = dict(records), end, earliest
        self.latest = end if latest is None else latest
        self.per_fetch, self.failures = per_fetch, failures
        self.tracked: set[str] = set()
        self.fetched_from: list[int] = []

    def track(self, topic: str) -> None:
        self.tracked.add(topic)

    async def earliest_offset(self, tp: TopicPartition) -> int:
        if self.failures:
            self.failures -= 1
            raise StateStoreError("no leader known")
        return self.earliest

    async def latest_offset(self, tp: TopicPartition) -> int:
        return self.latest

    async def fetch(self, positions: Mapping[TopicPartition, int]) -> list[FetchedPartition]:
        ((tp, offset),) = positions.items()
        self.fetched_from.append(offset)
        upto = min(self.end, offset + self.per_fetch)
        changes = [self.records[o] for o in range(offset, upto) if o in self.records]
        return [FetchedPartition(tp, offset, upto, self.end, changes)]


def reader(fetcher: FakeFetcher) -> PositionReader:
    positions = TaskPositions.of("app", ["0_0", "0_1", "1_0", "1_1"])
    return PositionReader(positions, fetcher)  # type: ignore[arg-type]


def test_each_task_has_a_partition_of_its_own_and_records_every_input_position() -> None:
    positions = TaskPositions.of("app", ["0_0", "0_1", "1_0", "1_1"])
    assert positions.topic == positions_topic_name("app") == "app-positions"
    assert [positions.partition_of(t) for t in ("0_0", "0_1", "1_0", "1_1")] == [0, 1, 2, 3]
    records = positions.records({USERS: 7, ORDERS: 120})
    assert [decode_position(k, v) for k, v in records] == [(ORDERS, 120), (USERS, 7)]


@pytest.mark.parametrize("key, value", [
    (None, b"1"), (b"orders:3", None), (b"orders:x", b"1"), (b"orders:3", b"many"),
    (b"\xff\xfe", b"1"), (b"no-partition", b"1"),
])
def test_a_record_that_is_not_a_position_is_skipped(key: bytes | None,
                                                    value: bytes | None) -> None:
    assert decode_position(key, value) is None


async def test_the_last_committed_position_in_the_tail_wins() -> None:
    end = 10 * TAIL_OFFSETS
    records = {o: encode_position(ORDERS, o) for o in range(0, end, 2)}
    fetcher = FakeFetcher(records, end)
    assert await reader(fetcher).latest("1_1", [ORDERS]) == {ORDERS: end - 2}
    # Only the tail was read.
    assert min(fetcher.fetched_from) == end - TAIL_OFFSETS


async def test_a_partition_missing_from_the_tail_is_found_earlier_and_the_tail_still_wins(
) -> None:
    end = 10 * TAIL_OFFSETS
    records = {o: encode_position(ORDERS, o) for o in range(100, end, 2)}
    records[5] = encode_position(USERS, 33)  # written once, long ago
    records[6] = encode_position(ORDERS, 1)  # an old position, overtaken in the tail
    fetcher = FakeFetcher(records, end)
    found = await reader(fetcher).latest("1_1", [ORDERS, USERS])
    assert found == {ORDERS: end - 2, USERS: 33}
    assert min(fetcher.fetched_from) == 0


async def test_a_position_never_recorded_is_absent_and_an_empty_partition_answers_nothing(
) -> None:
    assert await reader(FakeFetcher({}, 0)).latest("0_0", [ORDERS]) == {}
    records = {o: encode_position(USERS, o) for o in range(50)}
    assert await reader(FakeFetcher(records, 50)).latest("0_0", [ORDERS]) == {}


async def test_a_short_latest_offset_still_reads_to_the_end() -> None:
    # The embedded broker answers ListOffsets(latest) short of the end.
    records = {o: encode_position(ORDERS, o) for o in range(0, 40, 2)}
    fetcher = FakeFetcher(records, 40, latest=30, per_fetch=7)
    assert await reader(fetcher).latest("0_1", [ORDERS]) == {ORDERS: 38}


async def test_a_failed_read_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("streams.quirks.task_positions.RETRY_BACKOFF_S", 0)
    records = {3: encode_position(ORDERS, 9)}
    fetcher = FakeFetcher(records, 5, failures=2)
    assert await reader(fetcher).latest("0_1", [ORDERS]) == {ORDERS: 9}
