"""The group consumer's read_committed records (``streams.kafka.driver.ReadCommittedRecords``):
aborted transactions are skipped whether the fetch response lists them or only their abort
markers show them, and a transaction whose marker is not in the response yet ends the
records before it (no broker: synthetic record batches)."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.consumer import fetcher as fetcher_module
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from streams.kafka.driver import (
    COMMITTED_BY_MARKERS,
    ReadCommittedRecords,
    install_read_committed_records,
)
from tests.record_batches import marker, record_batch

TP = TopicPartition("orders-repartition", 0)


def records(raw: bytes, fetch_offset: int = 0, aborted: list[tuple[int, int]] | None = None,
            isolation: int = fetcher_module.READ_COMMITTED) -> ReadCommittedRecords:
    # The fetcher hands its isolation level to the records it builds.
    return ReadCommittedRecords(TP, MemoryRecords(raw), aborted or [], fetch_offset,
                                None, None, True, isolation)


def values(partition_records: Any) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for r in partition_records]


def test_aborted_transactions_known_only_from_their_markers_are_skipped() -> None:
    raw = b"".join([
        record_batch(0, [(b"k", b"plain")]),
        record_batch(1, [(b"k", b"aborted-1"), (b"k", b"aborted-2")], producer_id=7,
                     transactional=True),
        record_batch(3, [(b"k", b"committed")], producer_id=8, transactional=True),
        marker(4, 7, abort=True),
        marker(5, 8, abort=False),
        record_batch(6, [(b"k", b"after")]),
    ])
    got = records(raw)  # the response lists no aborted transactions, as Tansu's do
    assert values(got) == [(0, b"plain"), (3, b"committed"), (6, b"after")]
    assert got.next_fetch_offset == 7


def test_a_transaction_without_its_marker_in_the_response_ends_the_records_before_it() -> None:
    head = [
        record_batch(0, [(b"k", b"committed")], producer_id=8, transactional=True),
        marker(1, 8, abort=False),
        record_batch(2, [(b"k", b"undecided")], producer_id=9, transactional=True),
        record_batch(3, [(b"k", b"plain, after it")]),
    ]
    got = records(b"".join(head))
    assert values(got) == [(0, b"committed")]
    assert got.next_fetch_offset == 2  # the next fetch starts at the undecided transaction
    later = records(b"".join([*head[2:], marker(4, 9, abort=True)]), fetch_offset=2)
    assert values(later) == [(3, b"plain, after it")]
    assert later.next_fetch_offset == 5


def test_listed_aborted_transactions_are_still_skipped_and_read_uncommitted_reads_all() -> None:
    raw = b"".join([
        record_batch(0, [(b"k", b"aborted")], producer_id=7, transactional=True),
        marker(1, 7, abort=True),
        record_batch(2, [(b"k", b"plain")]),
    ])
    assert values(records(raw, aborted=[(7, 0)])) == [(2, b"plain")]
    uncommitted = records(raw, isolation=fetcher_module.READ_UNCOMMITTED)
    assert values(uncommitted) == [(0, b"aborted"), (2, b"plain")]


def test_a_fetch_from_inside_a_batch_skips_the_records_before_the_position() -> None:
    raw = record_batch(10, [(b"k", b"a"), (b"k", b"b"), (b"k", b"c")], producer_id=8,
                       transactional=True) + marker(13, 8, abort=False)
    got = records(raw, fetch_offset=11)
    assert values(got) == [(11, b"b"), (12, b"c")]
    assert got.next_fetch_offset == 14


def test_the_fetcher_builds_these_records_once_installed() -> None:
    install_read_committed_records()
    install_read_committed_records()
    assert fetcher_module.PartitionRecords is ReadCommittedRecords


def test_read_by_markers_up_to_the_high_watermark_stops_at_the_first_open_transaction() -> None:
    """A fetch read_uncommitted (past a last stable offset the broker does not move) keeps
    committed records only, and never passes a transaction still open."""
    raw = b"".join([
        record_batch(0, [(b"k", b"committed")], producer_id=8, transactional=True),
        record_batch(1, [(b"k", b"aborted")], producer_id=7, transactional=True),
        marker(2, 8, abort=False),
        marker(3, 7, abort=True),
        record_batch(4, [(b"k", b"still open")], producer_id=7, transactional=True),
        record_batch(5, [(b"k", b"committed later")], producer_id=8, transactional=True),
        marker(6, 8, abort=False),
    ])
    got = records(raw, isolation=COMMITTED_BY_MARKERS)
    assert values(got) == [(0, b"committed")]
    assert got.next_fetch_offset == 4
    assert COMMITTED_BY_MARKERS == fetcher_module.READ_UNCOMMITTED  # what the fetch asks


def test_the_reader_takes_the_windowed_serde_by_name_in_a_fresh_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A checker that imports only read_committed (no window class) reads windowed outputs
    with key_serde="windowed", as the docs name it."""
    import importlib
    import sys

    from statestore import serdes
    from streams.kafka import committed_reader

    monkeypatch.delitem(serdes._BY_NAME, "windowed")
    monkeypatch.delitem(sys.modules, "streams.dsl.windows")
    monkeypatch.delattr(sys.modules["streams.dsl"], "windows")
    with pytest.raises(ValueError, match="unknown serde 'windowed'"):
        serdes.serde_from_name("windowed")
    importlib.reload(committed_reader)
    assert type(serdes.serde_from_name("windowed")).__name__ == "WindowedSerde"
