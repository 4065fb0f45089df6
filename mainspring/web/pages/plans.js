// Plans, newest first, with their state and spend.
import {get} from "../api.js";
import {badge, h, table, when} from "../dom.js";

export async function render(main) {
  const plans = (await get("/v1/plans", {limit: 200})).data;
  main.append(h("h2", {}, "Plans"), table(`${plans.length} plans`, [
    {label: "Plan", cell: p => h("a", {href: `#/plans/${p.id}`}, p.name || p.id)},
    {label: "State", cell: p => badge(p.status)},
    {label: "Goal", cell: p => h("span", {class: "clip", title: p.goal}, p.goal)},
    {label: "Created", cell: p => when(p.created_at)},
  ], plans, "No plans yet."));
}
