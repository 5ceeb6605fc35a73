// Renders the group view pushed by /api/events (server-sent events). Built with DOM nodes and
// textContent only: member and task names come from the topics and are never parsed as HTML.
"use strict";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "style") node.setAttribute("style", value);
    else node.setAttribute(key, value === true ? "true" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function duration(ms) {
  if (ms === null || ms === undefined) return "?";
  const negative = ms < 0;
  let s = Math.round(Math.abs(ms) / 1000);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  s = s % 60;
  const text = h ? `${h}h ${m}m` : m ? `${m}m ${s}s` : `${s}s`;
  return negative ? `-${text}` : text;
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], {hour12: false});
}

function number(n) {
  return n === null || n === undefined ? "?" : n.toLocaleString("en-US");
}

function bar(progress, label, extra) {
  const known = progress !== null && progress !== undefined;
  const pct = known ? Math.round(progress * 100) : 100;
  return el("span", {class: "bar" + (known ? "" : " unknown"), title: label,
                     "data-progress": known ? progress : "unknown", ...extra},
    el("span", {class: "fill", style: `width: ${pct}%`}),
    el("span", {class: "label"}, label));
}

function tag(name) {
  return el("span", {class: `tag ${name}`, "data-tag": name}, name);
}

function renderInstances(view) {
  const leaving = new Map(view.leaving.map((l) => [l.instance, l]));
  const nodes = view.instances.map((inst) => {
    const mark = leaving.get(inst.instance_id);
    return el("div", {class: "instance" + (mark ? " is-leaving" : ""),
                      "data-instance": inst.instance_id, "data-leaving": Boolean(mark)},
      el("h3", {}, inst.instance_id,
         mark ? el("span", {class: "badge leaving"}, "leaving") : null),
      el("ul", {class: "threads"}, inst.threads.map((t) =>
        el("li", {class: "thread" + (t.stale ? " stale" : ""), "data-member": t.member,
                  "data-leader": t.leader, "data-stale": t.stale},
          el("div", {class: "thread-head"},
            el("code", {class: "static-id"}, t.static_id),
            t.leader ? el("span", {class: "badge leader"}, "leader") : null,
            t.stale ? el("span", {class: "badge stale"}, `silent ${duration(t.age_ms)}`) : null),
          el("div", {class: "thread-meta"},
            `thread ${t.thread} · pid ${t.pid ?? "?"} · generation ${t.generation} · `,
            `${number(t.processed)} processed · ${t.rebalances} rebalances`),
          el("div", {class: "thread-meta member-id"}, t.member_id || "no member id yet"),
          el("div", {class: "thread-tasks"},
            t.active.map((task) => el("span", {class: "chip active"}, task)),
            t.restoring.map((task) => el("span", {class: "chip restoring"}, `${task} restoring`)),
            Object.keys(t.learners).map((task) => el("span", {class: "chip learner"},
                                                     `${task} learner`)),
            Object.keys(t.standbys).map((task) => el("span", {class: "chip standby"},
                                                     `${task} standby`)))))));
  });
  document.getElementById("instances").replaceChildren(
    ...(nodes.length ? nodes : [el("p", {class: "empty"}, "no member publishes its status")]));
}

function renderLeaving(view) {
  const items = view.leaving.map((l) => {
    const deadline = l.deadline_ms === null
      ? "deadline: the app's scale_down_timeout_ms"
      : `deadline ${clock(l.deadline_ms)} (${l.remaining_ms >= 0 ? "in " +
          duration(l.remaining_ms) : "passed " + duration(-l.remaining_ms) + " ago"})`;
    return el("li", {class: "leaving-item", "data-instance": l.instance,
                     "data-deadline-ms": l.deadline_ms ?? "unknown",
                     "data-state": l.state},
      el("b", {}, l.instance),
      ` marked ${l.since_ms ? clock(l.since_ms) : "?"} · ${deadline} · `,
      {"handing over": "handing over", "marked": "mark not picked up yet",
       "gone": "no member publishes (left, or died)"}[l.state] || l.state);
  });
  document.getElementById("leaving-section").hidden = items.length === 0;
  document.getElementById("leaving").replaceChildren(...items);
}

function copyNode(task, c) {
  let label = c.role === "learner"
    ? `${number(c.lag)} / ${number(c.acceptable_lag)}`
    : number(c.lag);
  if (c.ready_in_ms !== null && c.ready_in_ms !== undefined) {
    label += ` · ready in ${duration(c.ready_in_ms)}`;
  }
  // A copy on a silent member (killed, say) is what it was when the member last published:
  // drawn stale, never ready.
  const state = c.stale ? el("span", {class: "tag stale", "data-tag": "stale",
                                      title: "its member has been silent: it may be dead"},
                             "stale")
    : c.isReady ? tag("isReady") : el("span", {class: "tag not-ready"}, "catching up");
  const look = c.stale ? " stale" : c.isReady ? " ready" : "";
  return el("div", {class: `copy ${c.role}${look}`, "data-task": task,
                    "data-role": c.role, "data-member": c.member,
                    "data-ready": c.isReady && !c.stale, "data-stale": c.stale,
                    "data-lag": c.lag},
    el("code", {}, c.member), " ",
    c.isLearner ? tag("isLearner") : null,
    state,
    bar(c.progress, label, {"data-role": c.role}));
}

// Records the task's active dropped (late ones most of all) and keys it got on the wrong
// partition: invisible in the output, so shown where the task is.
function dropsNode(t) {
  const dropped = Object.entries(t.dropped || {}).filter(([, n]) => n > 0);
  if (!dropped.length && !t.misrouted) return null;
  return el("div", {class: "drops", "data-task": t.task},
    dropped.map(([reason, n]) => el("span", {class: `tag dropped ${reason}`,
                                            "data-tag": `dropped-${reason}`,
                                            title: "records dropped since it started here"},
                                    `dropped ${number(n)} ${reason}`)),
    t.misrouted ? el("span", {class: "tag misrouted", "data-tag": "misrouted",
                              title: "keys that murmur2 places on another partition: a " +
                                     "producer with another partitioner"},
                     `${number(t.misrouted)} misrouted`) : null);
}

function renderTasks(view) {
  const rows = view.tasks.map((t) => {
    let active;
    if (t.active) {
      active = [el("code", {}, t.active),
                t.active_since_ms ? el("div", {class: "since"},
                  `since ${clock(t.active_since_ms)}`) : null];
    } else if (t.restoring) {
      active = [el("code", {}, t.restoring.member), " restoring ",
                bar(t.restoring.progress, t.restoring.lag === null ? "restoring"
                    : `${number(t.restoring.lag)} to go` + (t.restoring.done_in_ms === null ? ""
                      : ` · ${duration(t.restoring.done_in_ms)}`), {"data-role": "restoring"})];
    } else {
      active = [el("span", {class: "unassigned"}, "unassigned"),
                t.unassigned_since_ms ? el("div", {class: "since"},
                  `for ${duration(view.now_ms - t.unassigned_since_ms)}, was ` +
                  (t.previous_active || "?")) : null];
    }
    return el("tr", {class: "task", "data-task": t.task, "data-active": t.active || "",
                     "data-stateful": t.isStateful === null ? "unknown" : t.isStateful,
                     "data-being-learned": t.beingLearned},
      el("td", {}, el("b", {}, t.task)),
      el("td", {}, t.isStateful ? tag("isStateful")
                   : el("span", {class: "tag unknown", title: view.derived.isStateful},
                        "stateful?"),
         t.beingLearned ? tag("beingLearned") : null),
      el("td", {class: "active-cell"}, active, dropsNode(t)),
      el("td", {}, t.learners.map((c) => copyNode(t.task, c))),
      el("td", {}, t.standbys.map((c) => copyNode(t.task, c))));
  });
  document.querySelector("#tasks tbody").replaceChildren(...rows);
}

function renderTimeline(view) {
  document.getElementById("window").textContent = `last ${duration(view.window_ms)}`;
  const start = view.now_ms - view.window_ms;
  const strip = document.getElementById("strip");
  const marks = view.timeline.map((e) =>
    el("span", {class: `mark ${e.kind}`, title: `${clock(e.at_ms)} ${e.text}`,
                style: `left: ${(100 * (e.at_ms - start) / view.window_ms).toFixed(2)}%`}));
  const ticks = [];
  for (let i = 0; i <= 4; i++) {
    ticks.push(el("span", {class: "tick", style: `left: ${i * 25}%`},
                  i === 4 ? "now" : `-${duration(view.window_ms * (4 - i) / 4)}`));
  }
  strip.replaceChildren(...ticks, ...marks);
  const items = view.timeline.slice().reverse().slice(0, 200).map((e) =>
    el("li", {class: `event ${e.kind}`, "data-kind": e.kind, "data-task": e.task || "",
              "data-cause": e.cause || "", "data-members": e.members.join(" ")},
      el("time", {}, clock(e.at_ms)), " ",
      el("span", {class: "kind"}, e.kind), " ", e.text,
      e.gap_ms !== null ? el("span", {class: "gap"}, ` · unassigned ${duration(e.gap_ms)}`)
                        : null));
  document.getElementById("timeline").replaceChildren(...items);
}

const PALETTE = ["#2f6fde", "#1f9d55", "#c77c0e", "#7a5cc7", "#d64545", "#0e8a8a", "#8a5a0e",
                 "#b03a8a"];

function colors(view) {
  const names = new Set(view.instances.map((i) => i.instance_id));
  for (const lane of view.lanes) for (const s of lane.spans) names.add(s.instance);
  const sorted = [...names].sort();
  return new Map(sorted.map((name, i) => [name, PALETTE[i % PALETTE.length]]));
}

// One lane per task: who ran it (full bars) and who held a copy (thin bars), over the window.
function renderLanes(view) {
  const start = view.now_ms - view.window_ms;
  const color = colors(view);
  const pos = (a, b) => `left: ${(100 * (a - start) / view.window_ms).toFixed(2)}%; ` +
    `width: ${Math.max(0.3, 100 * (b - a) / view.window_ms).toFixed(2)}%`;
  document.getElementById("legend").replaceChildren(
    ...[...color].map(([name, c]) => el("span", {class: "swatch"},
      el("span", {class: "dot", style: `background: ${c}`}), name)),
    el("span", {class: "swatch"}, el("span", {class: "dot copy-dot"}), "learner / standby copy"));
  const lanes = view.lanes.map((lane) =>
    el("div", {class: "lane", "data-task": lane.task},
      el("span", {class: "lane-label"}, lane.task),
      el("div", {class: "track"}, lane.spans.map((s) =>
        el("span", {class: `span ${s.role}`, "data-member": s.member, "data-role": s.role,
                    "data-open": s.open,
                    title: `${s.member} ${s.role} ${clock(s.start_ms)}–` +
                           (s.open ? "now" : clock(s.end_ms)),
                    style: `${pos(s.start_ms, s.end_ms)}; background-color: ` +
                           `${color.get(s.instance) || "#888"}`})))));
  document.getElementById("lanes").replaceChildren(...lanes);
}

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Downward segments as curves leaving and entering vertically (a bend point's own segment is
// a straight drop); an edge within a row as a line; an upward one around the right.
function edgePath(points) {
  const [x0, y0] = points[0];
  let d = `M${x0},${y0}`;
  for (let i = 1; i < points.length; i++) {
    const [x1, y1] = points[i - 1], [x2, y2] = points[i];
    if (y2 > y1 + 1 && x2 !== x1) {
      const bend = Math.max(12, (y2 - y1) / 2);
      d += ` C${x1},${y1 + bend} ${x2},${y2 - bend} ${x2},${y2}`;
    } else if (y2 >= y1 - 1) {
      d += ` L${x2},${y2}`;
    } else {
      const out = Math.max(x1, x2) + 40;
      d += ` C${out},${y1} ${out},${y2} ${x2},${y2}`;
    }
  }
  return d;
}

// Draws the layout /api/topology computed: boxes, then edges, then nodes on top.
function drawTopology(data) {
  const layout = data.layout;
  const root = svg("svg", {width: layout.width, height: layout.height, id: "topology-graph",
                          viewBox: `0 0 ${layout.width} ${layout.height}`, role: "img",
                          "aria-label": `topology of ${data.app}`});
  root.append(svg("defs", {}, svg("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 10,
                                            refY: 5, markerWidth: 7, markerHeight: 7,
                                            orient: "auto-start-reverse"},
                                 svg("path", {d: "M0,0 L10,5 L0,10 z", fill: "#7d879b"}))));
  for (const box of layout.boxes) {
    root.append(svg("g", {class: "topo-box", "data-sub": box.sub},
      svg("rect", {x: box.x, y: box.y, width: box.w, height: box.h, rx: 8}),
      svg("text", {x: box.x + 10, y: box.y + 18}, box.label)));
  }
  for (const e of layout.edges) {
    const arrow = e.kind === "flow" || e.kind === "topic";
    root.append(svg("path", {class: "topo-edge", "data-kind": e.kind, "data-source": e.source,
                             "data-target": e.target, d: edgePath(e.points),
                             "marker-end": arrow ? "url(#arrow)" : "none"}));
  }
  for (const n of layout.nodes) {
    const round = n.kind.endsWith("topic") ? 16 : n.kind.endsWith("store") ? 2 : 6;
    root.append(svg("g", {class: "topo-node", "data-id": n.id, "data-kind": n.kind,
                          "data-name": n.name, "data-sub": n.sub ?? ""},
      svg("title", {}, `${n.caption}: ${n.name}`),
      svg("rect", {x: n.x, y: n.y, width: n.w, height: n.h, rx: round}),
      svg("text", {class: "label", x: n.x + n.w / 2, y: n.y + 15, "text-anchor": "middle"},
          n.label),
      svg("text", {class: "caption", x: n.x + n.w / 2, y: n.y + 29, "text-anchor": "middle"},
          n.caption)));
  }
  return root;
}

let topologyShown = null;

async function renderTopology(view) {
  const key = view.topology ? `${view.topology.instance_id}@${view.topology.published_ms}` : null;
  if (key === topologyShown) return;
  topologyShown = key;
  const box = document.getElementById("topology");
  const meta = document.getElementById("topology-meta");
  if (!key) {
    box.dataset.state = "none";
    box.replaceChildren(el("p", {class: "empty"},
      "no topology published yet (an app publishes it when it starts; one older than " +
      "this view does not)"));
    meta.textContent = "";
    return;
  }
  try {
    const response = await fetch("/api/topology");
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || response.statusText);
    box.replaceChildren(drawTopology(data));
    box.dataset.state = "drawn";
    meta.textContent = `published by ${data.instance_id} at ${clock(data.published_ms)}`;
  } catch (error) {
    topologyShown = null;  // try again with the next update
    box.dataset.state = "error";
    box.replaceChildren(el("p", {class: "empty"}, `cannot draw the topology: ${error}`));
  }
}

function render(view) {
  document.title = `Relay · ${view.app}`;
  document.getElementById("app").textContent = view.app;
  document.getElementById("generation").textContent = view.generation ?? "-";
  document.getElementById("leader").textContent = view.leader ?? "-";
  const problems = [];
  if (view.follower.error) problems.push(view.follower.error);
  if (view.unreadable_records) {
    problems.push(`${view.unreadable_records} unreadable record(s); last: ${view.last_error}`);
  }
  const problem = document.getElementById("problem");
  problem.hidden = problems.length === 0;
  problem.textContent = problems.join(" · ");
  renderInstances(view);
  renderLeaving(view);
  renderTasks(view);
  renderTimeline(view);
  renderLanes(view);
  renderTopology(view);
}

function connect() {
  const connection = document.getElementById("connection");
  const source = new EventSource("/api/events" + window.location.search);
  source.onopen = () => {
    connection.textContent = "live";
    connection.dataset.state = "live";
  };
  source.onmessage = (message) => {
    connection.textContent = "live";
    connection.dataset.state = "live";
    render(JSON.parse(message.data));
  };
  source.onerror = () => {
    connection.textContent = "reconnecting";
    connection.dataset.state = "reconnecting";
  };
}

connect();
