// The console's shell: hash routes to pages, the API key dialog, and who the key is.
import {get, key, whenUnauthorized} from "./api.js";
import {h} from "./dom.js";

// route -> module and its render(main, ...params); a render may return a function that stops its live parts
const ROUTES = [
  [/^#\/runs\/([\w-]+)$/, "runs", () => import("./pages/run.js")],
  [/^#\/plans\/([\w-]+)$/, "plans", () => import("./pages/plan.js")],
  [/^#\/plans$/, "plans", () => import("./pages/plans.js")],
  [/^#\/costs$/, "costs", () => import("./pages/costs.js")],
  [/^#\/scenes(?:\/([\w-]+))?$/, "scenes", () => import("./pages/scenes.js")],
  [/^#\/training(?:\/([\w-]+))?$/, "training", () => import("./pages/training.js")],
  [/^(?:#\/runs)?$/, "runs", () => import("./pages/runs.js")],
];

const main = document.getElementById("main");
const dialog = document.getElementById("key-dialog");
let stop = null;
let rendering = 0;

async function render() {
  const n = ++rendering;
  if (stop) { stop(); stop = null; }
  const [hash] = (location.hash || "#/runs").split("?");  // the query part is the page's own (filters)
  const route = ROUTES.find(([re]) => re.test(hash)) || ROUTES[ROUTES.length - 1];
  const params = hash.match(route[0])?.slice(1) || [];
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.page === route[1]) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const page = await route[2]();
  if (n !== rendering) return;  // a newer navigation won
  // each render draws into its own view: a slower earlier render still awaiting its data (a key entered while the
  // first page loads) then fills a view no longer on the page, never a second copy beside the current one
  const view = h("div", {class: "view"});
  main.replaceChildren(view);
  try {
    const stopper = (await page.render(view, ...params)) || null;
    if (n !== rendering) { if (stopper) stopper(); return; }
    stop = stopper;
  } catch (e) {
    if (n !== rendering) return;
    if (e.status === 401) {  // the key dialog is open already; this is what stays behind it
      view.replaceChildren(h("h2", {}, "An API key is needed"), h("p", {}, e.message),
        h("button", {type: "button", onclick: () => askForKey()}, "Enter an API key"));
    } else {
      view.replaceChildren(h("h2", {}, "Something went wrong"), h("p", {role: "alert", class: "error"}, e.message));
    }
  }
}

async function showWho() {
  const who = document.getElementById("who");
  try {
    const r = await get("/v1/usage", {by: "project"});  // echoes the caller's project: the key's scope
    who.textContent = r.project_id != null ? `Project ${r.project_id}` : (key.get() ? "Key without project" : "Anonymous (no key)");
  } catch {
    who.textContent = "Not signed in";
  }
}

function askForKey(reason) {
  document.getElementById("key-reason").textContent = reason ||
    "Enter an API key. The console then shows only that key's project.";
  if (dialog.open) return;  // several requests may be refused at once: what the user is typing stays
  document.getElementById("key-input").value = "";
  dialog.showModal();
}

whenUnauthorized(err => askForKey(key.get() ? `The key was refused: ${err.message}` :
  "This server requires an API key. The console shows only that key's project."));

document.getElementById("key-form").addEventListener("submit", () => {
  const v = document.getElementById("key-input").value.trim();
  if (v) key.set(v);
  showWho();
  render();
});
document.getElementById("key-cancel").addEventListener("click", () => dialog.close());
document.getElementById("key-forget").addEventListener("click", () => {
  key.clear();
  dialog.close();
  showWho();
  render();
});
document.getElementById("key-button").addEventListener("click", () => askForKey());
window.addEventListener("hashchange", () => { render(); main.focus({preventScroll: true}); });

showWho();
render();
