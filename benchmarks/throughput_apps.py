"""The throughput benchmark's workers, one strategy per process:
``python -m benchmarks.throughput_apps STRATEGY`` (faust-streaming runs from
:mod:`benchmarks.throughput_faust_app` under its own command line).

- ``relay``: the counting app in Relay's DSL (a count per key in a RocksDB store with a
  changelog, every update sent on), configured only through ``App``'s settings, so it
  measures whichever runtime is installed;
- ``quix``: the same app in Quix Streams (a stateful ``apply`` over its RocksDB state with
  changelog topics);
- ``aiokafka-consume``, ``confluent-consume``: the ceilings of consuming alone;
- ``aiokafka-passthrough``, ``confluent-passthrough``: consuming and producing every record
  unchanged, no state: the ceiling of any app with one output per input.

Every one reads the prefilled input from the start in a group of its own, commits its
offsets every ``BENCH_COMMIT_MS`` (the ceilings flush their producer first, as an
at-least-once app must), counts each record done (:mod:`benchmarks.throughput_progress`)
and runs until SIGTERM, on which it flushes, commits and exits. Outputs keep the input's key
(a msgpack string); the stateful apps' values are the key's count (a msgpack int).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time

import msgpack

from benchmarks.throughput_progress import Progress, settings

STRATEGIES = ("relay", "quix", "aiokafka-consume", "aiokafka-passthrough",
              "confluent-consume", "confluent-passthrough")


def run_relay(s: dict[str, str], progress: Progress) -> None:
    from streams.app import App

    app = App(s["group"], bootstrap_servers=s["bootstrap"], state_dir=s["state_dir"],
              commit_interval_ms=int(s["commit_ms"]),
              processing_guarantee=s.get("guarantee", "at_least_once"))
    (app.stream(s["input"]).group_by_key().count(store="counts").to_stream()
     .peek(progress.hit).to(s["output"]))
    app.run()


def run_quix(s: dict[str, str], progress: Progress) -> None:
    from quixstreams import Application

    app = Application(broker_address=s["bootstrap"], consumer_group=s["group"],
                      auto_offset_reset="earliest", commit_interval=int(s["commit_ms"]) / 1000,
                      state_dir=s["state_dir"], loglevel="WARNING")
    source = app.topic(s["input"], key_deserializer="bytes", value_deserializer="bytes")
    sink = app.topic(s["output"], key_serializer="bytes", value_serializer="bytes")

    def count(_value: bytes, state: object) -> bytes:
        n = state.get("n", 0) + 1  # type: ignore[attr-defined]
        state.set("n", n)  # type: ignore[attr-defined]
        return msgpack.packb(n)

    sdf = app.dataframe(source).apply(count, stateful=True)
    sdf.update(progress.hit).to_topic(sink)
    app.run()


async def run_aiokafka(s: dict[str, str], progress: Progress, produce: bool) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    consumer = AIOKafkaConsumer(s["input"], bootstrap_servers=s["bootstrap"],
                                group_id=s["group"], enable_auto_commit=False,
                                auto_offset_reset="earliest")
    # Relay's producer settings, so the passthrough is the ceiling of the same writes.
    producer = AIOKafkaProducer(bootstrap_servers=s["bootstrap"], acks="all", linger_ms=5)
    await consumer.start()
    if produce:
        await producer.start()
    commit_s = int(s["commit_ms"]) / 1000
    next_commit = time.monotonic() + commit_s
    output = s["output"]
    try:
        while not stop.is_set():
            # Batches like confluent-kafka's ``consume(num_messages=1000)``: one getmany can
            # otherwise return a whole prefetched input at once, too fast to sample.
            batches = await consumer.getmany(timeout_ms=100, max_records=1000)
            for records in batches.values():
                if produce:
                    for record in records:
                        await producer.send(output, key=record.key, value=record.value)
                progress.add(len(records))
            if time.monotonic() >= next_commit:
                if produce:
                    await producer.flush()
                await consumer.commit()
                next_commit = time.monotonic() + commit_s
        if produce:
            await producer.flush()
        await consumer.commit()
    finally:
        await consumer.stop()
        if produce:
            await producer.stop()


def run_confluent(s: dict[str, str], progress: Progress, produce: bool) -> None:
    from confluent_kafka import Consumer, KafkaException, Producer

    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    consumer = Consumer({"bootstrap.servers": s["bootstrap"], "group.id": s["group"],
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": s["bootstrap"], "acks": "all", "linger.ms": 5})
    consumer.subscribe([s["input"]])
    commit_s = int(s["commit_ms"]) / 1000
    next_commit = time.monotonic() + commit_s
    output = s["output"]

    def commit() -> None:
        if produce:
            producer.flush()
        # Nothing consumed yet is nothing to commit.
        with contextlib.suppress(KafkaException):
            consumer.commit(asynchronous=False)

    try:
        while not stopping:
            records = consumer.consume(num_messages=1000, timeout=0.1)
            for record in records:
                if record.error():
                    raise KafkaException(record.error())
                if produce:
                    while True:
                        try:
                            producer.produce(output, record.value(), record.key())
                            break
                        except BufferError:
                            producer.poll(0.05)
            if produce:
                producer.poll(0)
            progress.add(len(records))
            if time.monotonic() >= next_commit:
                commit()
                next_commit = time.monotonic() + commit_s
        commit()
    finally:
        consumer.close()


def main(argv: list[str]) -> None:
    [strategy] = argv
    s = settings()
    progress = Progress().start()
    if strategy == "relay":
        run_relay(s, progress)
    elif strategy == "quix":
        run_quix(s, progress)
    elif strategy.startswith("aiokafka-"):
        asyncio.run(run_aiokafka(s, progress, produce=strategy.endswith("passthrough")))
    elif strategy.startswith("confluent-"):
        run_confluent(s, progress, produce=strategy.endswith("passthrough"))
    else:
        raise SystemExit(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")


if __name__ == "__main__":
    main(sys.argv[1:])
