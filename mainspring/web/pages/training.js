// Training: fine-tuning (RL) jobs, and for one job its reward curves per domain, its loss, and the evaluation
// before and after, all from the job's events (/v1/fine_tuning/jobs/{id}/events).
import {get} from "../api.js";
import {badge, h, table, when} from "../dom.js";
import {curves} from "../chart.js";

const PAGE = 1000;

async function allEvents(jobId) {
  const out = [];
  let after = null;
  for (;;) {  // newest first, paged backwards by id
    const page = await get(`/v1/fine_tuning/jobs/${jobId}/events`, {limit: PAGE, after});
    out.push(...page.data);
    if (!page.has_more || !page.data.length) return out.reverse();
    after = page.data[page.data.length - 1].id;
  }
}

function list(main, jobs) {
  main.append(h("h2", {}, "Training"), table(`${jobs.length} fine-tuning jobs`, [
    {label: "Job", cell: j => h("a", {href: `#/training/${j.id}`}, j.id)},
    {label: "State", cell: j => badge(j.status)},
    {label: "Base model", cell: j => j.model},
    {label: "Result", cell: j => j.fine_tuned_model || "—"},
    {label: "Created", cell: j => when(j.created_at)},
  ], jobs, "No fine-tuning jobs."));
}

export async function render(main, jobId) {
  if (!jobId) { list(main, (await get("/v1/fine_tuning/jobs", {limit: 100})).data); return null; }
  const [job, events] = await Promise.all([get(`/v1/fine_tuning/jobs/${jobId}`), allEvents(jobId)]);
  const metrics = events.filter(e => e.type === "metrics");
  const byStep = new Map();  // a step redone after a restart: its last report wins
  for (const e of metrics) if ("total_steps" in e.data) byStep.set(e.data.step, e.data);
  const steps = [...byStep.values()].sort((a, b) => a.step - b.step);
  const evals = metrics.filter(e => !("total_steps" in e.data) && e.data.phase);
  const keys = [...new Set(steps.flatMap(Object.keys))];
  const rewards = ["reward", ...keys.filter(k => k.startsWith("reward_")).sort()].filter(k => keys.includes(k));
  const series = names => names.map(k => ({name: k, points: steps.filter(st => typeof st[k] === "number")
                                                            .map(st => ({x: st.step, y: st[k]}))}));
  main.append(h("p", {}, h("a", {href: "#/training"}, "← Training")), h("h2", {}, "Job ", h("code", {}, jobId)),
    h("dl", {class: "facts"}, h("dt", {}, "State"), h("dd", {}, badge(job.status)),
      h("dt", {}, "Base model"), h("dd", {}, job.model), h("dt", {}, "Steps reported"), h("dd", {}, String(steps.length))),
    h("section", {"aria-labelledby": "rewards-h"}, h("h3", {id: "rewards-h"}, "Reward per domain"),
      rewards.length ? curves("Reward per domain by step", series(rewards)) : h("p", {class: "empty"}, "No steps yet.")),
    keys.includes("loss") ? h("section", {"aria-labelledby": "loss-h"}, h("h3", {id: "loss-h"}, "Loss"),
      curves("Loss by step", series(["loss"]), v => v.toFixed(4))) : null,
    h("section", {"aria-labelledby": "evals-h"}, h("h3", {id: "evals-h"}, "Evaluation before and after"),
      evalTable(evals)));
  return null;
}

function evalTable(evals) {
  const phases = new Map(evals.map(e => [e.data.phase, e.data]));  // the last report of each phase
  const domains = [...new Set(evals.flatMap(e => Object.keys(e.data).filter(k => e.data[k]?.mean !== undefined)))];
  const [before, after] = [phases.get("before") || {}, phases.get("after") || {}];
  const mean = v => v?.mean === undefined ? "—" : `${v.mean.toFixed(3)}${v.ci !== undefined ? ` ± ${v.ci.toFixed(3)}` : ""}`;
  return table("Mean score per domain", [
    {label: "Domain", cell: d => d},
    {label: "Before", cell: d => mean(before[d])},
    {label: "After", cell: d => mean(after[d])},
    {label: "Change", cell: d => before[d] && after[d] ? (after[d].mean - before[d].mean).toFixed(3) : "—"},
  ], domains, "No evaluation reported.");
}
