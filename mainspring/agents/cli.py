"""`mainspring run "goal"`, `mainspring runs …` and `mainspring audit …`, wired in by mainspring/cli.py:

    app.command("run")(run_cmd)
    app.add_typer(runs_app, name="runs")
    app.add_typer(audit_app, name="audit")

`run` and `runs` talk HTTP to the server (`make up`) at http://MAINSPRING_HOST:MAINSPRING_PORT, with the key in
MAINSPRING_API_KEY (or --api-key) when the server requires one. `audit` reads the database directly, so an audit
works with the server down. Bad input and server errors print a message and exit with code 2, never a traceback;
a run that did not succeed exits 1, as does an audit trail that fails verification.
The HTTP client is agents/client.py; how an event reads, agents/render.py; this file holds the commands.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Optional

import typer
from rich.console import Console
from rich.markup import escape

from mainspring.agents.client import Server
from mainspring.agents.render import budget_text, clip, describe, summary
from mainspring.console import fail

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

API_KEY = typer.Option(None, "--api-key", envvar="MAINSPRING_API_KEY", show_envvar=True,
                       help="API key, when the server requires one")


# ---- following a run -------------------------------------------------------------------------------------
def follow(server: Server, run_id: str, after: int = 0) -> dict:
    """Print the run's events as they happen until it ends; then its result and totals. Returns the run."""
    try:
        for ev in server.events(run_id, after):
            line = describe(ev)
            if line:
                out.print(line)
    except KeyboardInterrupt:
        err.print(f"stopped following; the run goes on — follow it again: mainspring runs events {run_id}")
        raise typer.Exit(130)
    run = server.get(f"/v1/runs/{run_id}")
    if run.get("result"):
        out.print(escape(run["result"]))
    out.print(f"[dim]{escape(summary(run))}[/dim]")
    return run


# ---- mainspring run --------------------------------------------------------------------------------------
def _csv(text: str | None) -> list[str] | None:
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def ensure_agent(server: Server, name: str, model: str | None, tools: list[str] | None) -> dict:
    """The agent `name` as it is, or a new version of it with the model / tools given (created if new)."""
    existing = server.get(f"/v1/agents/{name}", missing_ok=True)
    if existing is not None and model is None and tools is None:
        return existing
    spec = dict(existing["spec"]) if existing else {"name": name, "model": "default"}
    if model is not None:
        spec["model"] = model
    if tools is not None:
        spec["tools"] = tools
    return server.post("/v1/agents", spec)


MAX_UPLOADS = 500


def upload_attachments(server: Server, docs: Path | None, db: Path | None) -> dict[str, Any]:
    """Upload the run's documents and database (POST /v1/files) and attach them by id: a run may read only its
    own project's files, or paths the operator allows on the server."""
    out: dict[str, Any] = {}
    if docs is not None:
        if not docs.is_dir():
            fail(f"--docs {docs}: not a folder")
        files = sorted(p for p in docs.rglob("*") if p.is_file() and not p.is_symlink()
                       and not any(part.startswith(".") for part in p.relative_to(docs).parts))
        if not files:
            fail(f"--docs {docs}: no files in it")
        if len(files) > MAX_UPLOADS:
            fail(f"--docs {docs}: {len(files)} files, more than {MAX_UPLOADS} to upload; put the folder under "
                  "the server's MAINSPRING_AGENT_ATTACH_ROOTS and pass --server-paths")
        out["docs"] = [_upload(server, f) for f in files]
    if db is not None:
        if not db.is_file():
            fail(f"--db {db}: not a file")
        out["db"] = _upload(server, db)
    return out


def _upload(server: Server, path: Path) -> str:
    with path.open("rb") as f:
        return server.call("POST", "/v1/files", files={"file": (path.name, f)}, data={"purpose": "assistants"})["id"]


def run_cmd(
    goal: str = typer.Argument(..., help="what the agent should achieve"),
    agent: str = typer.Option("default", "--agent", "-a", help="agent name; created when new"),
    tools: Optional[str] = typer.Option(None, "--tools", help="comma-separated tool names, e.g. python,search"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="model name (new agents: 'default')"),
    follow_run: bool = typer.Option(True, "--follow/--no-follow", help="show the steps live until the run ends"),
    budget_tokens: Optional[int] = typer.Option(None, "--budget-tokens", min=1, help="pause the run past this"),
    budget_usd: Optional[str] = typer.Option(None, "--budget-usd", help="pause past this list-price cost, e.g. 0.50"),
    docs: Optional[Path] = typer.Option(None, "--docs", help="a folder of documents for the search tool "
                                        "(uploaded to the server)"),
    db: Optional[Path] = typer.Option(None, "--db", help="a SQLite/DuckDB file for the sql tool (uploaded)"),
    server_paths: bool = typer.Option(False, "--server-paths", help="send --docs/--db as paths on the server "
                                      "instead (under its MAINSPRING_AGENT_ATTACH_ROOTS)"),
    api_key: Optional[str] = API_KEY,
) -> None:
    """Start an agent run on the server and show its steps as they happen."""
    server = Server(api_key)
    spec = ensure_agent(server, agent, model, _csv(tools))
    if server_paths:
        attachments: dict[str, Any] = {k: str(v.resolve()) for k, v in (("docs", docs), ("db", db)) if v is not None}
    else:
        attachments = upload_attachments(server, docs, db)
    body: dict[str, Any] = {"agent": spec["id"], "goal": goal, "token_budget": budget_tokens,
                            "cost_budget_usd": budget_usd, "attachments": attachments or None}
    run = server.post("/v1/runs", {k: v for k, v in body.items() if v is not None})
    tool_list = ", ".join(spec["spec"]["tools"]) or "no tools"
    err.print(f"[dim]{run['id']} · agent {spec['name']} v{spec['version']} · model {spec['spec']['model']} · "
              f"{escape(tool_list)}[/dim]")
    if not follow_run:
        out.print(run["id"])
        return
    final = follow(server, run["id"])
    raise typer.Exit(0 if final["status"] == "succeeded" else 1)


# ---- mainspring runs ... ---------------------------------------------------------------------------------
runs_app = typer.Typer(help="Agent runs: list, show, events, approve, reject, cancel, pause, resume, budget.",
                       no_args_is_help=True)


@runs_app.callback()
def _runs(ctx: typer.Context, api_key: Optional[str] = API_KEY) -> None:
    ctx.obj = Server(api_key)


def _when(t: int | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _table(header: list[str], rows: list[list[str]]) -> None:
    # plain aligned text (as `mainspring keys list`): never truncates an id, and pipes cleanly
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    for line in [header, *rows]:
        typer.echo("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip())


@runs_app.command("list")
def list_runs(ctx: typer.Context, status: Optional[str] = typer.Option(None, "--status", "-s"),
              limit: int = typer.Option(20, "--limit", "-n", min=1, max=500),
              as_json: bool = typer.Option(False, "--json")) -> None:
    """Runs, newest first."""
    params = {"limit": limit, **({"status": status} if status else {})}
    runs = ctx.obj.get("/v1/runs", params=params)["data"]
    if as_json:
        typer.echo(json.dumps(runs, indent=2))
        return
    if not runs:
        typer.echo("no runs" + (f" with status {status}" if status else ""))
        return
    _table(["RUN", "STATUS", "AGENT", "STEPS", "TOKENS", "COST_USD", "CREATED", "GOAL"],
           [[r["id"], r["status"] + (f" ({r['pause_reason']})" if r["pause_reason"] else ""), r["agent_id"],
             str(r["step_count"]), str(r["usage"]["total_tokens"]), r["cost_usd"], _when(r["created_at"]),
             " ".join(r["goal"].split())[:60]] for r in runs])


@runs_app.command("show")
def show(ctx: typer.Context, run_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """A run: status, result, usage, budget, pending approvals, and its steps."""
    server: Server = ctx.obj
    run = server.get(f"/v1/runs/{run_id}")
    steps = server.get(f"/v1/runs/{run_id}/steps")["data"]
    if as_json:
        typer.echo(json.dumps({**run, "steps": steps}, indent=2))
        return
    reason = f" ({run['pause_reason']})" if run["pause_reason"] else ""
    stop = f"  stop: {run['stop_reason']}" if run["stop_reason"] else ""
    out.print(f"[bold]{run['id']}[/bold]  {run['status']}{reason}{stop}")
    out.print(f"agent   {run['agent_id']}   thread {run['thread_id']}")
    out.print(f"goal    {clip(run['goal'], 500)}")
    out.print(f"usage   {escape(summary(run))}")
    out.print(f"budget  {budget_text(run['budget'])}")
    out.print(f"times   created {_when(run['created_at'])}, started {_when(run['started_at'])}, "
              f"finished {_when(run['finished_at'])}")
    for step in steps:
        content = (step.get("output") or {}).get("content") if step["kind"] == "model" else step["kind"]
        out.print(f"[cyan]step {step['seq']}[/cyan]  {clip(content or '')}")
        for c in step["tool_calls"]:
            result = (c.get("result") or {}).get("content", "")
            out.print(f"        {escape(c['name'])}({clip(c['arguments'], 100)}) {c['status']} → {clip(result)}")
    for i in run["pending_interrupts"]:
        out.print(f"[yellow]⏸ pending approval {i}[/yellow] — mainspring runs approve {i} | reject {i}")
    if run.get("error"):
        out.print(f"[red]error[/red]   {escape(run['error'])}")
    if run.get("result"):
        out.print(f"[bold]result[/bold]\n{escape(run['result'])}")


@runs_app.command("events")
def events(ctx: typer.Context, run_id: str,
           follow_run: bool = typer.Option(True, "--follow/--no-follow", help="keep streaming until the run ends"),
           after: int = typer.Option(0, "--after", min=0, help="only events after this event id"),
           as_json: bool = typer.Option(False, "--json", help="one JSON event per line")) -> None:
    """The run's events, readable (or as JSON lines); live until the run ends with --follow."""
    server: Server = ctx.obj
    if follow_run and not as_json:
        follow(server, run_id, after)
        return
    stream = server.events(run_id, after) if follow_run else _pages(server, run_id, after)
    for ev in stream:
        if as_json:
            typer.echo(json.dumps(ev))
        elif (line := describe(ev)) is not None:
            out.print(line)


def _pages(server: Server, run_id: str, after: int) -> Iterator[dict]:
    while True:
        body = server.get(f"/v1/runs/{run_id}/events", params={"after": after, "limit": 500})
        yield from body["data"]
        if not body["has_more"]:
            return
        after = body["last_id"]


def _interrupt_id(server: Server, ref: str) -> str:
    """An interrupt id as given, or the one pending interrupt of a run."""
    if not ref.startswith("run_"):
        return ref
    pending = server.get("/v1/interrupts", params={"run_id": ref, "status": "pending"})["data"]
    if not pending:
        fail(f"run {ref} has no pending approval")
    if len(pending) > 1:
        fail(f"run {ref} has {len(pending)} pending approvals; name one: " + ", ".join(i["id"] for i in pending))
    return pending[0]["id"]


def _resolved(i: dict) -> None:
    call = i["tool_call"]
    out.print(f"{i['id']} {i['status']}: {escape(str(call['name']))}({clip(call['arguments'], 300)}) "
              f"— run {i['run_id']} continues")


@runs_app.command("approve")
def approve(ctx: typer.Context, ref: str = typer.Argument(..., metavar="INTERRUPT_OR_RUN"),
            args: Optional[str] = typer.Option(None, "--args", help="run the call with these JSON arguments instead"),
            comment: Optional[str] = typer.Option(None, "--comment")) -> None:
    """Let the tool call run (as the model asked, or with --args)."""
    body: dict[str, Any] = {"decision": "approve", "comment": comment}
    if args is not None:
        try:
            arguments = json.loads(args)
        except ValueError as exc:
            fail(f"--args is not valid JSON: {exc}")
        if not isinstance(arguments, dict):
            fail("--args must be a JSON object, e.g. '{\"path\": \"notes.txt\"}'")
        body = {**body, "decision": "edit", "arguments": arguments}
    _resolved(ctx.obj.post(f"/v1/interrupts/{_interrupt_id(ctx.obj, ref)}/resolve", body))


@runs_app.command("reject")
def reject(ctx: typer.Context, ref: str = typer.Argument(..., metavar="INTERRUPT_OR_RUN"),
           comment: Optional[str] = typer.Option(None, "--comment", help="why; the model reads it")) -> None:
    """Refuse the tool call: it never runs, and the model is told so."""
    _resolved(ctx.obj.post(f"/v1/interrupts/{_interrupt_id(ctx.obj, ref)}/resolve",
                           {"decision": "reject", "comment": comment}))


def _act(ctx: typer.Context, run_id: str, action: str) -> None:
    run = ctx.obj.post(f"/v1/runs/{run_id}/{action}")
    flags = " (stopping at once)" if run["cancel_requested"] or run["pause_requested"] else ""
    out.print(f"{run['id']} {run['status']}{flags}")


@runs_app.command("cancel")
def cancel(ctx: typer.Context, run_id: str) -> None:
    """End the run now (cancelled)."""
    _act(ctx, run_id, "cancel")


@runs_app.command("pause")
def pause(ctx: typer.Context, run_id: str) -> None:
    """Stop the run now, cutting the step in flight; `resume` continues it."""
    _act(ctx, run_id, "pause")


@runs_app.command("resume")
def resume(ctx: typer.Context, run_id: str) -> None:
    """Continue a paused run."""
    _act(ctx, run_id, "resume")


@runs_app.command("budget")
def budget(ctx: typer.Context, run_id: str,
           tokens: Optional[int] = typer.Option(None, "--tokens", min=1, help="token budget (prompt + completion)"),
           usd: Optional[str] = typer.Option(None, "--usd", help="cost budget in USD, e.g. 0.50")) -> None:
    """Set the run's budget; a run paused by its budget continues."""
    if tokens is None and usd is None:
        fail("give --tokens N, --usd X or both")
    body = {k: v for k, v in (("token_budget", tokens), ("cost_budget_usd", usd)) if v is not None}
    run = ctx.obj.post(f"/v1/runs/{run_id}/budget", body)
    out.print(f"{run['id']} {run['status']} · budget {budget_text(run['budget'])}")


# ---- mainspring audit ... --------------------------------------------------------------------------------
audit_app = typer.Typer(help="A run's hash-chained audit trail: verify, export (reads the database directly).",
                        no_args_is_help=True)


def _audit_session():
    """A read session on Settings' database (migrated first, as every command that opens it does)."""
    from mainspring.store.db import cli_session

    return cli_session(fail, readonly=True)


def _known_run(s: Any, run_id: str) -> None:
    from mainspring.agents.journal import JournalError, get_run

    try:
        get_run(s, run_id)
    except JournalError as exc:
        fail(str(exc))


@audit_app.command("verify")
def verify(run_id: str) -> None:
    """Check the run's audit chain: exit 0 when intact, 1 naming the first entry that was edited or removed."""
    from sqlalchemy import select

    from mainspring.agents import audit
    from mainspring.agents.tables import AuditRow

    with _audit_session() as s:
        _known_run(s, run_id)
        v = audit.verify(s, run_id)
        if v.ok:
            out.print(f"[green]ok[/green]: {run_id} audit trail intact, {v.entries} entries, head {v.head}")
            return
        row = s.scalars(select(AuditRow).where(AuditRow.run_id == run_id, AuditRow.seq == v.broken_at)).first()
        kind = f" ({row.kind})" if row is not None else ""
        err.print(f"[red bold]TAMPERED[/red bold]: {run_id} audit entry {v.broken_at}{escape(kind)}: {v.reason}; "
                  f"{v.entries} entries")
    raise typer.Exit(1)


@audit_app.command("export")
def export(run_id: str,
           output: Optional[Path] = typer.Option(None, "--output", "-o", help="write here instead of stdout")) -> None:
    """The run's audit trail as JSONL: one entry per line with its prev_hash and hash."""
    from mainspring.agents import audit

    with _audit_session() as s:
        _known_run(s, run_id)
        lines = list(audit.export_jsonl(s, run_id))
    text = "".join(line + "\n" for line in lines)
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text)
    except OSError as exc:
        fail(f"cannot write {output}: {exc}")
    err.print(f"{len(lines)} entries → {output}")
