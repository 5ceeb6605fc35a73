"""``relay reset`` against the real broker: refused while the app runs, then, once it is
stopped, the app's next run counts its input again from the start (not on top of the old
counts), another app whose id starts with this one's keeps its topics, and the local state
named is gone."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from streams.runtime.task import StreamTask
from tests.broker.streams.harness import (
    counting_app,
    create_topics,
    list_topics,
    produce,
    read_all,
    run_relay,
    running,
)
from tests.conftest import on_tansu, wait_until

pytestmark = pytest.mark.broker


@pytest.mark.tansu
async def test_a_reset_app_counts_its_input_again_from_the_start(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    app_id = unique("reset")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 2, sink: 1, f"{app_id}-x-counts-changelog": 1})
    await produce(bootstrap, source, [(f"k{i % 4}", i) for i in range(40)])
    state = tmp_path / "state"

    def app() -> object:
        return counting_app(app_id, bootstrap, state, source, sink, stages=2)

    first = app()
    async with running(first):  # type: ignore[arg-type]
        await wait_until(lambda: sum(t.records_processed for t in tasks(first)) == 80,
                         timeout_s=60, message="the first run to count every record")
        code, out = await run_relay("reset", app_id, bootstrap=bootstrap)
        assert code == 2 and "is running" in out and "nothing changed" in out
    internal = {f"{app_id}-counts-changelog"} | {
        t for t in await list_topics(bootstrap) if t.startswith(app_id) and "repartition" in t}
    assert len(internal) == 2 and internal <= await list_topics(bootstrap)

    code, out = await run_relay("reset", app_id, "--dry-run", "--json",
                                "--state-dir", str(state), bootstrap=bootstrap)
    assert code == 0, out
    assert json.loads(out) == {"app": app_id, "dry_run": True,
                               "deleted_topics": sorted(internal), "sources": [source],
                               "deleted_state": [str(state / app_id)]}
    code, out = await run_relay("reset", app_id, "--state-dir", str(state),
                                bootstrap=bootstrap)
    assert code == 0, out
    assert f"{app_id} reset" in out
    left = await list_topics(bootstrap)
    assert not internal & left
    # Not the app's, though named like its changelogs: kept.
    assert {source, sink, f"{app_id}-x-counts-changelog"} <= left
    assert not (state / app_id).exists()

    second = app()
    async with running(second):  # type: ignore[arg-type]
        await wait_until(lambda: sum(t.records_processed for t in tasks(second)) == 80,
                         timeout_s=60, message="the second run to count every record again")
    finals: dict[str, int] = {}
    for key, count in await read_all(bootstrap, sink, 1):
        finals[key] = count
    assert finals == {f"k{i}": 10 for i in range(4)}  # not 20: counted from the start


def tasks(app: object) -> list[StreamTask]:
    return [task for thread in app.threads  # type: ignore[attr-defined]
            for task in thread.tasks.values()]


async def test_a_reset_waits_for_stopped_static_members_and_names_them(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    """A static member stays in the group after a clean stop, until its session expires: the
    reset is refused naming it, with the command that removes it; then it goes through.
    (The embedded broker deletes a group with stopped static members in it.)"""
    if on_tansu(bootstrap):
        pytest.skip("the embedded broker deletes a group whose static members stopped")
    app_id = unique("reset-static")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    await create_topics(bootstrap, {source: 1, sink: 1})
    await produce(bootstrap, source, [("k", i) for i in range(5)])
    app = counting_app(app_id, bootstrap, tmp_path / "s", source, sink, "node-q")
    async with running(app):
        await wait_until(lambda: sum(t.records_processed for t in tasks(app)) == 5,
                         timeout_s=60, message="the app to count")
    # A dry run meets what the reset would: it says so rather than what it would delete.
    code, out = await run_relay("reset", app_id, "--dry-run", bootstrap=bootstrap)
    assert code == 2 and "(node-q)" in out and "would delete" not in out, out
    code, out = await run_relay("reset", app_id, bootstrap=bootstrap)
    assert code == 2 and "(node-q)" in out, out
    assert f"relay remove-members {app_id} node-q" in out
    code, out = await run_relay("remove-members", app_id, "node-q", bootstrap=bootstrap)
    assert code == 0, out
    code, out = await run_relay("reset", app_id, bootstrap=bootstrap)
    assert code == 0 and f"topic {app_id}-counts-changelog: deleted" in out, out
