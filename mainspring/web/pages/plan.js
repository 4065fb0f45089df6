// One plan's tasks with their live states (polled: a task's state is the plan's, its run's is the runtime's).
import {get, post} from "../api.js";
import {badge, h, notify, table} from "../dom.js";
import {taskGraph} from "../graph.js";

const REFRESH_MS = 2000;
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

export async function render(main, planId) {
  const head = h("div", {});
  const graph = h("div", {id: "task-graph", class: "scroll"});
  const tasks = h("div", {id: "tasks", "aria-live": "polite"});
  main.append(h("p", {}, h("a", {href: "#/plans"}, "← Plans")), h("h2", {}, "Plan ", h("code", {}, planId)), head,
              h("h3", {}, "Tasks"), graph, tasks);
  let timer = null;

  async function refresh() {
    const plan = await get(`/v1/plans/${planId}`);
    const act = (action, label) => h("button", {type: "button", onclick: async () => {
      try { await post(`/v1/plans/${planId}/${action}`); notify(`${label}: done`); await refresh(); }
      catch (e) { notify(`${label} failed: ${e.message}`); }
    }}, label);
    head.replaceChildren(h("dl", {class: "facts"},
      h("dt", {}, "State"), h("dd", {id: "plan-status"}, badge(plan.status)),
      h("dt", {}, "Goal"), h("dd", {}, plan.goal),
      h("dt", {}, "Cost"), h("dd", {}, plan.usage ? `$${plan.usage.cost_usd}` : "—"),
      plan.error ? [h("dt", {}, "Error"), h("dd", {class: "error"}, plan.error)] : null),
      TERMINAL.has(plan.status) ? null : h("div", {class: "actions", role: "group", "aria-label": "Plan actions"},
        plan.status === "awaiting_approval" ? [act("approve", "Approve plan"), act("reject", "Reject plan")] : null,
        plan.status === "paused" ? act("resume", "Resume") : act("pause", "Pause"), act("cancel", "Cancel")));
    graph.replaceChildren(plan.tasks?.length ? taskGraph("Task graph", plan.tasks) : "");
    tasks.replaceChildren(table("Tasks", [
      {label: "Task", cell: t => t.item_index != null ? `${t.key} [${t.item_index}]` : t.key},
      {label: "State", cell: t => badge(t.status)},
      {label: "Depends on", cell: t => t.depends_on.join(", ") || "—"},
      {label: "Agent", cell: t => t.agent},
      {label: "Run", cell: t => t.run_id ? [h("a", {href: `#/runs/${t.run_id}`}, t.run_id),
                                            t.run_status ? [" ", badge(t.run_status)] : null] : "—"},
      {label: "Cost", cell: t => t.usage ? `$${t.usage.cost_usd}` : "—"},
      {label: "Error", cell: t => t.error || ""},
    ], plan.tasks || [], "No tasks."));
    if (TERMINAL.has(plan.status)) clearInterval(timer);
  }
  await refresh();
  timer = setInterval(() => refresh().catch(() => {}), REFRESH_MS);
  return () => clearInterval(timer);
}
