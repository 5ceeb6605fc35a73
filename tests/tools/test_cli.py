"""The ``relay`` tool against the real broker and running apps: describe, mark-leaving and
remove-members, and their error cases (unknown app or instance, unreachable broker, bad
arguments) with exit codes and nothing changed."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka.client import AIOKafkaClient

from streams.membership import describe_group
from tests.conftest import wait_until
from tests.streams.harness import counting_app, create_topics, produce, read_all, running

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[2]


async def relay(*args: str, bootstrap: str | None = None) -> tuple[int, str]:
    command = [sys.executable, "-m", "tools.cli", *args]
    if bootstrap is not None:
        command += ["--bootstrap", bootstrap]
    python_path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    process = await asyncio.create_subprocess_exec(
        *command, cwd=tempfile.gettempdir(), env={**os.environ, "PYTHONPATH": python_path},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode or 0, out.decode()




async def test_errors_exit_non_zero_and_change_nothing(bootstrap: str) -> None:
    code, out = await relay("describe", "no-such-app", bootstrap=bootstrap)
    assert code == 2 and "unknown app 'no-such-app'" in out
    code, out = await relay("describe", "x", bootstrap="127.0.0.1:1")
    assert code == 3 and "cannot reach the broker at 127.0.0.1:1" in out
    code, out = await relay("mark-leaving", "no-such-app", "node-1", bootstrap=bootstrap)
    assert code == 2 and "unknown app" in out
    code, out = await relay("mark-leaving", "app", bootstrap=bootstrap)
    assert code == 2 and "Missing argument" in out
    code, out = await relay("mark-leaving", "app", "n", "--timeout-ms", "-5", bootstrap=bootstrap)
    assert code == 2 and "--timeout-ms" in out
    code, out = await relay("--help")
    assert code == 0 and "describe" in out and "mark-leaving" in out


async def test_describe_and_remove_members(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    app_id = unique("cli")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 4, sink: 1})
    await produce(bootstrap, source, [(f"k{i % 5}", i) for i in range(100)])
    stays = counting_app(app_id, bootstrap, tmp_path / "a", source, sink, "node-a", num_standbys=1)
    goes = counting_app(app_id, bootstrap, tmp_path / "b", source, sink, "node-b", num_standbys=1)
    async with running(stays):
        async with running(goes):
            await wait_until(
                lambda: bool(stays.threads and goes.threads)
                and len(stays.threads[0].tasks) == 2 and len(goes.threads[0].tasks) == 2,
                timeout_s=150, message="the two members to share the tasks",
            )
            await asyncio.sleep(1.5)  # let each member publish its latest status
            code, out = await relay("describe", app_id, "--json", bootstrap=bootstrap)
            assert code == 0, out
            described = json.loads(out)
            members = described["members"]
            assert set(members) == {"node-a-thread-0", "node-b-thread-0"}
            tasks = described["tasks"]
            assert sorted(tasks) == ["0_0", "0_1", "0_2", "0_3"]
            owners = {t: v["active"] for t, v in tasks.items()}
            assert sorted(owners.values()) == ["node-a-thread-0"] * 2 + ["node-b-thread-0"] * 2
            assert owners == {t: m for m, s in members.items() for t in s["active"]}
            code, out = await relay("describe", app_id, bootstrap=bootstrap)
            assert code == 0 and "node-a-thread-0" in out and "0_3" in out

            code, out = await relay("remove-members", app_id, "node-zzz", bootstrap=bootstrap)
            assert code == 2 and "node-zzz" in out and "not a member" in out
        # node-b stopped without leaving (static): the group still counts it as a member.
        client = AIOKafkaClient(bootstrap_servers=bootstrap)
        await client.bootstrap()
        try:
            ids = {m.member_id for m in (await describe_group(client, app_id)).members}
            assert any(m.startswith("node-b-thread-0-") for m in ids)
            code, out = await relay("remove-members", app_id, "node-b", bootstrap=bootstrap)
            assert code == 0 and "node-b-thread-0: removed" in out

            async def gone() -> bool:
                group = await describe_group(client, app_id)
                return not any(m.member_id.startswith("node-b-") for m in group.members)

            await wait_until(gone, timeout_s=30, message="node-b to be removed")
        finally:
            await client.close()
        await wait_until(lambda: len(stays.threads[0].tasks) == 4, timeout_s=150,
                         message="node-a to take node-b's tasks")
    assert await read_all(bootstrap, sink, 1)
