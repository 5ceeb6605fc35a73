"""A process that queues records on a data producer with Relay's settings and stops itself
(SIGSTOP) before they go out, as a worker frozen between handing its records and their send:
``python -m tests.broker.streams.apps.zombie_producer BOOTSTRAP TOPIC SESSION_MS
HEARTBEAT_MS COUNT``. Resumed (SIGCONT), it serves its delivery reports until every queued
record has one, without flushing (its librdkafka threads alone decide what is sent), and
prints them as JSON: ``{"delivered": n, "errors": {name: n}}``."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from typing import Any

from confluent_kafka import Producer

from streams.runtime.delivery import data_producer_settings, message_timeout_ms

#: Long enough that nothing queued goes out before the process stops itself, shorter than
#: any ``message.timeout.ms`` the test sets (librdkafka requires it).
LINGER_MS = 2_000
#: How long the resumed process serves reports before it gives up.
REPORTS_S = 60.0
#: How long it tries to get its first record through.
READY_S = 60.0


def main(bootstrap: str, topic: str, session_ms: int, heartbeat_ms: int, count: int) -> int:
    settings = data_producer_settings(bootstrap, "zombie-data",
                                      message_timeout_ms(session_ms, heartbeat_ms))
    producer = Producer({**settings, "linger.ms": LINGER_MS})
    # A first record, flushed (a flush sends at once, whatever the linger): the producer is
    # connected and has its producer id, as a worker's is in the middle of its work. Sent
    # again while it times out (its timeout is short, and a loaded machine slow to connect).
    first: list[Any] = []
    deadline = time.monotonic() + READY_S
    while None not in first and time.monotonic() < deadline:
        producer.produce(topic, value=b"ready", on_delivery=lambda err, msg: first.append(err))
        producer.flush(READY_S)
    if None not in first:
        print(json.dumps({"ready": [str(err) for err in first]}), flush=True)
        return 2
    reports: Counter[str] = Counter()

    def delivered(err: Any, msg: Any) -> None:
        reports["delivered" if err is None else err.name()] += 1

    for i in range(count):
        producer.produce(topic, value=f"queued-{i}".encode(), on_delivery=delivered)
    os.kill(os.getpid(), signal.SIGSTOP)
    deadline = time.monotonic() + REPORTS_S
    while sum(reports.values()) < count and time.monotonic() < deadline:
        producer.poll(0.1)
    errors = {name: n for name, n in reports.items() if name != "delivered"}
    print(json.dumps({"delivered": reports["delivered"], "errors": errors}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                  int(sys.argv[5])))
