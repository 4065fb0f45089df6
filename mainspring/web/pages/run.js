// One run, live: its events over SSE (model steps, tool calls with arguments and results, approvals),
// the actions a person takes on it, and its audit chain (verified by the server) with the JSONL download.
import {download, follow, get, post} from "../api.js";
import {badge, h, notify, when} from "../dom.js";

const TERMINAL = new Set(["succeeded", "failed", "cancelled", "timed_out"]);

function pretty(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch { return text ?? ""; }
}

export async function render(main, runId) {
  let run = await get(`/v1/runs/${runId}`);
  const head = h("div", {class: "run-head"});
  const actions = h("div", {class: "actions", role: "group", "aria-label": "Run actions"});
  const approvals = h("section", {id: "approvals", "aria-labelledby": "approvals-h"});
  const timeline = h("ol", {id: "timeline", class: "timeline", "aria-live": "polite"});
  const audit = h("section", {id: "audit", "aria-labelledby": "audit-h"});
  const sceneLink = h("p", {hidden: true}, h("a", {href: `#/scenes/${runId}`, id: "scene-link"}, "View its scenes in 3D"));

  // raising a budget queues a run its budget paused (POST /v1/runs/{id}/budget); the server checks the values
  const costField = h("input", {id: "budget-cost", name: "cost_budget_usd", inputmode: "decimal", size: 10,
                                placeholder: "e.g. 0.50"});
  const tokenField = h("input", {id: "budget-tokens", name: "token_budget", inputmode: "numeric", size: 10});
  const budgetNote = h("p", {class: "needs", "aria-live": "polite"});
  const budget = h("form", {class: "filters", "aria-label": "Raise the budget", onsubmit: async e => {
    e.preventDefault();
    const body = {};
    if (costField.value.trim()) body.cost_budget_usd = costField.value.trim();
    const tokens = tokenField.value.trim(), n = Number(tokens);
    if (tokens) body.token_budget = Number.isInteger(n) ? n : tokens;  // not a number: the server says why
    try {
      run = await post(`/v1/runs/${runId}/budget`, body);
      showHead();
      notify("Budget changed");
    } catch (err) { notify(`Budget not changed: ${err.message}`); }
  }}, budgetNote, h("label", {for: "budget-cost"}, "Cost budget (USD)"), costField,
     h("label", {for: "budget-tokens"}, "Token budget"), tokenField, h("button", {type: "submit"}, "Set budget"));

  main.append(h("p", {}, h("a", {href: "#/runs"}, "← Runs")), h("h2", {}, "Run ", h("code", {}, runId)), head,
              actions, budget, sceneLink, approvals,
              h("section", {"aria-labelledby": "events-h"}, h("h3", {id: "events-h"}, "Events"), timeline), audit);

  function showHead() {
    head.replaceChildren(h("dl", {class: "facts"},
      h("dt", {}, "State"), h("dd", {id: "run-status"}, badge(run.status), run.pause_reason ? ` (${run.pause_reason})` : ""),
      h("dt", {}, "Goal"), h("dd", {}, run.goal),
      h("dt", {}, "Agent"), h("dd", {}, run.agent_id),
      h("dt", {}, "Steps"), h("dd", {}, String(run.step_count)),
      h("dt", {}, "Tokens"), h("dd", {}, `${run.usage.prompt_tokens} in (${run.usage.cached_tokens} cached), ` +
                                         `${run.usage.completion_tokens} out`),
      h("dt", {}, "Cost"), h("dd", {}, `$${run.cost_usd}` + (run.budget.cost_budget_usd ?
                                         ` of $${run.budget.cost_budget_usd}` : "")),
      run.result != null ? [h("dt", {}, "Result"), h("dd", {id: "run-result"}, run.result)] : null,
      run.error ? [h("dt", {}, "Error"), h("dd", {class: "error"}, run.error)] : null,
      h("dt", {}, "Created"), h("dd", {}, when(run.created_at))));
    const act = (action, label, enabled) => h("button", {type: "button", disabled: !enabled, onclick: async () => {
      try { run = await post(`/v1/runs/${runId}/${action}`); showHead(); notify(`${label}: done`); }
      catch (e) { notify(`${label} failed: ${e.message}`); }
    }}, label);
    const live = !TERMINAL.has(run.status);
    budget.hidden = !live;
    if (run.pause_reason === "budget") budgetNote.textContent = "Paused: it reached its budget. Raise it to go on.";
    else budgetNote.textContent = "";
    actions.replaceChildren(act("pause", "Pause", run.status === "queued" || run.status === "running"),
                            act("resume", "Resume", run.status === "paused"),
                            act("cancel", "Cancel", live));
  }

  const cards = new Map();  // interrupt id -> its card
  const empty = h("p", {class: "empty"}, "No tool call waits for approval.");
  approvals.append(h("h3", {id: "approvals-h"}, "Waiting for you"), empty);

  async function showApprovals() {
    const pending = (await get("/v1/interrupts", {run_id: runId})).data;
    const ids = new Set(pending.map(i => i.id));
    for (const [id, card] of cards) if (!ids.has(id)) { card.remove(); cards.delete(id); }
    empty.hidden = pending.length > 0;
    for (const i of pending.filter(i => !cards.has(i.id))) {  // a card kept keeps what the user typed in it
      const comment = h("input", {id: `c-${i.id}`, type: "text", name: "comment"});
      const edited = h("textarea", {id: `e-${i.id}`, name: "arguments", rows: 4, spellcheck: "false"},
                       pretty(i.tool_call.arguments));
      const decide = (decision) => async () => {
        const body = {decision};
        if (decision === "reject" && comment.value) body.comment = comment.value;
        if (decision === "edit") {
          try { body.arguments = JSON.parse(edited.value); } catch (e) {
            notify(`The arguments are not JSON: ${e.message}`);
            edited.focus();
            return;
          }
        }
        try {
          await post(`/v1/interrupts/${i.id}/resolve`, body);
          notify(`${{approve: "Approved", reject: "Rejected", edit: "Ran with edited arguments:"}[decision]} ` +
                 `${i.tool_call.name}`);
          run = await get(`/v1/runs/${runId}`);
          showHead();
          await showApprovals();
        } catch (e) { notify(`Failed: ${e.message}`); }
      };
      const card = h("article", {class: "approval", "aria-label": `Approval for ${i.tool_call.name}`},
        h("p", {}, "Tool ", h("code", {}, i.tool_call.name || "?"), " wants to run with:"),
        h("pre", {}, pretty(i.tool_call.arguments)),
        h("div", {class: "row"},
          h("button", {type: "button", class: "approve", onclick: decide("approve")}, "Approve"),
          h("button", {type: "button", class: "reject", onclick: decide("reject")}, "Reject")),
        h("label", {for: `c-${i.id}`}, "Comment for the model (on reject)"), comment,
        h("details", {}, h("summary", {}, "Edit the arguments"),
          h("label", {for: `e-${i.id}`}, "Arguments (JSON object)"), edited,
          h("div", {class: "row"}, h("button", {type: "button", onclick: decide("edit")}, "Run with these arguments"))));
      cards.set(i.id, card);
      approvals.append(card);
    }
  }

  function item(ev) {
    const d = ev.data;
    const at = h("time", {}, when(ev.created_at));
    switch (ev.type) {
      case "step.completed":
        return h("li", {class: "ev model"}, at, h("strong", {}, `Model step ${d.seq}`),
          d.content ? h("p", {class: "text"}, d.content) : null,
          (d.tool_calls || []).map(c => h("div", {class: "call"}, "→ ", h("code", {}, c.name),
                                          h("pre", {}, pretty(c.arguments)))),
          h("small", {}, `${d.usage?.prompt_tokens ?? 0} in, ${d.usage?.completion_tokens ?? 0} out`));
      case "tool.started":
        return h("li", {class: "ev tool"}, at, h("strong", {}, "Tool call "), h("code", {}, d.name),
          h("pre", {class: "args"}, pretty(d.arguments)));
      case "tool.finished":
        return h("li", {class: `ev tool-result ${d.status}`}, at, h("strong", {}, `Result of `),
          h("code", {}, d.name), ` (${d.status})`, h("pre", {class: "result"}, d.content),
          (d.artifacts || []).map(a => h("div", {}, "+ ", a.name)));
      case "interrupt.created":
        return h("li", {class: "ev approval"}, at, h("strong", {}, "Approval needed for "), h("code", {}, d.name));
      case "interrupt.resolved":
        return h("li", {class: "ev"}, at, h("strong", {}, `Approval ${d.decision}`), d.actor ? ` by ${d.actor}` : "");
      case "run.finished":
        return h("li", {class: "ev end"}, at, h("strong", {}, "Finished: "), badge(d.status));
      case "run.status":
        return h("li", {class: "ev status"}, at, "Now ", badge(d.status), d.reason ? ` (${d.reason})` : "");
      default:
        return h("li", {class: "ev minor"}, at, ev.type);
    }
  }

  async function onEvent(ev) {
    timeline.append(item(ev));
    if ((ev.data.tool_calls || []).some(c => c.name.startsWith("scene_"))) sceneLink.hidden = false;
    if (ev.type.startsWith("run.") || ev.type.startsWith("interrupt.") || ev.type === "step.completed") {
      run = await get(`/v1/runs/${runId}`);
      showHead();
      if (ev.type.startsWith("interrupt.")) await showApprovals();
    }
  }

  function showAudit() {
    const verdict = h("p", {id: "audit-verdict", "aria-live": "polite"});
    audit.replaceChildren(h("h3", {id: "audit-h"}, "Audit trail"),
      h("div", {class: "row"},
        h("button", {type: "button", id: "verify", onclick: async () => {
          verdict.textContent = "Checking…";
          try {
            const v = await get(`/v1/runs/${runId}/audit`);
            verdict.className = v.ok ? "ok" : "error";
            verdict.textContent = v.ok ? `Chain intact: ${v.entries} entries, head ${v.head.slice(0, 16)}…`
              : `Chain broken at entry ${v.broken_at}: ${v.reason}`;
          } catch (e) { verdict.className = "error"; verdict.textContent = e.message; }
        }}, "Verify chain"),
        h("button", {type: "button", onclick: () => download(`/v1/runs/${runId}/audit.jsonl`,
                                                            `${runId}.audit.jsonl`).catch(e => notify(e.message))},
          "Download JSONL")),
      verdict);
  }

  showHead();
  showAudit();
  await showApprovals();
  return follow(`/v1/runs/${runId}/events`, ev => { onEvent(ev).catch(() => {}); });
}
