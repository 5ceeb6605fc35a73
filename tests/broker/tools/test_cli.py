"""The ``relay`` tool against the real broker and running apps: describe, mark-leaving,
unmark-leaving and remove-members, and their error cases (unknown app or instance,
unreachable broker, bad arguments) with exit codes and nothing changed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka.client import AIOKafkaClient

from streams.group.control import LeavingMark, control_topic_name, encode_mark, read_marks
from streams.kafka.membership import describe_group
from tests.broker.streams.harness import (
    counting_app,
    create_topics,
    produce,
    published,
    read_all,
    run_relay,
    running,
)
from tests.conftest import on_tansu, wait_until

pytestmark = pytest.mark.broker


async def test_errors_exit_non_zero_and_change_nothing(bootstrap: str) -> None:
    code, out = await run_relay("describe", "no-such-app", bootstrap=bootstrap)
    assert code == 2 and "unknown app 'no-such-app'" in out
    code, out = await run_relay("describe", "wordcount:app", bootstrap=bootstrap)
    assert code == 2 and "APP here is the application id" in out
    code, out = await run_relay("describe", "x", bootstrap="127.0.0.1:1")
    assert code == 3 and "cannot reach the broker at 127.0.0.1:1" in out
    assert [line for line in out.splitlines() if line.strip()] == [out.strip()]  # one line
    code, out = await run_relay("mark-leaving", "no-such-app", "node-1", bootstrap=bootstrap)
    assert code == 2 and "unknown app" in out
    code, out = await run_relay("mark-leaving", "app", bootstrap=bootstrap)
    assert code == 2 and "Missing argument" in out
    code, out = await run_relay("mark-leaving", "app", "n", "--timeout-ms", "-5",
                                bootstrap=bootstrap)
    assert code == 2 and "--timeout-ms" in out
    code, out = await run_relay("unmark-leaving", "no-such-app", "node-1", bootstrap=bootstrap)
    assert code == 2 and "unknown app 'no-such-app'" in out
    code, out = await run_relay("--help")
    assert code == 0 and "describe" in out and "mark-leaving" in out and "unmark-leaving" in out


@pytest.mark.tansu
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
            await published(bootstrap, app_id, {"node-a-thread-0": 2, "node-b-thread-0": 2})
            code, out = await run_relay("describe", app_id, "--json", bootstrap=bootstrap)
            assert code == 0, out
            described = json.loads(out)
            members = described["members"]
            assert set(members) == {"node-a-thread-0", "node-b-thread-0"}
            leader = next(a for a in (stays, goes) if a.threads[0].assignor.is_leader)
            assert [m for m, s in members.items() if s["leader"]] == [
                f"{leader.config.group_instance_id}-thread-0"]
            tasks = described["tasks"]
            assert sorted(tasks) == ["0_0", "0_1", "0_2", "0_3"]
            owners = {t: v["active"] for t, v in tasks.items()}
            assert sorted(owners.values()) == ["node-a-thread-0"] * 2 + ["node-b-thread-0"] * 2
            assert owners == {t: m for m, s in members.items() for t in s["active"]}
            # Apache Kafka holds each member's subscription and assignment: describe shows
            # the last round as the broker has it. Tansu keeps none.
            if on_tansu(bootstrap):
                assert described["broker_members"] is None
            else:
                assigned = {m["static_id"]: sorted(m["active"])
                            for m in described["broker_members"]}
                assert assigned == {m: sorted(s["active"]) for m, s in members.items()}
            code, out = await run_relay("describe", app_id, bootstrap=bootstrap)
            assert code == 0 and "node-a-thread-0" in out and "0_3" in out

            code, out = await run_relay("remove-members", app_id, "node-zzz", bootstrap=bootstrap)
            assert code == 2 and "node-zzz" in out and "not a member" in out
            # A running instance is not removed: it would rejoin at once.
            code, out = await run_relay("remove-members", app_id, "node-a", bootstrap=bootstrap)
            assert code == 2 and "node-a (published its status" in out and "looks alive" in out
            # Marking every instance would leave the tasks nowhere to go: refused.
            code, out = await run_relay("mark-leaving", app_id, "node-a", "node-b",
                                        bootstrap=bootstrap)
            assert code == 2 and "would leave no instance" in out
            assert stays.leaving.mark is None and goes.leaving.mark is None
        # node-b stopped without leaving (static): the group still counts it as a member.
        client = AIOKafkaClient(bootstrap_servers=bootstrap)
        await client.bootstrap()
        try:
            ids = {m.member_id for m in (await describe_group(client, app_id)).members}
            assert any(m.startswith("node-b-thread-0-") for m in ids)
            code, out = await run_relay("remove-members", app_id, "node-b", bootstrap=bootstrap)
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
    # Nobody runs the app: describe still names every task, from its published topology.
    code, out = await run_relay("describe", app_id, "--json", bootstrap=bootstrap)
    assert code == 0, out
    assert json.loads(out)["unowned"] == ["0_0", "0_1", "0_2", "0_3"], out


async def test_a_leaving_mark_taken_back_keeps_its_instance(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    """Both instances marked leaving (written by hand: the tool refuses it) have nowhere to
    hand their tasks and keep them. ``relay unmark-leaving`` takes node-b's mark back: the
    group hears that node-b stays, node-a hands everything to it and shuts down, and node-b
    runs on with every task."""
    app_id = unique("unmark")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 4, sink: 1})
    await produce(bootstrap, source, [(f"k{i % 5}", i) for i in range(100)])
    node_a = counting_app(app_id, bootstrap, tmp_path / "a", source, sink, "node-a")
    node_b = counting_app(app_id, bootstrap, tmp_path / "b", source, sink, "node-b")
    async with running(node_a) as a_runs, running(node_b) as b_runs:
        def both_run_tasks() -> bool:
            counts = [len(t.tasks) for t in node_a.threads + node_b.threads]
            return len(counts) == 2 and sum(counts) == 4 and 0 not in counts

        await wait_until(both_run_tasks, timeout_s=120, message="both instances running tasks")
        mark = LeavingMark(int(time.time() * 1000), None)
        await produce(bootstrap, control_topic_name(app_id),
                      [(b"node-a", encode_mark(mark)), (b"node-b", encode_mark(mark))], raw=True)
        await wait_until(lambda: node_a.leaving.mark is not None
                         and node_b.leaving.mark is not None, message="both marked")
        assert set(await read_marks(bootstrap, app_id) or {}) == {"node-a", "node-b"}

        code, out = await run_relay("unmark-leaving", app_id, "node-b", "node-c",
                                    bootstrap=bootstrap)
        assert code == 0, out
        assert "no longer leaving: node-b" in out and "not marked, left as they are: node-c" in out
        assert set(await read_marks(bootstrap, app_id) or {}) == {"node-a"}
        await wait_until(lambda: a_runs.done(), timeout_s=120,
                         message="node-a to hand over and shut down")
        assert a_runs.exception() is None
        await wait_until(lambda: len(node_b.threads[0].tasks) == 4, timeout_s=60,
                         message="node-b to run every task")
        assert not b_runs.done() and node_b.leaving.mark is None
