// What the key's project spent: by day (a line) and by model and tier (bars) from /v1/usage, the cache hit
// rate and what caching saved, and the budgets of runs (spent and left).
import {get} from "../api.js";
import {h, table} from "../dom.js";
import {barChart, lineChart} from "../chart.js";

const MICRO = 1e6;
const usd = u => `$${(u / MICRO).toFixed(u !== 0 && Math.abs(u) < 10000 ? 6 : 2)}`;
const pct = x => `${(100 * x).toFixed(1)}%`;

function isoDay(d) { return d.toISOString().slice(0, 10); }

/** Every day from the first to the last with usage, zero where nothing was spent: a gap is a real zero. */
function days(rows) {
  if (!rows.length) return [];
  const spent = Object.fromEntries(rows.map(r => [r.group, r.cost_u]));
  const keys = Object.keys(spent).sort();
  const out = [];
  for (let d = new Date(keys[0] + "T00:00:00Z"); isoDay(d) <= keys[keys.length - 1]; d.setUTCDate(d.getUTCDate() + 1)) {
    out.push({x: isoDay(d), y: spent[isoDay(d)] || 0});
  }
  return out;
}

export async function render(main, _ = null) {
  const since = h("input", {id: "since", type: "date", name: "since"});
  const until = h("input", {id: "until", type: "date", name: "until"});
  const body = h("div", {id: "costs-body", "aria-live": "polite"});
  const form = h("form", {class: "filters", "aria-label": "Period"},
    h("label", {for: "since"}, "From"), since, h("label", {for: "until"}, "To"), until,
    h("button", {type: "submit"}, "Show"));
  main.append(h("h2", {}, "Costs"), form, body);

  async function refresh() {
    const period = {since: since.value, until: until.value};
    const [byDay, byModel, byTier, runs, limits] = await Promise.all([
      get("/v1/usage", {by: "day", ...period}), get("/v1/usage", {by: "model", ...period}),
      get("/v1/usage", {by: "tier", ...period}), get("/v1/runs", {limit: 500}), get("/v1/budgets")]);
    const rows = byModel.data;
    const total = rows.reduce((a, r) => a + r.cost_u, 0);
    const saved = rows.reduce((a, r) => a + r.savings_u, 0);
    const input = rows.reduce((a, r) => a + r.input_total, 0);
    const cached = rows.reduce((a, r) => a + r.cache_read, 0);
    const budgeted = runs.data.filter(r => r.budget.cost_budget_u != null || r.budget.token_budget != null);
    body.replaceChildren(
      h("dl", {class: "facts totals"},
        h("dt", {}, "Spent"), h("dd", {id: "total-spent"}, usd(total)),
        h("dt", {}, "Requests"), h("dd", {}, String(rows.reduce((a, r) => a + r.requests, 0))),
        h("dt", {}, "Cache hit rate"), h("dd", {id: "cache-hit-rate"}, input ? pct(cached / input) : "—"),
        h("dt", {}, "Saved by caching"), h("dd", {}, usd(saved))),
      h("section", {"aria-labelledby": "by-day-h"}, h("h3", {id: "by-day-h"}, "Spend by day (UTC)"),
        byDay.data.length ? lineChart("Spend by day", days(byDay.data), usd) : h("p", {class: "empty"}, "No usage yet.")),
      h("section", {"aria-labelledby": "by-model-h"}, h("h3", {id: "by-model-h"}, "Spend by model"),
        rows.length ? barChart("Spend by model", rows.map(r => ({label: r.group, value: r.cost_u})), usd) : null,
        table("Usage by model", [
          {label: "Model", cell: r => r.group}, {label: "Requests", cell: r => String(r.requests)},
          {label: "Input", cell: r => String(r.input_total)}, {label: "Cached", cell: r => String(r.cache_read)},
          {label: "Output", cell: r => String(r.output)}, {label: "Hit rate", cell: r => pct(r.cache_hit_rate)},
          {label: "Cost", cell: r => `$${r.cost_usd}`}, {label: "Saved", cell: r => `$${r.savings_usd}`},
        ], rows, "No usage yet.")),
      h("section", {"aria-labelledby": "by-tier-h"}, h("h3", {id: "by-tier-h"}, "Spend by tier"),
        table("Usage by tier", [{label: "Tier", cell: r => r.group}, {label: "Requests", cell: r => String(r.requests)},
                                {label: "Cost", cell: r => `$${r.cost_usd}`}], byTier.data, "No usage yet.")),
      h("section", {"aria-labelledby": "limits-h"}, h("h3", {id: "limits-h"}, "Budgets"),
        table("Budgets of this key and its project, this period", [
          {label: "Applies to", cell: b => `${b.scope} ${b.scope_id}`},
          {label: "Period", cell: b => b.period},
          {label: "Limit", cell: b => `$${b.hard_limit_usd}`},
          {label: "Spent", cell: b => `$${b.spent_usd}`},
          {label: "Held", cell: b => `$${b.outstanding_usd}`},
          {label: "Left", cell: b => h("span", {class: b.remaining_u <= 0 ? "error" : null}, `$${b.remaining_usd}`)},
          {label: "Used", cell: b => h("meter", {min: 0, max: b.hard_limit_u || 1, value: b.spent_u + b.outstanding_u,
            "aria-label": `${b.scope} budget used`}, pct((b.spent_u + b.outstanding_u) / (b.hard_limit_u || 1)))},
        ], limits.data, "No budget applies.")),
      h("section", {"aria-labelledby": "budgets-h"}, h("h3", {id: "budgets-h"}, "Run budgets"),
        table("Runs with a budget", [
          {label: "Run", cell: r => h("a", {href: `#/runs/${r.id}`}, r.id)},
          {label: "State", cell: r => r.status},
          {label: "Cost budget", cell: r => r.budget.cost_budget_usd != null ? `$${r.budget.cost_budget_usd}` : "—"},
          {label: "Cost left", cell: r => r.budget.cost_budget_u != null ? usd(r.budget.cost_budget_u - r.cost_u) : "—"},
          {label: "Token budget", cell: r => r.budget.token_budget != null ? String(r.budget.token_budget) : "—"},
          {label: "Tokens left", cell: r => r.budget.token_budget != null ?
            String(r.budget.token_budget - r.usage.total_tokens) : "—"},
        ], budgeted, "No run has a budget of its own.")));
  }
  form.addEventListener("submit", e => { e.preventDefault(); refresh(); });
  await refresh();
}
