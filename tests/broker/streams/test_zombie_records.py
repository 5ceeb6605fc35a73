"""What at-least-once relies on against a zombie (see streams.runtime.delivery): records a
worker's data producer queued before a stop longer than their ``message.timeout.ms`` are
expired by librdkafka when the process resumes, never sent, whatever its Python side does;
with a timeout longer than the stop, the same records do go out (the test's control)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.broker.streams.harness import ROOT, create_topics, read_all
from tests.conftest import wait_until

pytestmark = pytest.mark.broker

#: How long the producer's process stays stopped: past the 3 s timeout of a 4 s session with
#: 1 s heartbeats, within the 59 s of a 60 s session. The stop is the fault itself.
STOP_S = 5.0
QUEUED = 100


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize(("session_ms", "sent"), [(4_000, False), (60_000, True)],
                         ids=["stop-past-the-timeout", "stop-within-the-timeout"])
async def test_records_queued_before_a_stop_past_their_timeout_are_never_sent(
    bootstrap: str, unique: Callable[[str], str], session_ms: int, sent: bool,
) -> None:
    topic = unique("zombie-records")
    await create_topics(bootstrap, {topic: 1})
    python_path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.broker.streams.apps.zombie_producer", bootstrap, topic,
         str(session_ms), "1000", str(QUEUED)],
        env={**os.environ, "PYTHONPATH": python_path}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, cwd=Path(ROOT))
    try:
        await wait_until(lambda: child.poll() is None and stopped(child.pid), timeout_s=60,
                         message="the producer to queue its records and stop")
        await asyncio.sleep(STOP_S)
        child.send_signal(signal.SIGCONT)
        out, _ = await asyncio.to_thread(child.communicate, timeout=90)
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait()
    text = out.decode(errors="replace")
    assert child.returncode == 0, text[-3000:]
    reports = json.loads(text.strip().splitlines()[-1])
    expected = [f"queued-{i}".encode() for i in range(QUEUED)] if sent else []
    values: list[bytes] = []

    async def read() -> bool:
        # Written before the queued records: once it is read, so are they, if any landed.
        values[:] = [value for _, value, _ in await read_all(bootstrap, topic, 1, raw=True)]
        return b"ready" in values and len(values) >= len(expected) + 1

    await wait_until(read, timeout_s=60, message="the topic's records to be read")
    queued = [value for value in values if value != b"ready"]
    if sent:
        assert reports == {"delivered": QUEUED, "errors": {}}
    else:
        # Expired by the timeout scan on resuming, before any send; the process is gone, so
        # nothing of them can still arrive.
        assert reports == {"delivered": 0, "errors": {"_MSG_TIMED_OUT": QUEUED}}
    assert queued == expected
