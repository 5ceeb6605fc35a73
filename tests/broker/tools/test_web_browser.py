"""``relay web`` in a real headless Chromium (Debian's package, driven by Playwright): two
workers share an app, one is marked leaving with the CLI, and the rendered page shows the
learner appear on the other, become ready and take the task over.

Skips only when Chromium is absent (``.ci/install-chromium`` installs it). Set
RELAY_WEB_SCREENSHOTS to a folder to keep screenshots of the page while learners catch up
(``web-view.png``; once they took over when no snapshot caught one) and after the moves
(``web-view-moved.png``), and of the topology an app with a session window, a table-table
and a foreign-key join publishes (``web-topology.png``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, async_playwright

from streams.app import App
from streams.group.status_topic import read_status
from tests.broker.streams.apps.dsl_ops import build as build_dsl_ops
from tests.broker.streams.harness import (
    ROOT,
    counting_topics,
    create_topics,
    run_relay,
    spawn_app,
    spawn_worker,
    static_group,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.broker

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]
STAYS, LEAVES = "node-a-thread-0", "node-b-thread-0"

#: What the page shows, read from its DOM (the data attributes the renderer sets).
READ_PAGE = """() => {
  const tasks = {};
  for (const row of document.querySelectorAll("tr.task")) {
    tasks[row.dataset.task] = {
      active: row.dataset.active,
      stateful: row.dataset.stateful,
      learners: [...row.querySelectorAll('.copy[data-role="learner"]')].map((c) => ({
        member: c.dataset.member, ready: c.dataset.ready === "true",
        tags: [...c.querySelectorAll(".tag")].map((t) => t.dataset.tag).filter(Boolean)})),
      tags: [...row.querySelectorAll("td:nth-child(2) .tag")]
        .map((t) => t.dataset.tag).filter(Boolean),
    };
  }
  return {
    connection: document.getElementById("connection").dataset.state,
    leader: document.getElementById("leader").textContent,
    members: [...document.querySelectorAll("li.thread")].map((t) => t.dataset.member),
    leaving: [...document.querySelectorAll("li.leaving-item")].map((l) => ({
      instance: l.dataset.instance, deadline: l.dataset.deadlineMs})),
    moves: [...document.querySelectorAll('li.event[data-kind="moved"]')].map((e) => ({
      task: e.dataset.task, cause: e.dataset.cause, text: e.textContent})),
    events: [...document.querySelectorAll("li.event")].reverse().map((e) => ({
      kind: e.dataset.kind, task: e.dataset.task, cause: e.dataset.cause,
      members: e.dataset.members ? e.dataset.members.split(" ") : []})),
    lanes: Object.fromEntries([...document.querySelectorAll(".lane")].map((l) => [
      l.dataset.task,
      [...l.querySelectorAll(".span")].map((s) => ({
        member: s.dataset.member, role: s.dataset.role}))])),
    tasks,
  };
}"""

requires_chromium = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"Debian's chromium is not installed at {CHROMIUM} (bash .ci/install-chromium)",
)


@contextlib.asynccontextmanager
async def web_view(app_id: str, bootstrap: str) -> AsyncIterator[str]:
    """``relay web`` as a process of its own; yields the page's address."""
    python_path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tools.cli", "web", app_id, "--bootstrap", bootstrap,
        "--port", "0", "--window-minutes", "2",
        env={**os.environ, "PYTHONPATH": python_path},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert " at http://" in line, f"relay web did not start: {line!r}"
        yield line.split(" at ", 1)[1].split()[0]
    finally:
        if process.returncode is None:
            process.terminate()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait(), 15)
        if process.returncode is None:
            process.kill()


async def read_page(page: Page) -> dict[str, Any]:
    return await page.evaluate(READ_PAGE)


def timeline_steps(events: list[dict[str, Any]], task: str) -> list[str]:
    """What the timeline (oldest event first) tells of ``task`` on node-a before the
    scale-down's move of it there: its learner appearing, then being ready."""
    move = max(i for i, e in enumerate(events) if e["kind"] == "moved" and e["task"] == task
               and e["cause"] == "scale-down" and e["members"] == [LEAVES, STAYS])
    return [e["kind"] for e in events[:move] if e["task"] == task
            and e["members"] == [STAYS] and e["kind"] in ("learner", "ready")]


def stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()


@requires_chromium
@pytest.mark.timeout(900)
async def test_the_page_shows_a_learner_catch_up_and_take_over(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    app_id = unique("web")
    source, sink, traffic = await counting_topics(bootstrap, app_id, 2000)
    # Nobody restarts here, so a static session shorter than a restart needs keeps rounds short.
    workers = [
        spawn_worker(app_id, bootstrap, tmp_path / name, source, sink,
                     group_instance_id=name,
                     **{**static_group(bootstrap), "session_timeout_ms": 12_000})
        for name in ("node-a", "node-b")
    ]
    try:
        # Both start at once, but one may take every task first and hand two over through
        # learners: several join rounds of static members (about ten seconds each here).
        async def sharing() -> bool:
            status = await read_status(bootstrap, app_id)
            return all(len(status.get(m, {}).get("active", [])) == 2 for m in (STAYS, LEAVES))

        await wait_until(sharing, timeout_s=240, interval_s=1,
                         message="the two workers to run two tasks each")
        traffic.start()
        async with web_view(app_id, bootstrap) as url, async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM,
                                                      args=CHROMIUM_FLAGS)
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            await page.goto(url)

            seen: dict[str, Any] = {}

            async def shows(condition: Callable[[dict[str, Any]], bool]) -> bool:
                seen.update(await read_page(page))
                return condition(seen)

            def shared(view: dict[str, Any]) -> bool:
                owners = [t["active"] for t in view["tasks"].values()]
                return view["connection"] == "live" and sorted(owners) == [STAYS] * 2 + [LEAVES] * 2

            await wait_until(lambda: shows(shared), timeout_s=60,
                             message="the page to show both members with two tasks each")
            assert set(seen["members"]) == {STAYS, LEAVES}
            assert seen["leader"] in (STAYS, LEAVES)
            handed = sorted(t for t, v in seen["tasks"].items() if v["active"] == LEAVES)

            code, out = await run_relay("mark-leaving", app_id, "node-b", "--timeout-ms",
                                        "300000", bootstrap=bootstrap)
            assert code == 0, out

            learned: dict[str, list[str]] = {t: [] for t in handed}  # what each task went through
            screenshot = tmp_path / "web-view.png"
            deadlines: set[str] = set()

            async def watch() -> bool:
                view = await read_page(page)
                seen.update(view)
                deadlines.update(m["deadline"] for m in view["leaving"]
                                 if m["instance"] == "node-b")
                for task in handed:
                    state = view["tasks"].get(task, {})
                    steps = learned[task]
                    for learner in state.get("learners", []):
                        if learner["member"] != STAYS:
                            continue
                        assert "isLearner" in learner["tags"]
                        if "learner" not in steps:
                            steps.append("learner")
                            if not screenshot.exists():
                                await page.screenshot(path=str(screenshot), full_page=True)
                        if learner["ready"] and "ready" not in steps:
                            assert "isReady" in learner["tags"]
                            steps.append("ready")
                    if state.get("active") == STAYS and "active" not in steps:
                        steps.append("active")
                return all("active" in steps for steps in learned.values())

            await wait_until(watch, timeout_s=240, interval_s=0.1,
                             message=f"node-a to learn and take over {handed} on the page")
            if not screenshot.exists():  # no snapshot caught a learner: the timeline tells
                await page.screenshot(path=str(screenshot), full_page=True)
            for task in handed:
                assert seen["tasks"][task]["stateful"] == "true"
            # The mark carries the timeout given to the CLI, so its deadline is known.
            assert deadlines and "unknown" not in deadlines, deadlines

            def moved(view: dict[str, Any]) -> bool:
                # A task may have moved before too (one worker can take every task first and
                # hand two over through learners): the timeline lists each of its moves.
                return all(any(m["task"] == t and m["cause"] == "scale-down"
                               for m in view["moves"]) for t in handed)

            try:
                await wait_until(lambda: shows(moved), timeout_s=30,
                                 message="the timeline to show the moves of the scale-down")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; the timeline's moves: {seen['moves']}") from None
            # Each handed task went learner -> ready -> active on node-a. A learner can catch
            # up and be promoted within the page's push interval, so a step no snapshot showed
            # is read from the timeline: before the scale-down's move, the event of it.
            for task in handed:
                steps, told = learned[task], timeline_steps(seen["events"], task)
                assert steps in (["learner", "ready", "active"], ["learner", "active"],
                                 ["active"]), (task, steps, told)
                # Listed by the timeline in that order (a copy dropped and given again would
                # come twice).
                assert told[-1:] == ["ready"] and "learner" in told, (task, steps, told)
            await wait_until(lambda: shows(lambda v: v["members"] == [STAYS]), timeout_s=120,
                             message="node-b to hand over, stop and leave the page")
            await wait_until(lambda: shows(lambda v: not v["leaving"]), timeout_s=60,
                             message="node-b's leaving mark to be deleted once it left")
            # The lanes show each handed task run by node-b, learned by node-a, then run by it.
            for task in handed:
                spans = seen["lanes"][task]
                assert {"member": LEAVES, "role": "active"} in spans, spans
                last_run = max(i for i, span in enumerate(spans)
                               if span == {"member": STAYS, "role": "active"})
                assert {"member": STAYS, "role": "learner"} in spans[:last_run], spans
            await page.screenshot(path=str(tmp_path / "web-view-moved.png"), full_page=True)
            await browser.close()
        assert screenshot.exists()
        keep = os.environ.get("RELAY_WEB_SCREENSHOTS")
        if keep:
            for name in ("web-view.png", "web-view-moved.png"):
                shutil.copyfile(tmp_path / name, Path(keep) / name)
    finally:
        await traffic.stop()
        for worker in workers:
            stop(worker)


#: The drawn topology, read from the SVG the page built.
READ_TOPOLOGY = """() => {
  const graph = document.getElementById("topology-graph");
  if (!graph) return null;
  return {
    nodes: [...graph.querySelectorAll("g.topo-node")].map((n) => ({
      id: n.dataset.id, kind: n.dataset.kind, sub: n.dataset.sub,
      text: [...n.querySelectorAll("text")].map((t) => t.textContent)})),
    boxes: [...graph.querySelectorAll("g.topo-box text")].map((t) => t.textContent),
    edges: [...graph.querySelectorAll("path.topo-edge")].map((e) =>
      [e.dataset.source, e.dataset.target]),
    meta: document.getElementById("topology-meta").textContent,
    problem: document.getElementById("problem").hidden ? null
      : document.getElementById("problem").textContent,
  };
}"""


@requires_chromium
@pytest.mark.timeout(300)
async def test_the_page_draws_the_topology_the_running_app_published(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    prefix = unique("webtopo")
    await create_topics(bootstrap, {f"{prefix}-{t}": 1 for t in (
        "clicks", "left", "right", "orders", "sessions", "joined", "enriched")})
    description = build_dsl_ops(App(prefix, bootstrap_servers="127.0.0.1:1"), prefix).describe()
    worker = spawn_app("tests.broker.streams.apps.dsl_ops:app", {"DSL_PREFIX": prefix}, prefix,
                       bootstrap, tmp_path / "state", group_instance_id="node-a")
    try:
        async def running() -> bool:
            status = (await read_status(bootstrap, prefix)).get("node-a-thread-0", {})
            return status.get("pid") == worker.pid and status.get("state") == "running"

        await wait_until(running, timeout_s=120, message="the app to run")
        async with web_view(prefix, bootstrap) as url, async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM,
                                                      args=CHROMIUM_FLAGS)
            page = await browser.new_page(viewport={"width": 1600, "height": 1000})
            await page.goto(url)
            drawn: dict[str, Any] = {}

            async def drawing() -> bool:
                drawn.update(await page.evaluate(READ_TOPOLOGY) or {})
                return bool(drawn.get("nodes"))

            await wait_until(drawing, timeout_s=60, message="the page to draw the topology")
            nodes = {n["id"]: n for n in drawn["nodes"]}
            expected = {f"node:{n.name}" for sub in description.sub_topologies
                        for n in sub.nodes}
            expected |= {f"topic:{t}" for t in (*description.source_topics,
                                                 *description.sink_topics,
                                                 *description.repartition_topics,
                                                 *description.changelog_topics)}
            expected |= {f"store:{s}" for sub in description.sub_topologies
                         for s in sub.stores}
            assert expected <= set(nodes), expected - set(nodes)
            assert drawn["boxes"] == [f"Sub-topology {s.id}"
                                      for s in description.sub_topologies]
            assert "published by node-a" in drawn["meta"]
            assert drawn["problem"] is None, drawn["problem"]
            # The foreign-key join's two internal topics link its two sub-topologies.
            captions = sorted(n["text"][1] for n in nodes.values()
                              if n["kind"] == "repartition-topic")
            assert captions == ["FK response topic", "FK subscription topic"]
            assert nodes[f"topic:{prefix}-clicks"]["text"] == [f"{prefix}-clicks", "topic"]
            sessions = next(n for n in nodes.values() if "session" in n["text"][0]
                            and n["kind"] == "processor")
            assert ["store:sessions", sessions["id"]] in drawn["edges"]
            graph = await page.query_selector("#topology-graph")
            assert graph is not None
            await page.add_style_tag(content=".topology { max-height: none; overflow: visible; }")
            await graph.screenshot(path=str(tmp_path / "web-topology.png"))
            await browser.close()
        keep = os.environ.get("RELAY_WEB_SCREENSHOTS")
        if keep:
            shutil.copyfile(tmp_path / "web-topology.png", Path(keep) / "web-topology.png")
    finally:
        stop(worker)


async def test_the_cli_refuses_an_unknown_app_and_a_bad_port(bootstrap: str) -> None:
    code, out = await run_relay("web", "no-such-app", bootstrap=bootstrap)
    assert code == 2 and "unknown app 'no-such-app'" in out
    code, out = await run_relay("web", "app", "--port", "70000", bootstrap=bootstrap)
    assert code == 2 and "--port" in out
