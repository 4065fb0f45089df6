"""`mainspring plan FILE` and `mainspring plans …`, wired in by mainspring/cli.py. They talk HTTP to the server
(`make up`), as `mainspring run` does (agents/client.py); bad input and server errors print a message and exit
with code 2, a plan that did not succeed exits 1.

    mainspring plan plan.yaml --follow        create the plan, then show its events until it ends
    mainspring plan "a note on rivers"        a goal: the planner agent writes the tasks (--planner-model,
                                              --max-tasks), then the plan starts as any other
    mainspring plans list                     the project's plans
    mainspring plans show PLAN                the task graph: state, run, artifact hash of each task
    mainspring plans approve|reject|cancel|pause|resume PLAN
    mainspring plans approve-task PLAN TASK   a task's approval gate (reject-task too)
    mainspring plans budget PLAN --tokens N --usd X   raise the plan's budget: budget-paused tasks go on
    mainspring plans events PLAN              the plan's events, live
    mainspring plans audit PLAN               every run's audit chain verified; the plan-level head
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mainspring.agents.client import Server
from mainspring.agents.plans.planner import MAX_TASKS
from mainspring.agents.plans.spec import PlanError, PlanSpec, load_plan
from mainspring.console import fail

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
plans_app = typer.Typer(no_args_is_help=True, add_completion=False)

API_KEY = typer.Option(None, "--api-key", envvar="MAINSPRING_API_KEY", show_envvar=True,
                       help="API key, when the server requires one")
STATE_STYLE = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "running": "cyan",
               "dispatched": "cyan", "awaiting_approval": "magenta", "skipped": "yellow"}


def _state(status: str) -> str:
    style = STATE_STYLE.get(status)
    return f"[{style}]{status}[/{style}]" if style else status


def describe_event(ev: dict) -> str:
    task = f" {ev['task']}" if ev.get("task") else ""
    data = {k: v for k, v in ev.get("data", {}).items() if v not in (None, [], {})}
    detail = ", ".join(f"{k}={v}" for k, v in data.items())
    return f"{ev['id']:>4} {ev['type']}{escape(task)}" + (f"  [dim]{escape(detail[:160])}[/dim]" if detail else "")


def show_plan(plan: dict) -> None:
    out.print(f"[bold]{escape(plan['id'])}[/bold] {_state(plan['status'])}  {escape(plan.get('name') or '')}")
    out.print(f"goal: {escape(plan['goal'][:200])}")
    table = Table(box=None, pad_edge=False, show_edge=False)
    for col in ("task", "state", "agent", "after", "run", "tokens", "cost $", "artifact sha256", "error"):
        table.add_column(col, overflow="fold")
    for t in plan.get("tasks") or []:
        run = t["run_id"] or ""
        if t.get("pause_reason"):  # e.g. "paused: budget", its share of the plan's budget spent
            run += f" ({t.get('run_status')}: {t['pause_reason']})"
        used = t.get("usage") or {}
        tokens = used.get("prompt_tokens", 0) + used.get("completion_tokens", 0) if used else ""
        table.add_row(escape(t["key"]), _state(t["status"]), escape(t["agent"]), escape(",".join(t["depends_on"])),
                      escape(run), str(tokens), used.get("cost_usd") or "", (t["artifact_sha256"] or "")[:12],
                      escape((t["error"] or "")[:80]))
    out.print(table)
    for t in plan.get("tasks") or []:  # on_failure "replan": the planner's revision the task now runs with
        if t.get("prompt_override"):
            out.print(f"[dim]{escape(t['key'])} revised by the planner ({t.get('replans', 0)}×): "
                      f"{escape(t['prompt_override'][:300])}[/dim]")
    usage = plan.get("usage")
    if usage:
        out.print(f"[dim]{usage['runs']} runs, {usage['prompt_tokens']} prompt + {usage['completion_tokens']} "
                  f"completion tokens ({usage['cached_tokens']} cached), ${usage['cost_usd']}[/dim]")
        if usage.get("saved_u"):
            out.print(f"[dim]routing saved ${usage['saved_usd']}: ${usage['cost_strongest_usd']} on each task's "
                      f"agent's own model[/dim]")
    limits = [f"{plan['token_budget']} tokens" if plan.get("token_budget") is not None else "",
              f"${plan['cost_budget_usd']}" if plan.get("cost_budget_usd") is not None else ""]
    if any(limits):
        out.print(f"[dim]budget: {', '.join(x for x in limits if x)}[/dim]")


def follow(server: Server, plan_id: str) -> dict:
    try:
        for ev in server.follow_events(f"/v1/plans/{plan_id}/events", plan_id):
            out.print(describe_event(ev))
    except KeyboardInterrupt:
        err.print(f"stopped following; the plan goes on — follow it again: mainspring plans events {plan_id}")
        raise typer.Exit(130)
    plan = server.get(f"/v1/plans/{plan_id}")
    show_plan(plan)
    return plan


PLAN_SUFFIXES = (".yaml", ".yml", ".json")
PLANNER_TIMEOUT_S = 600  # the planner is a model call (two, when its first plan is refused): give it time


def _is_yaml_plan(text: str) -> bool:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return isinstance(doc, dict) and "tasks" in doc


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a goal longer than a file name may be
        return False


def plan_source(source: str) -> PlanSpec | None:
    """The plan `source` is (a plan file, or a plan's JSON or multi-line YAML text), or None: it is a goal. A
    name like "plan.yaml" that is no file is an error, not a goal."""
    path, text = Path(source), source.strip()
    named_file = path.suffix.lower() in PLAN_SUFFIXES and not any(c.isspace() for c in text)
    doc: Path | str
    if _is_file(path) or named_file:
        if not _is_file(path):
            fail(f"no plan file {source!r}")
        doc, where = path, str(path)
    elif text.startswith("{") or ("\n" in text and _is_yaml_plan(text)):
        doc, where = text, "the plan"
    else:
        return None
    try:
        return load_plan(doc)
    except PlanError as exc:
        fail(f"{where}: {exc.param + ': ' if exc.param else ''}{exc}")


def plan_cmd(source: str = typer.Argument(..., help="a plan file (YAML or JSON: goal, tasks, ...), or a goal for "
                                                    "the planner agent to turn into tasks"),
             follow_: bool = typer.Option(False, "--follow", "-f", help="show its events until it ends"),
             planner_model: Optional[str] = typer.Option(None, "--planner-model", help="the model that writes the "
                                                         "plan from a goal (default: the server's)"),
             max_tasks: Optional[int] = typer.Option(None, "--max-tasks", min=1, max=MAX_TASKS,
                                                     help="the most tasks the planner may write (default 8)"),
             api_key: Optional[str] = API_KEY) -> None:
    """Start a plan: a DAG of agent tasks, from a plan file or written by the planner agent from a goal."""
    spec = plan_source(source)
    server = Server(api_key)
    if spec is not None:
        if planner_model is not None or max_tasks is not None:
            fail("--planner-model and --max-tasks are for a goal; this is a plan with its tasks written out")
        plan = server.post("/v1/plans", json.loads(spec.model_dump_json(exclude_defaults=True)))
        out.print(f"plan {plan['id']} {plan['status']}: {len(plan['tasks'])} tasks")
    else:
        body: dict = {"goal": source}
        if planner_model is not None:
            body["planner_model"] = planner_model
        if max_tasks is not None:
            body["max_tasks"] = max_tasks
        err.print("[dim]the planner is writing the tasks…[/dim]")
        plan = server.post("/v1/plans", body, timeout=PLANNER_TIMEOUT_S)  # a refused plan: message, exit 2
        show_plan(plan)
    if follow_:
        plan = follow(server, plan["id"])
        raise typer.Exit(0 if plan["status"] == "succeeded" else 1)


@plans_app.command("list")
def list_cmd(limit: int = typer.Option(20, min=1, max=500), status: Optional[str] = None,
             api_key: Optional[str] = API_KEY) -> None:
    """The project's plans, newest first."""
    params = {"limit": limit, **({"status": status} if status else {})}
    for p in Server(api_key).get("/v1/plans", params=params)["data"]:
        out.print(f"{p['id']}  {_state(p['status'])}  {escape((p.get('name') or p['goal'])[:80])}")


@plans_app.command("show")
def show_cmd(plan_id: str, api_key: Optional[str] = API_KEY) -> None:
    """The task graph: each task's state, run, artifact hash and error; the plan's usage and cost."""
    show_plan(Server(api_key).get(f"/v1/plans/{plan_id}"))


@plans_app.command("audit")
def audit_cmd(plan_id: str, api_key: Optional[str] = API_KEY) -> None:
    """Verify every run's audit chain; print the plan-level head (exit 1 when a chain is broken)."""
    a = Server(api_key).get(f"/v1/plans/{plan_id}/audit")
    for r in a["runs"]:
        mark = "[green]ok[/green]" if r["ok"] else f"[red]broken at entry {r['broken_at']}: {escape(r['reason'])}[/red]"
        where = escape(r["task"]) if r["task"] else f"asked by {r['parent_run_id']}"
        out.print(f"{r['run_id']}  {where}  {r['entries']} entries  {mark}")
    out.print(f"plan head {a['head']} over {a['events']} events and {len(a['runs'])} runs")
    raise typer.Exit(0 if a["ok"] else 1)


@plans_app.command("events")
def events_cmd(plan_id: str, api_key: Optional[str] = API_KEY) -> None:
    """The plan's events, live, until it ends."""
    plan = follow(Server(api_key), plan_id)
    raise typer.Exit(0 if plan["status"] == "succeeded" else 1)


def _action(action: str):
    def command(plan_id: str, comment: Optional[str] = None, api_key: Optional[str] = API_KEY) -> None:
        plan = Server(api_key).post(f"/v1/plans/{plan_id}/{action}", {"comment": comment} if comment else {})
        out.print(f"plan {plan['id']} {plan['status']}")
    command.__doc__ = f"{action.capitalize()} the plan."
    return command


def _task_action(action: str):
    def command(plan_id: str, task: str, comment: Optional[str] = None, api_key: Optional[str] = API_KEY) -> None:
        plan = Server(api_key).post(f"/v1/plans/{plan_id}/tasks/{task}/{action}", {"comment": comment} if comment
                                    else {})
        state = next((t["status"] for t in plan["tasks"] if t["key"] == task), "?")
        out.print(f"task {task} of {plan['id']}: {state}")
    command.__doc__ = f"{action.capitalize()} a task waiting at its approval gate."
    return command


@plans_app.command("budget")
def budget_cmd(plan_id: str,
               tokens: Optional[int] = typer.Option(None, "--tokens", min=1, help="the plan's new token budget"),
               usd: Optional[str] = typer.Option(None, "--usd", help="the plan's new cost budget, USD, e.g. 0.50"),
               actor: Optional[str] = None, api_key: Optional[str] = API_KEY) -> None:
    """Raise the plan's budget; its tasks paused for their budget get their new share and go on."""
    if tokens is None and usd is None:
        fail("give --tokens, --usd or both")
    body = {k: v for k, v in {"token_budget": tokens, "cost_budget_usd": usd, "actor": actor}.items() if v is not None}
    plan = Server(api_key).post(f"/v1/plans/{plan_id}/budget", body)
    paused = [t["key"] for t in plan.get("tasks") or [] if t.get("pause_reason") == "budget"]
    still = f"; still over budget: {', '.join(paused)}" if paused else ""
    out.print(f"plan {plan['id']} {plan['status']}: budget {plan.get('token_budget') or '-'} tokens, "
              f"${plan.get('cost_budget_usd') or '-'}{still}")


for _name in ("approve", "reject", "cancel", "pause", "resume"):
    plans_app.command(_name)(_action(_name))
for _name in ("approve", "reject"):
    plans_app.command(f"{_name}-task")(_task_action(_name))
