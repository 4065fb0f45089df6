"""How a run reads to a person at a terminal: one line of rich markup per event, a run's totals, its budget.
Everything from the run (goals, model text, tool output) is escaped, never read as markup."""

from __future__ import annotations

import json
from typing import Any

from rich.markup import escape

CLIP = 160


def clip(text: Any, n: int = CLIP) -> str:
    text = " ".join(str(text).split())
    return escape(text if len(text) <= n else text[: n - 1] + "…")


def describe(ev: dict) -> str | None:
    """One event as rich markup for a person following the run (None: nothing worth a line)."""
    d, run, kind = ev.get("data") or {}, ev.get("run_id", "RUN"), ev.get("type")
    if kind == "run.created":
        return f"[bold]▶ {run}[/bold]  goal: {clip(d.get('goal'))}"
    if kind in ("run.claimed", "run.recovered"):
        note = "recovered after its worker stopped" if kind == "run.recovered" else "running"
        return f"[dim]· {note} (attempt {d.get('attempt')})[/dim]"
    if kind == "step.started":
        return f"[dim]· step {d.get('seq')}: attempt {d.get('attempt')}[/dim]" if d.get("attempt", 1) > 1 else None
    if kind == "step.completed":
        lines = [f"[cyan]step {d.get('seq')}[/cyan]  model: {clip(d['content'])}"] if d.get("content") else []
        lines += [f"[cyan]step {d.get('seq')}[/cyan]  → {escape(c['name'])}({clip(c['arguments'], 100)})"
                  for c in d.get("tool_calls") or []]
        return "\n".join(lines) or f"[cyan]step {d.get('seq')}[/cyan]  model: (empty answer)"
    if kind == "tool.started":
        return f"[dim]· {escape(d['name'])}: attempt {d['attempt']}[/dim]" if d.get("attempt", 1) > 1 else None
    if kind == "tool.finished":
        colour = "green" if d.get("status") == "completed" else "red"
        files = "".join(f"  [dim]+ {escape(a['name'])}[/dim]" for a in d.get("artifacts") or [])
        head = f"[{colour}]{escape(d.get('name', '?'))} {d.get('status')}[/{colour}]"
        return f"        {head} → {clip(d.get('content'))}{files}"
    if kind == "step.retry":
        return f"[dim]· model retry {d.get('attempt')}: {clip(d.get('error'))}[/dim]"
    if kind == "context.compacted":
        return f"[dim]· compacted the context (steps ≤ {d.get('through_seq')} summarized)[/dim]"
    if kind == "interrupt.created":
        i = d.get("interrupt_id")
        why = ("was running when its worker stopped: run it again?" if d.get("kind") == "in_flight"
               else "waiting for approval")
        return (f"[yellow bold]⏸ {why}[/yellow bold]: {escape(d.get('name', '?'))}({clip(d.get('arguments'), 300)})\n"
                f"    approve: mainspring runs approve {i}\n"
                f"    edit:    mainspring runs approve {i} --args '{{…}}'\n"
                f"    reject:  mainspring runs reject {i} --comment 'why'")
    if kind == "interrupt.resolved":
        decision = str(d.get("decision"))
        done = {"approve": "approved", "reject": "rejected", "edit": "edited"}.get(decision, decision)
        return f"[yellow]  {done}[/yellow] by {escape(str(d.get('actor')))}"
    if kind == "budget.changed":
        return f"[dim]· budget: {d.get('token_budget') or '∞'} tokens, {_usd_u(d.get('cost_budget_u'))}[/dim]"
    if kind == "run.status":
        status, reason = d.get("status"), d.get("reason")
        if status == "paused" and reason == "budget":
            return (f"[yellow bold]⏸ paused: budget reached[/yellow bold] — raise it: "
                    f"mainspring runs budget {run} --tokens N (or --usd X)")
        if status == "paused":
            return f"[yellow bold]⏸ paused[/yellow bold] — resume it: mainspring runs resume {run}"
        return f"[dim]· {status} ({escape(str(reason))})[/dim]" if status != "waiting_approval" else None
    if kind == "run.finished":
        status = d.get("status")
        if status == "succeeded":
            return f"[green bold]✓ succeeded[/green bold] ({d.get('stop_reason')})"
        return f"[red bold]✗ {status}[/red bold]" + (f": {clip(d['error'], 500)}" if d.get("error") else "")
    return f"[dim]· {escape(str(kind))} {clip(json.dumps(d), 100)}[/dim]"


def _usd_u(u: int | None) -> str:
    return "no cost limit" if u is None else f"${u / 1e6:.6f}".rstrip("0").rstrip(".")


def summary(run: dict) -> str:
    u = run["usage"]
    steps = f"{run['step_count']} step{'' if run['step_count'] == 1 else 's'}"
    return (f"{run['status']} · {steps} · {u['total_tokens']:,} tokens "
            f"({u['prompt_tokens']:,} in, {u['cached_tokens']:,} cached, {u['completion_tokens']:,} out) · "
            f"${run['cost_usd']} · {run['id']}")


def budget_text(b: dict) -> str:
    cost = f"${b['cost_budget_usd']}" if b["cost_budget_usd"] else "no cost limit"
    return f"{b['token_budget'] or '∞'} tokens, {cost}"
