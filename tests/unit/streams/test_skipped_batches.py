"""The ``skipped-batches`` quirk: records fetched from past a partition's position are not
handed out; the partition is sought back and fetched again until the gap fills or has stood
long enough to be the log's own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiokafka.structs import TopicPartition

from streams.kafka.driver import GAP_SETTLE_S, GapDecision, GroupConsumer, skipped_batches

TP = TopicPartition("repartition", 0)


def test_a_gap_is_fetched_again_until_it_has_stood_long_enough() -> None:
    assert skipped_batches(10, 10, None, 0.0) is GapDecision.NONE
    assert skipped_batches(10, 14, None, 5.0) is GapDecision.REFETCH
    assert skipped_batches(10, 14, 5.0, 5.0 + GAP_SETTLE_S / 2) is GapDecision.REFETCH
    assert skipped_batches(10, 14, 5.0, 5.01 + GAP_SETTLE_S) is GapDecision.ACCEPT


@dataclass
class _Record:
    offset: int


@dataclass
class _State:
    position: int
    has_valid_position: bool = True


@dataclass
class _Log:
    """A partition whose batch 4..7 is readable only from the third fetch on."""

    fetches: int = 0
    position: int = 0
    sought: list[int] = field(default_factory=list)

    def readable(self) -> list[int]:
        hidden = range(4, 8) if self.fetches < 3 else range(0)
        return [o for o in range(12) if o >= self.position and o not in hidden]


class _Consumer:
    def __init__(self, log: _Log) -> None:
        self.log = log
        assignment = type("Assignment", (), {"tps": {TP},
                                             "state_value": lambda _self, _tp: _State(
                                                 log.position)})()
        self._subscription = type("S", (), {"subscription": type(
            "Sub", (), {"assignment": assignment})()})()

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.log.sought.append(offset)
        self.log.position = offset

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[Any, list[_Record]]:
        self.log.fetches += 1
        offsets = self.log.readable()
        if offsets:
            self.log.position = offsets[-1] + 1
        return {TP: [_Record(o) for o in offsets]} if offsets else {}


async def test_records_past_the_position_are_not_handed_out_but_fetched_again() -> None:
    log = _Log(position=0)
    clock = [0.0]
    consumer = GroupConsumer(_Consumer(log), refetch_skipped=True,  # type: ignore[arg-type]
                             clock=lambda: clock[0])
    # The first fetch reads 0-3 and 8-11 (4-7 not readable yet): only 0-3 are handed out.
    first = await consumer.getmany(100, 100)
    assert [r.offset for r in first[TP]] == [0, 1, 2, 3] and log.sought == [4]
    handed: list[int] = [r.offset for r in first.get(TP, [])]
    while len(handed) < 12 and log.fetches < 10:
        clock[0] += 0.01
        handed += [r.offset for r in (await consumer.getmany(100, 100)).get(TP, [])]
    assert handed == list(range(12)), handed


async def test_a_gap_that_stays_is_taken_as_the_logs_own() -> None:
    log = _Log(position=4, fetches=-10_000)  # 4-7 never readable: a transaction's marker, say
    clock = [0.0]
    consumer = GroupConsumer(_Consumer(log), refetch_skipped=True,  # type: ignore[arg-type]
                             clock=lambda: clock[0])
    handed: list[int] = []
    while not handed:
        handed = [r.offset for r in (await consumer.getmany(100, 100)).get(TP, [])]
        clock[0] += 0.05
    assert handed == [8, 9, 10, 11] and clock[0] > GAP_SETTLE_S


async def test_without_the_quirk_the_later_batch_is_taken() -> None:
    log = _Log(position=4)
    consumer = GroupConsumer(_Consumer(log))  # type: ignore[arg-type]
    assert [r.offset for r in (await consumer.getmany(100, 100))[TP]] == [8, 9, 10, 11]
