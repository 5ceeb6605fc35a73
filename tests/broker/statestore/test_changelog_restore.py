"""State survives and moves: stores write their changelog, restore from it, follow it as
standby copies, and refuse bad input with errors that say where it is. Real broker."""

from __future__ import annotations

import asyncio
import logging
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from statestore.changelog import ChangelogWriter
from statestore.errors import ChangelogDecodeError, StoreLockedError, TopicMismatchError
from statestore.restore import ChangelogReader
from statestore.serdes import OrderedKeySerde
from statestore.store import KeyValueStore, StoreSpec, changelog_topic_name, store_directory
from statestore.topics import COMPACTED, TopicSpec, ensure_topics
from tests.conftest import on_tansu, wait_until

pytestmark = pytest.mark.broker
PARTITIONS = 2


@pytest.fixture
async def app_id(admin: AIOKafkaAdminClient, unique: Callable[[str], str]) -> str:
    app = unique("app")
    await ensure_topics(
        admin, [TopicSpec(changelog_topic_name(app, "counts"), PARTITIONS, COMPACTED)]
    )
    return app


def open_store(state_dir: Path, app: str, partition: int = 1) -> KeyValueStore:
    task = f"0_{partition}"
    return KeyValueStore(
        StoreSpec("counts"),
        store_directory(state_dir, app, task, "counts"),
        changelog_topic_name(app, "counts"),
        partition,
    ).open()


async def write_history(
    store: KeyValueStore, producer: AIOKafkaProducer, ops: int, seed: int
) -> dict[str, int]:
    """Random puts, overwrites and deletes; returns what the store must hold afterwards."""
    rng = random.Random(seed)
    model: dict[str, int] = {}
    writer = ChangelogWriter(producer)
    for i in range(ops):
        key = f"k{rng.randrange(200)}"
        if rng.random() < 0.2:
            store.delete(key)
            model.pop(key, None)
        else:
            store.put(key, i)
            model[key] = i
        if i % 97 == 0:
            await writer.send_pending([store])
    await writer.flush([store])
    return model


async def test_restored_store_equals_last_value_per_key(
    tmp_path: Path, bootstrap: str, producer: AIOKafkaProducer, app_id: str
) -> None:
    source = open_store(tmp_path / "a", app_id)
    model = await write_history(source, producer, 3000, seed=1)
    assert dict(source.items()) == model
    source.commit()
    source.close()

    moved = open_store(tmp_path / "b", app_id)  # another machine: empty directory
    assert moved.position == 0
    async with ChangelogReader(bootstrap) as reader:
        stats = await reader.restore([moved], show_progress=False)
    # Every record the changelog holds (writes of one key between two sends coalesce).
    assert stats.records == source.position
    assert dict(moved.items()) == model
    assert moved.position == source.position
    # The other partition's changelog is untouched by this task.
    other = open_store(tmp_path / "b", app_id, partition=0)
    async with ChangelogReader(bootstrap) as reader:
        assert (await reader.restore([other], show_progress=False)).records == 0
    assert list(other.items()) == []


async def test_a_send_cancelled_on_a_full_producer_buffer_keeps_the_rest_queued(
    tmp_path: Path, bootstrap: str, producer: AIOKafkaProducer, app_id: str
) -> None:
    """A stopping thread cancels its process loop; if that lands while the producer waits
    for buffer room, the records not handed over yet stay queued for the final flush."""
    store = open_store(tmp_path / "a", app_id)
    model = {f"k{i}": "v" * 100 + str(i) for i in range(5000)}
    for key, value in model.items():
        store.put(key, value)
    writer = ChangelogWriter(producer)
    sending = asyncio.create_task(writer.send_pending([store]))
    while not writer._in_flight:
        await asyncio.sleep(0)
    # 5000 records of ~100 bytes cannot fit one 16 kB batch: the send is waiting for room.
    assert not sending.done()
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    await writer.flush([store])
    store.commit()
    store.close()

    moved = open_store(tmp_path / "b", app_id)
    async with ChangelogReader(bootstrap) as reader:
        stats = await reader.restore([moved], show_progress=False)
    assert stats.records == len(model)
    assert dict(moved.items()) == model


async def test_restart_with_checkpoint_replays_only_the_tail(
    tmp_path: Path, bootstrap: str, producer: AIOKafkaProducer, app_id: str
) -> None:
    store = open_store(tmp_path, app_id)
    model = await write_history(store, producer, 1000, seed=2)
    store.commit()
    checkpointed = store.position
    store.close()

    # Another copy of the task (the new owner after a move) writes 150 more records.
    elsewhere = open_store(tmp_path / "elsewhere", app_id)
    async with ChangelogReader(bootstrap) as reader:
        await reader.restore([elsewhere], show_progress=False)
    writer = ChangelogWriter(producer)
    for i in range(150):
        elsewhere.put(f"k{i}", -i)
        model[f"k{i}"] = -i
    elsewhere.delete("k0")
    model.pop("k0")
    await writer.flush([elsewhere])
    elsewhere.close()

    reopened = open_store(tmp_path, app_id)
    assert reopened.position == checkpointed
    async with ChangelogReader(bootstrap) as reader:
        stats = await reader.restore([reopened], show_progress=False)
    assert stats.records == 150  # "k0" was written and deleted between sends: one record
    assert dict(reopened.items()) == model


async def test_a_store_at_its_changelog_end_learns_so_without_the_fetch_max_wait(
    tmp_path: Path, bootstrap: str, producer: AIOKafkaProducer, app_id: str
) -> None:
    """A promoted standby is at its changelog's end already: the fetch that tells its reader
    so must not sit out the broker's max wait (every task taken over waited that long)."""
    source = open_store(tmp_path / "a", app_id)
    await write_history(source, producer, 300, seed=3)
    source.commit()
    copy = open_store(tmp_path / "b", app_id)
    async with ChangelogReader(bootstrap) as reader:
        await reader.restore([copy], show_progress=False)
    copy.commit()
    async with ChangelogReader(bootstrap, fetch_max_wait_ms=30_000) as reader:
        reader.register(copy)
        for _ in range(10):
            await reader.poll(timeout_ms=500)
            if reader.lag(copy) is not None:
                break
        # Without a fetch that skips the max wait, the end stays unknown for 30 s.
        assert reader.lag(copy) == 0
        # Once the end is known, an empty fetch waits at the broker again.
        await reader.poll(timeout_ms=500)
        assert reader._in_flight is not None and not reader._in_flight.done()
    source.close()
    copy.close()


async def test_standby_reports_lag_while_the_changelog_grows(
    tmp_path: Path, bootstrap: str, producer: AIOKafkaProducer, app_id: str
) -> None:
    active = open_store(tmp_path / "active", app_id)
    standby = open_store(tmp_path / "standby", app_id)
    writer = ChangelogWriter(producer)
    lags_seen: list[int] = []
    async with ChangelogReader(bootstrap, max_records=50) as reader:
        reader.register(standby)
        assert reader.lag(standby) is None  # the end is unknown until a fetch answered

        async def end_known() -> bool:
            # One poll may end before any fetch answered (a loaded machine): the end, and so
            # the lag, is known once one has.
            await reader.poll(timeout_ms=100)
            return reader.lag(standby) is not None

        for round_ in range(20):
            for i in range(200):
                active.put(f"k{i}", round_)
            await writer.flush([active])
            active.commit()
            await wait_until(end_known, message="a fetch to answer with the changelog's end")
            lag = reader.lag(standby)
            assert lag is not None
            # The lag is exactly the distance to the end the broker reported.
            assert lag == reader.progress(standby).end - standby.position
            assert standby.position <= active.position
            lags_seen.append(lag)

        async def caught_up() -> bool:
            await reader.poll(timeout_ms=100)
            return reader.lag(standby) == 0

        await wait_until(caught_up, message="the standby to catch up")
    assert max(lags_seen) > 0
    assert standby.position == active.position
    assert dict(standby.items()) == dict(active.items())


async def test_wrong_partition_count_is_a_clear_error(
    admin: AIOKafkaAdminClient, app_id: str
) -> None:
    topic = changelog_topic_name(app_id, "counts")
    with pytest.raises(TopicMismatchError, match=f"{topic} exists with {PARTITIONS} partitions"):
        await ensure_topics(admin, [TopicSpec(topic, PARTITIONS + 1, COMPACTED)])


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (None, msgpack.packb(1), "no key"),
        (OrderedKeySerde().dumps("k"), b"\xc1\xc1", "not valid msgpack"),
        (b"\x99garbage", msgpack.packb(1), "key starts with 0x99"),
    ],
)
async def test_undecodable_changelog_record_names_topic_partition_offset(
    tmp_path: Path,
    bootstrap: str,
    producer: AIOKafkaProducer,
    app_id: str,
    key: bytes | None,
    value: bytes,
    reason: str,
) -> None:
    if key is None and not on_tansu(bootstrap):
        pytest.skip("Apache Kafka refuses a record without a key on a compacted topic")
    topic = changelog_topic_name(app_id, "counts")
    store = open_store(tmp_path / "a", app_id)
    await write_history(store, producer, 10, seed=3)
    bad = await (await producer.send(topic, value=value, key=key, partition=1))
    store.close()

    fresh = open_store(tmp_path / "b", app_id)
    async with ChangelogReader(bootstrap) as reader:
        with pytest.raises(ChangelogDecodeError, match=reason) as info:
            await reader.restore([fresh], show_progress=False, timeout_s=30)
    assert (info.value.topic, info.value.partition, info.value.offset) == (topic, 1, bad.offset)
    assert f"{topic}[1]@{bad.offset}" in str(info.value)


async def test_corrupt_checkpoint_means_full_restore_with_a_warning(
    tmp_path: Path,
    bootstrap: str,
    producer: AIOKafkaProducer,
    app_id: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = open_store(tmp_path, app_id)
    model = await write_history(store, producer, 500, seed=4)
    store.commit()
    written = store.position
    store.close()
    checkpoint = tmp_path / app_id / "0_1" / "counts.checkpoint"
    assert checkpoint.exists()
    checkpoint.write_text("{not json")

    with caplog.at_level(logging.WARNING, logger="statestore"):
        reopened = open_store(tmp_path, app_id)
    assert str(checkpoint) in caplog.text
    assert reopened.position == 0
    assert list(reopened.items()) == []  # unvouched state was dropped, not trusted
    async with ChangelogReader(bootstrap) as reader:
        stats = await reader.restore([reopened], show_progress=False)
    assert stats.records == written
    assert dict(reopened.items()) == model


def test_store_held_by_another_process_is_a_clear_error(tmp_path: Path) -> None:
    directory = store_directory(tmp_path, "app", "0_0", "counts")
    holder = subprocess.Popen(
        [
            sys.executable, "-c",
            textwrap.dedent(f"""
                import sys, time
                from statestore.store import KeyValueStore, StoreSpec
                KeyValueStore(StoreSpec("counts"), {str(directory)!r}, "t", 0).open()
                print("open", flush=True)
                time.sleep(60)
            """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreLockedError, match=str(directory)) as info:
            KeyValueStore(StoreSpec("counts"), directory, "t", 0).open()
        assert str(holder.pid) in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    # Once the holder is gone the store opens.
    KeyValueStore(StoreSpec("counts"), directory, "t", 0).open().close()


def test_range_and_prefix_scans_follow_key_order(tmp_path: Path) -> None:
    store = KeyValueStore(StoreSpec("s", changelogged=False), tmp_path / "s", None, 0).open()
    for user in ["bob", "al", "alice", "b"]:
        for hour in [3, 1, 2]:
            store.put((user, hour), f"{user}@{hour}")
    assert [k for k, _ in store.prefix(("alice",))] == [("alice", 1), ("alice", 2), ("alice", 3)]
    assert [k[0] for k, _ in store.prefix("al")] == []  # tuple keys do not start with a str
    assert [k for k, _ in store.range(("al", 2), ("alice", 2))] == [
        ("al", 2), ("al", 3), ("alice", 1)
    ]
    assert next(iter(store.range(reverse=True)))[0] == ("bob", 3)
    store.delete(("b", 1))
    assert ("b", 1) not in store and store.get(("b", 2)) == "b@2"
    assert store.drain_changelog() == []  # not changelogged: nothing queued
    store.close()


def test_unsupported_store_name_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid store name"):
        StoreSpec("a/b")


async def test_unsent_changelog_records_block_a_commit(tmp_path: Path, app_id: str) -> None:
    store = open_store(tmp_path, app_id)
    store.put("k", 1)
    with pytest.raises(Exception, match="not sent yet"):
        store.commit()
    assert asyncio.get_running_loop()
