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

const COLOURS = ["#1f5fbf", "#c2410c", "#15803d", "#7e22ce", "#b91c1c", "#0e7490", "#a16207"];

/** series: [{name, points: [{x: number, y: number}]}] over a shared numeric x axis (training steps). */
export function curves(title, series, fmt = v => v.toFixed(3)) {
  const all = series.flatMap(sr => sr.points);
  const iw = W - PAD.l - PAD.r, ih = H - PAD.t - PAD.b;
  const [x0, x1] = [Math.min(...all.map(p => p.x)), Math.max(...all.map(p => p.x))];
  let [y0, y1] = [Math.min(0, ...all.map(p => p.y)), Math.max(...all.map(p => p.y))];
  if (y1 === y0) y1 = y0 + 1;
  const px = x => PAD.l + (x1 === x0 ? iw / 2 : (iw * (x - x0)) / (x1 - x0));
  const py = y => PAD.t + ih - (ih * (y - y0)) / (y1 - y0);
  const svg = s("svg", {viewBox: `0 0 ${W} ${H + 20 * Math.ceil(series.length / 3)}`, role: "img",
                        class: "chart curves", "aria-label": title},
    s("title", {}, title),
    s("desc", {}, series.map(sr => `${sr.name}: ${sr.points.map(p => `step ${p.x} ${fmt(p.y)}`).join(", ")}`).join("; ")));
  for (let i = 0; i <= 4; i++) {
    const t = y0 + ((y1 - y0) * i) / 4;
    svg.append(s("line", {x1: PAD.l, x2: W - PAD.r, y1: py(t), y2: py(t), class: "grid"}),
               s("text", {x: PAD.l - 6, y: py(t) + 4, "text-anchor": "end", class: "axis"}, fmt(t)));
  }
  svg.append(s("text", {x: PAD.l, y: H - PAD.b + 18, class: "axis"}, `step ${x0}`),
             s("text", {x: W - PAD.r, y: H - PAD.b + 18, "text-anchor": "end", class: "axis"}, `step ${x1}`));
  series.forEach((sr, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const g = s("g", {class: "series-group", "data-series": sr.name});
    g.append(s("polyline", {fill: "none", stroke: colour, "stroke-width": 2,
                            points: sr.points.map(p => `${px(p.x)},${py(p.y)}`).join(" ")}));
    for (const p of sr.points) {
      g.append(s("circle", {class: "pt", cx: px(p.x), cy: py(p.y), r: 3, fill: colour, "data-x": p.x, "data-y": p.y},
                 s("title", {}, `${sr.name}, step ${p.x}: ${fmt(p.y)}`)));
    }
    const lx = PAD.l + (i % 3) * 190, ly = H + 4 + 20 * Math.floor(i / 3);
    svg.append(g, s("rect", {x: lx, y: ly - 9, width: 12, height: 12, fill: colour}),
               s("text", {x: lx + 18, y: ly + 1, class: "axis"}, sr.name));
  });
  return svg;
}
