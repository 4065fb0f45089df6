// Plots in plain SVG: a line of points over days and horizontal bars, sized by viewBox so they scale
// with the window. Each carries a title and a table-like description for screen readers.
import {s} from "./dom.js";

const W = 640, H = 240, PAD = {l: 64, r: 16, t: 16, b: 40};

function ticks(max, n = 4) {
  return Array.from({length: n + 1}, (_, i) => (max * i) / n);
}

/** points: [{x: label, y: number}] in order; fmt formats a y value. */
export function lineChart(title, points, fmt = String) {
  const max = Math.max(...points.map(p => p.y), 0) || 1;
  const iw = W - PAD.l - PAD.r, ih = H - PAD.t - PAD.b;
  const px = i => PAD.l + (points.length === 1 ? iw / 2 : (iw * i) / (points.length - 1));
  const py = y => PAD.t + ih - (ih * y) / max;
  const svg = s("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", class: "chart line", "aria-label": title},
    s("title", {}, title),
    s("desc", {}, points.map(p => `${p.x}: ${fmt(p.y)}`).join("; ")));
  for (const t of ticks(max)) {
    svg.append(s("line", {x1: PAD.l, x2: W - PAD.r, y1: py(t), y2: py(t), class: "grid"}),
               s("text", {x: PAD.l - 6, y: py(t) + 4, "text-anchor": "end", class: "axis"}, fmt(t)));
  }
  if (points.length > 1) {
    svg.append(s("polyline", {class: "series", fill: "none",
                              points: points.map((p, i) => `${px(i)},${py(p.y)}`).join(" ")}));
  }
  const every = Math.ceil(points.length / 8);  // at most 8 date labels, so they never overlap
  points.forEach((p, i) => {
    svg.append(s("circle", {class: "pt", cx: px(i), cy: py(p.y), r: 4, "data-x": p.x, "data-y": p.y},
                 s("title", {}, `${p.x}: ${fmt(p.y)}`)));
    if (i % every === 0) svg.append(s("text", {x: px(i), y: H - PAD.b + 18, "text-anchor": "middle", class: "axis"}, p.x));
  });
  return svg;
}

/** bars: [{label, value}]; one row per bar. */
export function barChart(title, bars, fmt = String) {
  const rowH = 28, h = PAD.t + bars.length * rowH + 8, max = Math.max(...bars.map(b => b.value), 0) || 1;
  const left = 200, iw = W - left - 90;
  const svg = s("svg", {viewBox: `0 0 ${W} ${h}`, role: "img", class: "chart bars", "aria-label": title},
    s("title", {}, title), s("desc", {}, bars.map(b => `${b.label}: ${fmt(b.value)}`).join("; ")));
  bars.forEach((b, i) => {
    const y = PAD.t + i * rowH;
    svg.append(s("text", {x: left - 8, y: y + 17, "text-anchor": "end", class: "axis"}, b.label),
               s("rect", {class: "bar", x: left, y: y + 4, height: rowH - 10, width: Math.max(1, (iw * b.value) / max)},
                 s("title", {}, `${b.label}: ${fmt(b.value)}`)),
               s("text", {x: left + Math.max(1, (iw * b.value) / max) + 6, y: y + 17, class: "axis"}, fmt(b.value)));
  });
  return svg;
}
