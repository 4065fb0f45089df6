// Building DOM from data without innerHTML: every string from the API lands as text, never as markup.

/** h("a", {href: "#/x", class: "c"}, "text", child) -> an element; attributes starting "on" are listeners. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const SVG = "http://www.w3.org/2000/svg";

export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  append(el, children);
  return el;
}

export function when(t) {
  return t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z" : "—";
}

/** A table: columns [{label, cell(row) -> node|string}], with a caption for screen readers. */
export function table(caption, columns, rows, empty = "Nothing yet.") {
  if (!rows.length) return h("p", {class: "empty"}, empty);
  return h("div", {class: "scroll"}, h("table", {},
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, columns.map(c => h("th", {scope: "col"}, c.label)))),
    h("tbody", {}, rows.map(r => h("tr", {}, columns.map(c => h("td", {}, c.cell(r))))))));
}

export function badge(status) {
  return h("span", {class: `badge st-${status}`}, status);
}

/** A short message in the page's status region (read out by screen readers). */
export function notify(text) {
  const el = document.getElementById("status");
  el.textContent = text;
  clearTimeout(notify.timer);
  notify.timer = setTimeout(() => { el.textContent = ""; }, 6000);
}
