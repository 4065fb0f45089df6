"""`mainspring plan FILE` and `mainspring plans …`, wired in by mainspring/cli.py. They talk HTTP to the server
(`make up`), as `mainspring run` does (agents/client.py); bad input and server errors print a message and exit
with code 2, a plan that did not succeed exits 1.

    mainspring plan plan.yaml --follow        create the plan, then show its events until it ends
    mainspring plans list                     the project's plans
    mainspring plans show PLAN                the task graph: state, run, artifact hash of each task
    mainspring plans approve|reject|cancel|pause|resume PLAN
    mainspring plans approve-task PLAN TASK   a task's approval gate (reject-task too)
    mainspring plans events PLAN              the plan's events, live
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mainspring.agents.client import Server
from mainspring.agents.plans.spec import PlanError, load_plan
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
    for col in ("task", "state", "agent", "after", "run", "artifact sha256", "error"):
        table.add_column(col, overflow="fold")
    for t in plan.get("tasks") or []:
        table.add_row(escape(t["key"]), _state(t["status"]), escape(t["agent"]), escape(",".join(t["depends_on"])),
                      t["run_id"] or "", (t["artifact_sha256"] or "")[:12], escape((t["error"] or "")[:80]))
    out.print(table)
    usage = plan.get("usage")
    if usage:
        out.print(f"[dim]{usage['runs']} runs, {usage['prompt_tokens']} prompt + {usage['completion_tokens']} "
                  f"completion tokens ({usage['cached_tokens']} cached), ${usage['cost_usd']}[/dim]")


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


def plan_cmd(source: str = typer.Argument(..., help="a plan file (YAML or JSON): goal, tasks, ..."),
             follow_: bool = typer.Option(False, "--follow", "-f", help="show its events until it ends"),
             api_key: Optional[str] = API_KEY) -> None:
    """Start a plan: a DAG of agent tasks from a plan file."""
    path = Path(source)
    if not path.is_file():
        fail(f"{source!r} is not a plan file; write the tasks as YAML or JSON (docs/agents.md#plans) — "
             "planning a bare goal with a planner agent is not built yet")
    try:
        spec = load_plan(path)
    except PlanError as exc:
        fail(f"{path}: {exc.param + ': ' if exc.param else ''}{exc}")
    server = Server(api_key)
    plan = server.post("/v1/plans", json.loads(spec.model_dump_json(exclude_defaults=True)))
    out.print(f"plan {plan['id']} {plan['status']}: {len(plan['tasks'])} tasks")
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


for _name in ("approve", "reject", "cancel", "pause", "resume"):
    plans_app.command(_name)(_action(_name))
for _name in ("approve", "reject"):
    plans_app.command(f"{_name}-task")(_task_action(_name))
