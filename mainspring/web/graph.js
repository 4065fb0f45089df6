// A plan's tasks as a drawn graph: columns by depth (the longest chain of dependencies before a task), one box
// per task coloured by its state, an arrow from each dependency. Plain SVG, like the other plots.
import {s} from "./dom.js";

const BOX_W = 150, BOX_H = 44, GAP_X = 60, GAP_Y = 18, PAD = 12;

/** tasks: [{key, status, depends_on, item_index}] -> an SVG; a fan-out's items share their task's key. */
export function taskGraph(title, tasks) {
  const byKey = new Map();
  for (const t of tasks) byKey.set(t.key, [...(byKey.get(t.key) || []), t]);
  const depth = new Map();
  const depthOf = (key, seen = new Set()) => {
    if (depth.has(key)) return depth.get(key);
    if (seen.has(key)) return 0;  // a cycle cannot be stored; guard anyway
    seen.add(key);
    const deps = (byKey.get(key)?.[0]?.depends_on || []).filter(d => byKey.has(d));
    const d = deps.length ? 1 + Math.max(...deps.map(k => depthOf(k, seen))) : 0;
    depth.set(key, d);
    return d;
  };
  const columns = [];
  for (const key of byKey.keys()) (columns[depthOf(key)] ||= []).push(key);
  const pos = new Map();
  columns.forEach((keys, c) => keys.forEach((k, r) => pos.set(k, {x: PAD + c * (BOX_W + GAP_X),
                                                                  y: PAD + r * (BOX_H + GAP_Y)})));
  const w = PAD * 2 + columns.length * BOX_W + (columns.length - 1) * GAP_X;
  const h = PAD * 2 + Math.max(...columns.map(c => c.length)) * (BOX_H + GAP_Y) - GAP_Y;
  // drawn at its own size (never blown up to the page's width), shrunk only when the window is narrower
  const svg = s("svg", {viewBox: `0 0 ${w} ${h}`, width: w, height: h, role: "img", class: "chart graph",
                        "aria-label": title},
    s("title", {}, title),
    s("desc", {}, [...byKey.entries()].map(([k, ts]) =>
      `${k}: ${state(ts)}${ts[0].depends_on.length ? ` after ${ts[0].depends_on.join(", ")}` : ""}`).join("; ")),
    s("defs", {}, s("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7,
                               orient: "auto-start-reverse"}, s("path", {d: "M 0 0 L 10 5 L 0 10 z", class: "arrow"}))));
  for (const [key, ts] of byKey) {
    for (const dep of ts[0].depends_on.filter(d => pos.has(d))) {
      const a = pos.get(dep), b = pos.get(key);
      svg.append(s("path", {class: "edge", "marker-end": "url(#arrow)", fill: "none",
        d: `M ${a.x + BOX_W} ${a.y + BOX_H / 2} C ${a.x + BOX_W + GAP_X / 2} ${a.y + BOX_H / 2}, ` +
           `${b.x - GAP_X / 2} ${b.y + BOX_H / 2}, ${b.x} ${b.y + BOX_H / 2}`}));
    }
  }
  for (const [key, ts] of byKey) {
    const {x, y} = pos.get(key), st = state(ts);
    svg.append(s("g", {class: `node st-${st}`, "data-task": key, "data-status": st},
      s("rect", {x, y, width: BOX_W, height: BOX_H, rx: 6}),
      s("text", {x: x + 10, y: y + 18, class: "name"}, key.length > 18 ? key.slice(0, 17) + "…" : key),
      s("text", {x: x + 10, y: y + 35, class: "axis"}, ts.length > 1 ? `${st} (${ts.length} items)` : st)));
  }
  return svg;
}

/** One state for a task and its fan-out items: the least finished one wins (running over succeeded). */
function state(ts) {
  const order = ["failed", "awaiting_approval", "running", "dispatched", "preempted", "replanning", "ready", "waiting",
                 "succeeded", "skipped", "cancelled"];
  return ts.map(t => t.status).sort((a, b) => rank(order, a) - rank(order, b))[0];
}

function rank(order, st) {
  const i = order.indexOf(st);
  return i < 0 ? 1 : i;  // an unknown state: treat as in progress
}
