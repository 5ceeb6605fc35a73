"""The reader's own fetch path: restores over many fetches and partial batches, copies that
follow a changelog still being written, bad records named by offset, broker errors retried,
transactions and control batches skipped. Real broker, except where noted."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, NotLeaderForPartitionError, OffsetOutOfRangeError
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from aiokafka.structs import TopicPartition

from statestore.errors import ChangelogDecodeError
from statestore.fetch import ChangelogFetcher, decode_records, decoded_partition
from statestore.restore import ChangelogReader
from statestore.serdes import MsgPackSerde, OrderedKeySerde
from statestore.store import KeyValueStore, StoreSpec, changelog_topic_name, store_directory
from statestore.topics import COMPACTED, TopicSpec, ensure_topics
from tests.conftest import on_tansu, wait_until
from tests.record_batches import marker, record_batch

KEYS, VALUES = OrderedKeySerde(), MsgPackSerde()


@pytest.fixture
async def changelog(bootstrap: str, unique: Callable[[str], str]) -> str:
    """A fresh application id whose store "counts" has a one-partition changelog."""
    app = unique("fetch")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, [TopicSpec(changelog_topic_name(app, "counts"), 1, COMPACTED)])
    finally:
        await admin.close()
    return app


@pytest.fixture
async def producer(bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:
    # Long lingering: many records per batch, so that fetches start inside batches.
    client = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=256 * 1024,
        compression_type="gzip",
    )
    await client.start()
    yield client
    await client.stop()


def open_store(state_dir: Path, app: str) -> KeyValueStore:
    return KeyValueStore(
        StoreSpec("counts"), store_directory(state_dir, app, "0_0", "counts"),
        changelog_topic_name(app, "counts"), 0,
    ).open()


async def produce_history(
    producer: AIOKafkaProducer, app: str, records: int, keys: int, seed: int
) -> dict[Any, Any]:
    """Puts, overwrites and tombstones in large batches; returns the last value per key."""
    rng = random.Random(seed)
    topic = changelog_topic_name(app, "counts")
    model: dict[Any, Any] = {}
    pending = []
    for i in range(records):
        key = f"k{rng.randrange(keys)}"
        if key in model and rng.random() < 0.15:
            model.pop(key)
            value = None
        else:
            model[key] = [i, "x" * 40]
            value = VALUES.dumps(model[key])
        pending.append(await producer.send(topic, key=KEYS.dumps(key), value=value, partition=0))
    await asyncio.gather(*pending)
    return model


pytestmark = pytest.mark.broker


async def test_restore_over_many_fetches_and_writes_equals_the_last_value_per_key(
    tmp_path: Path, bootstrap: str, producer: AIOKafkaProducer, changelog: str
) -> None:
    model = await produce_history(producer, changelog, 40_000, keys=12_000, seed=1)
    store = open_store(tmp_path, changelog)
    # Small fetches: dozens of them, each written as it comes. The progress bar is drawn
    # before the end is known, and updated along.
    async with ChangelogReader(bootstrap, max_partition_fetch_bytes=64 * 1024) as reader:
        stats = await reader.restore([store], show_progress=True)
    assert stats.records == 40_000
    assert store.position == 40_000
    assert dict(store.items()) == model
    store.close()


async def test_polls_capped_by_max_records_resume_inside_arecord_batch(
    tmp_path: Path, bootstrap: str, producer: AIOKafkaProducer, changelog: str
) -> None:
    model = await produce_history(producer, changelog, 3_000, keys=500, seed=2)
    store = open_store(tmp_path, changelog)
    positions = []
    async with ChangelogReader(bootstrap, max_records=333) as reader:
        reader.register(store)

        async def caught_up() -> bool:
            applied = await reader.poll(timeout_ms=200)
            assert applied <= 333
            positions.append(store.position)
            return reader.caught_up(store)

        await wait_until(caught_up, message="the copy to catch up")
        assert reader.stats.records == 3_000  # every record once: none skipped, none twice
    assert 333 in positions and 666 in positions  # both inside the first batches
    assert dict(store.items()) == model
    store.close()


async def test_follower_reports_lag_while_the_changelog_is_written(
    tmp_path: Path, bootstrap: str, changelog: str
) -> None:
    topic = changelog_topic_name(changelog, "counts")
    copy = open_store(tmp_path, changelog)
    lags: list[int] = []
    written = 0
    writing_done = asyncio.Event()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()

    async def write() -> None:
        nonlocal written
        for round_ in range(40):
            for i in range(250):
                await producer.send(topic, key=KEYS.dumps(f"k{i}"),
                                    value=VALUES.dumps(round_), partition=0)
            await producer.flush()
            written += 250
            # Let the follower run between rounds: the changelog grows while it reads.
            await asyncio.sleep(0)
        writing_done.set()

    try:
        async with ChangelogReader(bootstrap, max_records=100) as reader:
            reader.register(copy)
            stop = asyncio.Event()
            follower = asyncio.create_task(reader.follow(stop))
            writer = asyncio.create_task(write())

            async def observe() -> bool:
                lag = reader.lag(copy)
                if lag is not None:
                    lags.append(lag)
                return writing_done.is_set() and lag == 0 and copy.position == written

            await wait_until(observe, interval_s=0.02, message="the copy to catch up")
            stop.set()
            await asyncio.gather(follower, writer)
    finally:
        await producer.stop()
    assert max(lags) > 0
    assert dict(copy.items()) == {f"k{i}": 39 for i in range(250)}
    copy.close()


async def test_bad_record_inside_a_batch_is_named_and_not_skipped_on_retry(
    tmp_path: Path, bootstrap: str, producer: AIOKafkaProducer, changelog: str
) -> None:
    topic = changelog_topic_name(changelog, "counts")
    await produce_history(producer, changelog, 1_000, keys=100, seed=3)
    bad = await (await producer.send(topic, key=KEYS.dumps("k1"), value=b"\xc1", partition=0))
    await produce_history(producer, changelog, 1_000, keys=100, seed=4)
    store = open_store(tmp_path, changelog)

    async def poll_until_it_fails(reader: ChangelogReader) -> None:
        while True:
            await reader.poll(timeout_ms=200)

    async with ChangelogReader(bootstrap) as reader:
        with pytest.raises(ChangelogDecodeError, match="not valid msgpack") as info:
            await reader.restore([store], show_progress=False, timeout_s=30)
        assert (info.value.topic, info.value.partition, info.value.offset) == (
            topic, 0, bad.offset
        )
        # A copy that follows: every poll after the failure fails on the same record.
        reader.register(store)
        for _attempt in range(2):
            with pytest.raises(ChangelogDecodeError) as info:
                await asyncio.wait_for(poll_until_it_fails(reader), 30)
            assert info.value.offset == bad.offset
            assert store.position <= bad.offset
    store.close()


class InjectedFailures:
    """Replaces answers of a real broker to the fetcher's FetchRequests: the next failure
    queued (an error code for every partition, or an exception raised) is used once."""

    def __init__(self, fetcher: ChangelogFetcher, monkeypatch: pytest.MonkeyPatch) -> None:
        self.queue: list[int | Exception] = []
        self._send = fetcher.client.send
        monkeypatch.setattr(fetcher.client, "send", self.send)

    async def send(self, node_id: int, request: Any, **kwargs: Any) -> Any:
        if not (isinstance(request, FetchRequest) and self.queue):
            return await self._send(node_id, request, **kwargs)
        failure = self.queue.pop(0)
        if isinstance(failure, Exception):
            raise failure
        response = await self._send(node_id, request, **kwargs)
        response.topics = [
            (topic, [(partition, failure, -1, *rest) for partition, _, _, *rest in partitions])
            for topic, partitions in response.topics
        ]
        return response


async def test_fetcher_retries_leader_and_connection_errors_and_resets_out_of_range(
    bootstrap: str, producer: AIOKafkaProducer, changelog: str,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The embedded broker answers none of these errors, so they are injected into its
    real answers."""
    await produce_history(producer, changelog, 500, keys=50, seed=5)
    tp = TopicPartition(changelog_topic_name(changelog, "counts"), 0)
    fetcher = ChangelogFetcher(bootstrap, "test-fetcher")
    fetcher.track(tp.topic)
    await fetcher.start()
    try:
        # No leader known (the topic has one partition): left out after a metadata refresh.
        assert await fetcher.fetch({TopicPartition(tp.topic, 5): 0}) == []
        failures = InjectedFailures(fetcher, monkeypatch)
        failures.queue.append(NotLeaderForPartitionError.errno)
        assert await fetcher.fetch({tp: 0}) == []  # left out, after a metadata refresh
        failures.queue.append(KafkaConnectionError("injected"))
        assert await fetcher.fetch({tp: 0}) == []
        [fetched] = await fetcher.fetch({tp: 0})
        assert (fetched.next_offset, fetched.end, len(fetched.changes)) == (500, 500, 500)

        # Out of range above the log's start: past its end (a replaced broker's shorter log),
        # which the caller handles; no reset here.
        failures.queue.append(OffsetOutOfRangeError.errno)
        [past] = await fetcher.fetch({tp: 250})
        assert (past.fetch_offset, past.next_offset, past.past_end) == (250, 0, True)

        # Out of range below the log's start (records deleted): carry on from the start.
        failures.queue.append(OffsetOutOfRangeError.errno)

        async def start_after(_tp: TopicPartition, _leader: int | None = None) -> int:
            return 300

        monkeypatch.setattr(fetcher, "earliest_offset", start_after)
        with caplog.at_level(logging.WARNING, logger="statestore.fetch"):
            [reset] = await fetcher.fetch({tp: 250})
        assert (reset.fetch_offset, reset.next_offset, reset.changes) == (250, 300, [])
        assert not reset.past_end
        assert "out of range" in caplog.text
    finally:
        await fetcher.close()


async def test_restore_goes_on_through_broker_errors(
    tmp_path: Path, bootstrap: str, producer: AIOKafkaProducer, changelog: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = await produce_history(producer, changelog, 800, keys=80, seed=6)
    store = open_store(tmp_path, changelog)
    store.position = 300  # as if a checkpoint pointed outside a log the broker lost
    async with ChangelogReader(bootstrap) as reader:
        failures = InjectedFailures(reader.fetcher, monkeypatch)
        failures.queue += [
            NotLeaderForPartitionError.errno, OffsetOutOfRangeError.errno,
            KafkaConnectionError("injected"),
        ]
        stats = await reader.restore([store], show_progress=False, timeout_s=60)
        assert failures.queue == []
    assert stats.records == 800  # started over from the earliest offset
    assert dict(store.items()) == model
    store.close()


def test_aborted_transactions_and_control_batches_are_skipped() -> None:
    """Synthetic batches (the embedded broker has no transactional producer here)."""
    abort, commit = struct.pack(">hh", 0, 0), struct.pack(">hh", 0, 1)
    marker = struct.pack(">hi", 0, 0)
    raw = b"".join([
        record_batch(0, [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]),
        record_batch(3, [(b"x", b"aborted"), (b"y", b"aborted")], producer_id=7,
                     transactional=True),
        record_batch(5, [(abort, marker)], producer_id=7, transactional=True, control=True),
        record_batch(6, [(b"d", b"4"), (b"e", None)], producer_id=8, transactional=True),
        record_batch(8, [(commit, marker)], producer_id=8, transactional=True, control=True),
        record_batch(9, [(b"f", b"5")]),
    ])
    tp = TopicPartition("t", 0)
    changes, next_offset = decode_records(tp, raw, 0, [(7, 3)])
    assert changes == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4"), (b"e", None),
                       (b"f", b"5")]
    assert next_offset == 10
    # From inside the first batch, and with the end of the buffer cut off mid-batch.
    changes, next_offset = decode_records(tp, raw[:-5], 1, [(7, 3)])
    assert changes == [(b"b", b"2"), (b"c", b"3"), (b"d", b"4"), (b"e", None)]
    assert next_offset == 9


def test_aborted_transactions_are_found_from_their_markers_when_the_broker_lists_none() -> None:
    """Tansu answers read_committed fetches with no aborted transactions: the abort markers
    in the data tell them, and a transaction whose marker is not in the response yet ends
    the fetch before it."""
    abort, commit = struct.pack(">hh", 0, 0), struct.pack(">hh", 0, 1)
    marker = struct.pack(">hi", 0, 0)
    head = [
        record_batch(0, [(b"a", b"1")], producer_id=7, transactional=True),
        record_batch(1, [(abort, marker)], producer_id=7, transactional=True, control=True),
        record_batch(2, [(b"b", b"2")], producer_id=7, transactional=True),
        record_batch(3, [(commit, marker)], producer_id=7, transactional=True, control=True),
        record_batch(4, [(b"c", b"3")], producer_id=9, transactional=True),
    ]
    tp = TopicPartition("t", 0)
    assert decode_records(tp, b"".join(head), 0) == ([(b"b", b"2")], 4)
    tail = record_batch(5, [(abort, marker)], producer_id=9, transactional=True, control=True)
    assert decode_records(tp, b"".join([*head, tail]), 0) == ([(b"b", b"2")], 6)
    assert decode_records(tp, b"".join([*head[4:], tail]), 4) == ([], 6)


def test_a_fenced_producers_late_writes_never_commit() -> None:
    """A zombie stopped mid-transaction is fenced by the new owner of its transactional id
    (same producer id, a later epoch), which aborts its transaction. Should any of the
    zombie's records land after that abort marker, the new owner's commit marker must not
    commit them (Kafka's rule: a fenced epoch never commits)."""
    raw = b"".join([
        record_batch(0, [(b"k", b"zombie-1")], producer_id=7, transactional=True, epoch=3),
        marker(1, 7, abort=True, epoch=4),
        record_batch(2, [(b"k", b"zombie-late")], producer_id=7, transactional=True, epoch=3),
        record_batch(3, [(b"k", b"owner-1")], producer_id=7, transactional=True, epoch=4),
        marker(4, 7, abort=False, epoch=4),
        record_batch(5, [(b"k", b"plain")]),
    ])
    tp = TopicPartition("t", 0)
    assert decode_records(tp, raw, 0) == ([(b"k", b"owner-1"), (b"k", b"plain")], 6)


def test_read_by_markers_a_partition_ends_where_its_first_undecided_transaction_starts(
) -> None:
    """With the broker's last stable offset not to be trusted (Tansu holds it back while any
    transaction is open), the end a restore reads to is the start of the first transaction
    whose marker is not written yet when the response reached the high watermark, and the
    high watermark when every transaction read is decided or the response stopped short."""
    decided = [
        record_batch(0, [(b"k", b"1")], producer_id=7, transactional=True),
        marker(1, 7, abort=False),
    ]
    open_ = [record_batch(2, [(b"k", b"2")], producer_id=7, transactional=True)]
    rest = [0, 0, [], None]  # last stable offset (held back at 0), log start, aborts, replica
    by_markers = decoded_partition(TopicPartition("t", 0), 0, 3, [*rest, b"".join(decided + open_)],
                          11, committed_by_markers=True)
    assert (by_markers.changes, by_markers.next_offset, by_markers.end) == (
        [(b"k", b"1")], 2, 2)
    # The broker's last stable offset, held back, would have ended the restore at once.
    trusting = decoded_partition(TopicPartition("t", 0), 0, 3,
                                 [*rest, b"".join(decided + open_)], 11)
    assert trusting.end == 0
    # Everything decided: the high watermark.
    done = decoded_partition(TopicPartition("t", 0), 0, 2, [*rest, b"".join(decided)], 11,
                    committed_by_markers=True)
    assert done.end == 2
    # The response stopped before the high watermark: the marker may lie past it.
    short = decoded_partition(TopicPartition("t", 0), 0, 9, [*rest, b"".join(decided + open_)], 11,
                     committed_by_markers=True)
    assert short.end == 9


def test_message_format_v1_batches_are_read() -> None:
    """Old message formats have no batch base offset and no transactions."""
    builder = LegacyRecordBatchBuilder(1, 0, 2**20)
    for offset, key in enumerate([b"a", b"b", b"c"]):
        builder.append(offset, 1_000, key, key.upper())
    raw = bytes(builder.build())
    tp = TopicPartition("t", 0)
    assert decode_records(tp, raw, 0) == ([(b"a", b"A"), (b"b", b"B"), (b"c", b"C")], 3)
    assert decode_records(tp, raw, 2) == ([(b"c", b"C")], 3)


@pytest.mark.tansu
async def test_a_transaction_larger_than_the_fetch_size_is_restored_and_read(
    tmp_path: Path, bootstrap: str, changelog: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction whose commit marker lies past what one fetch holds: its batches cannot
    be applied before it is known to have committed. The reader fetches the partition again
    with room for it (a restore stood still on it for good). `read_committed` of three such
    partitions, whose fetches fill up with the first ones' records, reads every one to its
    end (it took a partition left out of a full response for one at an open transaction,
    and returned part of the topic)."""
    from streams import read_committed
    from streams.kafka import committed_reader
    from streams.runtime.transactions import new_transactional_producer

    topic = changelog_topic_name(changelog, "counts")
    outputs = f"{changelog}-outputs"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, [TopicSpec(outputs, 3)])
    finally:
        await admin.close()
    producer = new_transactional_producer(bootstrap, f"{changelog}-big")
    await asyncio.to_thread(producer.init_transactions, 30)
    model: dict[str, Any] = {}
    for round_ in range(2):
        producer.begin_transaction()
        for i in range(600):  # about 600 KB a partition, in many batches, against 64 KB
            key, value = f"k{i}", [round_, "x" * 1000]
            model[key] = value
            producer.produce(topic, key=KEYS.dumps(key), value=VALUES.dumps(value),
                             partition=0)
            producer.produce(outputs, key=KEYS.dumps(key), value=VALUES.dumps(value),
                             partition=i % 3)
        await asyncio.to_thread(producer.commit_transaction, 30)
    store = open_store(tmp_path, changelog)
    async with ChangelogReader(bootstrap, max_partition_fetch_bytes=64 * 1024,
                               committed_by_markers=on_tansu(bootstrap)) as reader:
        stats = await asyncio.wait_for(reader.restore([store]), 60)
    assert stats.records == 1_200
    assert dict(store.items()) == model
    store.close()
    small = functools.partial(committed_reader.FetchSettings,
                              max_partition_bytes=64 * 1024, max_bytes=96 * 1024)
    monkeypatch.setattr(committed_reader, "FetchSettings", small)
    read = await read_committed(bootstrap, outputs, key_serde="bytes", value_serde="bytes")
    assert len(read) == 1_200
