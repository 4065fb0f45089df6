// Runs, newest first, filtered by state (server side) and agent; refreshed while the page is open.
import {get} from "../api.js";
import {badge, h, table, when} from "../dom.js";

const STATES = ["", "queued", "running", "waiting_approval", "paused", "succeeded", "failed", "cancelled",
                "timed_out"];
const REFRESH_MS = 2000;

/** The filters in the URL (#/runs?status=failed&agent=helper): a filtered list can be bookmarked or shared. */
function fromUrl() {
  const q = new URLSearchParams(location.hash.split("?")[1] || "");
  return {status: q.get("status") || "", agent: q.get("agent") || ""};
}

function toUrl(filters) {
  const q = new URLSearchParams(Object.entries(filters).filter(([, v]) => v));
  history.replaceState(null, "", q.size ? `#/runs?${q}` : "#/runs");  // no hashchange: no re-render
}

export async function render(main) {
  const filters = fromUrl();
  const agents = await get("/v1/agents").then(r => r.data).catch(() => []);
  const names = [...new Set(agents.map(a => a.name))].sort();
  const byId = Object.fromEntries(agents.map(a => [a.id, a.name]));
  const state = h("select", {id: "f-status", name: "status"},
    STATES.map(s => h("option", {value: s, selected: s === filters.status}, s || "any state")));
  const agent = h("select", {id: "f-agent", name: "agent"},
    h("option", {value: ""}, "any agent"),
    names.map(n => h("option", {value: n, selected: n === filters.agent}, n)));
  const list = h("div", {id: "runs-list", "aria-live": "polite", "aria-busy": "true"});
  const form = h("form", {class: "filters", role: "search", "aria-label": "Filter runs"},
    h("label", {for: "f-status"}, "State"), state,
    h("label", {for: "f-agent"}, "Agent"), agent);
  main.append(h("h2", {}, "Runs"), form, list);

  async function refresh() {
    filters.status = state.value;
    filters.agent = agent.value;
    const runs = (await get("/v1/runs", {status: filters.status, limit: 200})).data
      .filter(r => !filters.agent || byId[r.agent_id] === filters.agent || r.agent_id === filters.agent);
    list.replaceChildren(table(`${runs.length} run${runs.length === 1 ? "" : "s"}`, [
      {label: "Run", cell: r => h("a", {href: `#/runs/${r.id}`}, r.id)},
      {label: "State", cell: r => [badge(r.status), r.pending_interrupts.length ?
        h("span", {class: "needs"}, ` ${r.pending_interrupts.length} to approve`) : null]},
      {label: "Agent", cell: r => byId[r.agent_id] || r.agent_id},
      {label: "Goal", cell: r => h("span", {class: "clip", title: r.goal}, r.goal)},
      {label: "Steps", cell: r => String(r.step_count)},
      {label: "Cost (USD)", cell: r => r.cost_usd},
      {label: "Created", cell: r => when(r.created_at)},
    ], runs, "No runs match."));
    list.setAttribute("aria-busy", "false");
  }
  const changed = () => { toUrl({status: state.value, agent: agent.value}); refresh(); };
  state.addEventListener("change", changed);
  agent.addEventListener("change", changed);
  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), REFRESH_MS);
  return () => clearInterval(timer);
}
