"""`mainspring code "task" [--repo PATH]`: the coding agent on a repository, live, ending with the diff.

The run is an ordinary durable agent run of the server (`make up`): this command maps the repository, copies it
into the run's workspace in the server's data directory and queues the run in the server's database (the same
Settings, so the same machine or the same Postgres); the server's worker drives it with the server's models and
sandbox, and this command follows its events over HTTP. So a run outlives the command: Ctrl-C stops following,
`mainspring runs events RUN` follows again, approvals and budgets work as for any run, and `mainspring code
diff RUN` prints the diff of any coding run. The user's repository is written only with `--apply`.

Exit codes: 0 the tests ended green, 1 they did not, 2 bad input or no server (a message, never a traceback).
`mainspring code bench` runs the minibench (bench_cli.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax
from typer.core import TyperGroup

from mainspring.agents.cli import API_KEY
from mainspring.agents.client import Server
from mainspring.agents.render import describe, summary
from mainspring.console import fail
from mainspring.scenarios.coding.recipe import CodingOutcome, CodingTask, coding_outcome, start_coding_run
from mainspring.scenarios.coding.workcopy import MAX_ITERATIONS

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class TaskOrCommand(TyperGroup):
    """`mainspring code "task"` runs the task; `mainspring code bench|diff …` are commands of their own."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


code_app = typer.Typer(cls=TaskOrCommand, no_args_is_help=True,
                       help='the coding agent: mainspring code "task" [--repo PATH]; bench; diff RUN')


def local_runtime(api_key: str | None):
    """The runtime over the server's own database and data directory, as the caller's project sees it. It
    only writes the run: its worker is never started (the server's drives the run)."""
    from mainspring.agents.runtime import AgentRuntime
    from mainspring.config import Settings

    def any_model(name: str, project: int | None = None) -> Any:
        return None  # the server resolves the agent's model when its worker drives the run (an unknown one fails it)

    runtime = AgentRuntime(Settings(), models=any_model)  # the built-in tools and packs: what agents may list
    if api_key is None:
        return runtime
    from mainspring.billing.keys import verify_key
    from mainspring.store.db import session

    with session(runtime.db, readonly=True) as s:
        key = verify_key(s, api_key)
        if key is None:
            fail("the API key is not valid (MAINSPRING_API_KEY or --api-key)")
        return runtime.scoped(key.project_id, key.id)


@code_app.command("run", help="run the coding agent on a task (the default: mainspring code \"task\")")
def run_cmd(
    task: str = typer.Argument(..., help="what to change, e.g. 'fix the rounding of totals in money.py'"),
    repo: Path = typer.Option(Path("."), "--repo", "-r", help="the repository folder (never written unless "
                              "--apply)"),
    model: str = typer.Option("default", "--model", "-m", help="a model the server serves (mainspring models)"),
    max_iterations: int = typer.Option(3, "--max-iterations", min=1, max=MAX_ITERATIONS,
                                       help="test runs after edits before the run stops"),
    tests: Optional[str] = typer.Option(None, "--tests", help="comma-separated pytest ids run_tests runs by "
                                        "default (all tests when not given)"),
    allow_test_edits: bool = typer.Option(False, "--allow-test-edits", help="let the agent change test files"),
    map_tokens: int = typer.Option(1024, "--map-tokens", min=0, max=16384, help="the repository map's budget"),
    budget_tokens: Optional[int] = typer.Option(None, "--budget-tokens", min=1, help="pause the run past this"),
    budget_usd: Optional[str] = typer.Option(None, "--budget-usd", help="pause past this list-price cost"),
    apply: bool = typer.Option(False, "--apply", help="apply the final diff to --repo when the tests are green"),
    as_json: bool = typer.Option(False, "--json", help="print the outcome as JSON instead of the live view"),
    api_key: Optional[str] = API_KEY,
) -> None:
    spec = CodingTask(task, repo.expanduser().resolve(), model=model, max_iterations=max_iterations,
                      allow_test_edits=allow_test_edits, map_tokens=map_tokens, token_budget=budget_tokens,
                      cost_budget_usd=budget_usd,
                      test_ids=[t.strip() for t in (tests or "").split(",") if t.strip()])
    try:
        spec.check()
    except ValueError as exc:
        fail(str(exc))
    server = Server(api_key)
    server.get("/v1/runs", params={"limit": 1})  # no server (or a refused key): exit 2 before anything is written
    runtime = local_runtime(api_key)
    try:
        run = start_coding_run(runtime, spec)
    except ValueError as exc:  # an unknown model, a budget that does not parse, …
        fail(str(exc))
    m, f = run.repo_map, run.focus
    err.print(f"[dim]{run.run_id} · model {model} · map: {len(m.files)} files, {m.definitions} of "
              f"{m.total_definitions} definitions, {m.tokens} tokens; focus: {', '.join(f.files[:3]) or '-'}, "
              f"{f.tokens} tokens[/dim]")
    if not as_json:
        follow(server, run.run_id)
    else:
        for _ in server.events(run.run_id):
            pass
    outcome = coding_outcome(runtime, run.run_id)
    show_outcome(outcome, server.get(f"/v1/runs/{run.run_id}"), as_json)
    if apply and outcome.green and outcome.diff:
        apply_diff(spec.repo, outcome.diff)
    raise typer.Exit(0 if outcome.green else 1)


def follow(server: Server, run_id: str) -> None:
    try:
        for ev in server.events(run_id):
            if ev.get("type") == "run.finished":
                continue  # the outcome below says it, with the diff
            line = describe(ev)
            if line:
                out.print(line)
    except KeyboardInterrupt:
        err.print(f"stopped following; the run goes on — follow it: mainspring runs events {run_id}; "
                  f"its diff: mainspring code diff {run_id}")
        raise typer.Exit(130)


def show_outcome(outcome: CodingOutcome, run: dict, as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps({**outcome.to_dict(), "summary": summary(run)}))
        return
    if outcome.diff:
        out.print(Syntax(outcome.diff, "diff", theme="ansi_dark", word_wrap=False))
    else:
        out.print("[dim](no changes)[/dim]")
    verdict = ("[green bold]✓ tests green[/green bold]" if outcome.green
               else f"[red bold]✗ not green[/red bold] ({escape(str(outcome.stop_reason or outcome.status))})")
    out.print(f"{verdict} after {outcome.iterations} test run{'' if outcome.iterations == 1 else 's'} "
              "with edits")
    if outcome.error:
        out.print(f"[red]{escape(outcome.error)}[/red]")
    out.print(f"[dim]{escape(summary(run))}[/dim]")


def apply_diff(repo: Path, diff: str) -> None:
    """`git apply` the diff in the user's repository (a git checkout or not); checked first, so a diff that no
    longer applies (the files changed meanwhile) writes nothing."""
    for args in (["git", "apply", "--check"], ["git", "apply"]):
        done = subprocess.run(args, cwd=repo, input=diff, text=True, capture_output=True)
        if done.returncode != 0:
            fail(f"the diff does not apply to {repo}: {done.stderr.strip()}")
    err.print(f"applied to {repo}")


@code_app.command("diff", help="the current diff of a coding run (a run still going, paused or ended)")
def diff_cmd(run_id: str, as_json: bool = typer.Option(False, "--json"), api_key: Optional[str] = API_KEY) -> None:
    runtime = local_runtime(api_key)
    try:
        outcome = coding_outcome(runtime, run_id)
    except ValueError as exc:  # JournalError: no such run (in the caller's project)
        fail(str(exc))
    if as_json:
        out.print_json(json.dumps(outcome.to_dict()))
    else:
        typer.echo(outcome.diff, nl=False)


def _register_bench() -> None:
    from mainspring.scenarios.coding.bench_cli import bench_cmd  # it imports this module

    code_app.command("bench", help="the coding minibench against the server: resolved rate, pass@1, tokens, "
                                   "cache hit rate, $ per resolved task")(bench_cmd)


_register_bench()
