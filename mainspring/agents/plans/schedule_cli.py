"""`mainspring schedules …`, wired in by mainspring/cli.py. Talks HTTP to the server (`make up`) like
`mainspring plans`; bad input and server errors print a message and exit with code 2.

    mainspring schedules list                                     the project's schedules
    mainspring schedules create NAME --cron '0 9 * * 1-5' --timezone Europe/Paris --plan plan.yaml
    mainspring schedules create NAME --cron '*/15 * * * *' --agent triage --goal 'triage new issues'
    mainspring schedules create NAME --webhook --agent triage --goal 'triage this issue'   (prints the secret once)
    mainspring schedules delete|pause|resume SCHEDULE
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from mainspring.agents.client import Server
from mainspring.agents.plans.cli import API_KEY
from mainspring.agents.plans.spec import PlanError, load_plan
from mainspring.console import fail

out = Console(highlight=False, soft_wrap=True)
schedules_app = typer.Typer(no_args_is_help=True, add_completion=False)


def _when(t: int | None) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if t else "-"


def _what(s: dict) -> str:
    target = s["target"]
    if "plan" in target:
        return f"plan {target['plan'].get('name') or target['plan']['goal'][:40]!r}"
    return f"agent {target['agent']}: {target['goal'][:40]!r}"


def describe(s: dict) -> str:
    trigger = f"cron '{s['cron']}' {s['timezone']}" if s["kind"] == "cron" else f"webhook {s['hook_url']}"
    state = "enabled" if s["enabled"] else "[yellow]paused[/yellow]"
    line = (f"{s['id']}  {state}  {escape(s['name'])}  {escape(trigger)}  {escape(_what(s))}  "
            f"fired {s['fire_count']}x")
    if s["kind"] == "cron" and s["enabled"]:
        line += f", next {_when(s['next_fire_at'])}"
    if s.get("last_error"):
        line += f"  [red]{escape(s['last_error'][:120])}[/red]"
    return line


@schedules_app.command("list")
def list_cmd(limit: int = typer.Option(100, min=1, max=500), api_key: Optional[str] = API_KEY) -> None:
    """The project's schedules, newest first."""
    for s in Server(api_key).get("/v1/schedules", params={"limit": limit})["data"]:
        out.print(describe(s))


@schedules_app.command("create")
def create_cmd(name: str = typer.Argument(..., help="a name for the schedule"),
               cron: Optional[str] = typer.Option(None, help="a cron expression, e.g. '*/15 * * * *'"),
               webhook: bool = typer.Option(False, "--webhook", help="fire on signed POSTs to /v1/hooks/{id}"),
               timezone_: str = typer.Option("UTC", "--timezone", help="the IANA zone the cron is read in"),
               plan: Optional[Path] = typer.Option(None, help="a plan file (YAML or JSON) each fire starts"),
               agent: Optional[str] = typer.Option(None, help="or: the agent each fire runs ..."),
               goal: Optional[str] = typer.Option(None, help="... on this goal"),
               api_key: Optional[str] = API_KEY) -> None:
    """Start a plan or an agent run on a cron schedule, or on a signed webhook."""
    if webhook == (cron is not None):
        fail("give --cron EXPR or --webhook (one of them)")
    if (plan is None) == (agent is None):
        fail("give --plan FILE, or --agent NAME with --goal TEXT")
    body: dict = {"name": name, "timezone": timezone_}
    body.update({"kind": "webhook"} if webhook else {"cron": cron})
    if plan is not None:
        if not plan.is_file():
            fail(f"{plan} is not a plan file")
        try:
            body["plan"] = json.loads(load_plan(plan).model_dump_json(exclude_defaults=True))
        except PlanError as exc:
            fail(f"{plan}: {exc.param + ': ' if exc.param else ''}{exc}")
    else:
        body.update(agent=agent, goal=goal)
    created = Server(api_key).post("/v1/schedules", body)
    out.print(describe(created))
    if created.get("secret"):
        out.print(f"webhook secret (shown once, keep it): [bold]{created['secret']}[/bold]\n"
                  f"sign each POST to {created['hook_url']} with the header X-Hub-Signature-256: sha256=<hex "
                  "HMAC-SHA256 of the body under this secret>")


@schedules_app.command("delete")
def delete_cmd(schedule_id: str, api_key: Optional[str] = API_KEY) -> None:
    """Delete a schedule (what it started stays)."""
    Server(api_key).call("DELETE", f"/v1/schedules/{schedule_id}")
    out.print(f"schedule {schedule_id} deleted")


def _action(action: str):
    def command(schedule_id: str, api_key: Optional[str] = API_KEY) -> None:
        out.print(describe(Server(api_key).post(f"/v1/schedules/{schedule_id}/{action}")))
    command.__doc__ = {"pause": "Pause a schedule: nothing fires until it is resumed.",
                       "resume": "Resume a schedule: a cron goes on from its next slot (none missed while paused "
                                 "fires)."}[action]
    return command


for _name in ("pause", "resume"):
    schedules_app.command(_name)(_action(_name))
