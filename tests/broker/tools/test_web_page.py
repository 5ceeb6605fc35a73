"""The page's renderer (tools/web/static/app.js) run by Node with a small DOM stand-in: what
it draws for a given view, without a browser or a broker. Skips when Node is absent."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

APP_JS = Path(__file__).resolve().parents[3] / "tools" / "web" / "static" / "app.js"
NODE = shutil.which("node")

#: A DOM just big enough for app.js: elements with attributes, classes and children.
DOM = r"""
const vm = require("vm"), fs = require("fs");
class Node {}
class Text extends Node {
  constructor(t) { super(); this.text = t; }
  toJSON() { return this.text; }
}
class Element extends Node {
  constructor(tag) { super(); this.tag = tag; this.attrs = {}; this.children = [];
                     this.className = ""; this.dataset = {}; this.hidden = false; }
  setAttribute(k, v) { this.attrs[k] = v; }
  append(...c) { this.children.push(...c); }
  replaceChildren(...c) { this.children = c; }
  set textContent(t) { this.children = [new Text(t)]; }
  toJSON() { return {tag: this.tag, class: this.className, attrs: this.attrs,
                     children: this.children}; }
}
const elements = {};
const document = {
  createElement: (tag) => new Element(tag),
  createTextNode: (t) => new Text(t),
  getElementById: (id) => (elements[id] = elements[id] || new Element("div")),
};
class EventSource { constructor() {} }
const context = vm.createContext({document, Node, EventSource, window: {location: {search: ""}},
                                  console});
vm.runInContext(fs.readFileSync(process.argv[process.argv.length - 1], "utf8"), context);
const call = JSON.parse(fs.readFileSync(0, "utf8"));
context.__args = call.args;
process.stdout.write(JSON.stringify(vm.runInContext(`${call.fn}(...__args)`, context)));
"""


def run(fn: str, *args: Any) -> Any:
    if NODE is None:
        pytest.skip("node is not installed")
    done = subprocess.run([NODE, "-e", DOM, "--", str(APP_JS)], input=json.dumps(
        {"fn": fn, "args": list(args)}), capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def texts(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    return [t for child in node["children"] for t in texts(child)]


def classes(node: Any) -> list[str]:
    if isinstance(node, str):
        return []
    return [node["class"], *(c for child in node["children"] for c in classes(child))]


def copy(**fields: Any) -> dict[str, Any]:
    return {"member": "b-thread-0", "instance": "b", "role": "standby", "lag": 0,
            "acceptable_lag": 100, "peak_lag": 50, "progress": 1.0, "isLearner": False,
            "isReady": True, "stale": False, "catch_up_per_s": None, "ready_in_ms": None,
            **fields}


def test_a_live_ready_standby_is_drawn_ready() -> None:
    node = run("copyNode", "0_0", copy())
    assert "ready" in node["class"].split()
    assert "isReady" in texts(node)


def test_a_stale_members_standby_is_drawn_stale_not_ready() -> None:
    node = run("copyNode", "0_0", copy(stale=True))
    assert "stale" in node["class"].split() and "ready" not in node["class"].split()
    assert node["attrs"]["data-stale"] == "true"
    assert "isReady" not in texts(node)
    assert any("stale" in c.split() for c in classes(node)[1:])


def test_a_tasks_late_drops_are_drawn_beside_its_active() -> None:
    node = run("dropsNode", {"task": "1_0", "dropped": {"late": 1073}, "misrouted": 2})
    assert "dropped 1,073 late" in texts(node) and "2 misrouted" in texts(node)
    assert run("dropsNode", {"task": "1_0", "dropped": {}, "misrouted": 0}) is None
