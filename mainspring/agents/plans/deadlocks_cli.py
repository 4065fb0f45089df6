"""`mainspring deadlocks …`: the deadlocks and livelocks the plan scheduler found, and the live wait-for graph,
over HTTP like `mainspring plans` (agents/client.py: a server error prints a message and exits with code 2).

    mainspring deadlocks list [--plan P] [--open]   newest first, each cycle spelled out
    mainspring deadlocks show ID
    mainspring deadlocks resolve ID --fail TASK     an open one (deadlock_policy ask_human): fail that member
    mainspring deadlocks resolve ID --release TASK  or let it go on (its wait ends with an error it sees)
    mainspring deadlocks waits [--plan P]           which task waits for which, now
"""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from mainspring.agents.client import Server
from mainspring.agents.plans.cli import API_KEY
from mainspring.console import fail

out = Console(highlight=False, soft_wrap=True)
deadlocks_app = typer.Typer(no_args_is_help=True, add_completion=False)


def _line(d: dict) -> str:
    colour = "yellow" if d["status"] == "open" else "dim"
    who = f"  victim: {escape(d['victim'])}" if d.get("victim") else ""
    return (f"{d['id']}  [{colour}]{d['status']}[/{colour}]  {d['kind']}  plan {d['plan_id']}  "
            f"{escape(d['text'])}{who}")


@deadlocks_app.command("list")
def list_cmd(plan: Optional[str] = typer.Option(None, "--plan", help="only this plan's"),
             open_only: bool = typer.Option(False, "--open", help="only those waiting for a person"),
             api_key: Optional[str] = API_KEY) -> None:
    """Deadlocks (wait-for cycles between tasks) and livelocks, newest first."""
    params = {**({"plan_id": plan} if plan else {}), **({"status": "open"} if open_only else {})}
    rows = Server(api_key).get("/v1/diagnostics/deadlocks", params=params)["data"]
    for d in rows:
        out.print(_line(d))
    if not rows:
        out.print("[dim]none[/dim]")


@deadlocks_app.command("show")
def show_cmd(deadlock_id: str, api_key: Optional[str] = API_KEY) -> None:
    """One deadlock: its cycle, policy and resolution."""
    d = Server(api_key).get(f"/v1/diagnostics/deadlocks/{deadlock_id}")
    out.print(_line(d))
    out.print(f"policy: {d['policy']}" + (f"  resolution: {escape(d['resolution'])}" if d.get("resolution") else ""))


@deadlocks_app.command("resolve")
def resolve_cmd(deadlock_id: str,
                fail_task: Optional[str] = typer.Option(None, "--fail", help="fail this member (no retry)"),
                release: Optional[str] = typer.Option(None, "--release", help="release this member: its wait "
                                                                            "ends and its agent goes on"),
                api_key: Optional[str] = API_KEY) -> None:
    """Decide an open deadlock: fail one member, or release one."""
    if (fail_task is None) == (release is None):
        fail("give exactly one of --fail TASK or --release TASK")
    body = {"action": "fail", "task": fail_task} if fail_task else {"action": "release", "task": release}
    out.print(_line(Server(api_key).post(f"/v1/diagnostics/deadlocks/{deadlock_id}/resolve", body)))


@deadlocks_app.command("waits")
def waits_cmd(plan: Optional[str] = typer.Option(None, "--plan"), api_key: Optional[str] = API_KEY) -> None:
    """The open waits: which task waits for a message from which."""
    rows = Server(api_key).get("/v1/diagnostics/waits", params={"plan_id": plan} if plan else {})["data"]
    for w in rows:
        out.print(f"plan {w['plan_id']}  {escape(w['waiter'])} → {escape(w['target'])}  (run {w['run_id']})")
    if not rows:
        out.print("[dim]no task is waiting[/dim]")
