"""`mainspring finance ask` and `mainspring finance eval`: the research pipeline through the running server.

The corpus folder must be attachable by the server: under MAINSPRING_AGENT_ATTACH_ROOTS, outside its data
directory (agents/attachments.py). The four stage agents are put into the key's project first (a new version
only when they changed).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import httpx
import typer
from rich.console import Console
from rich.table import Table

from mainspring.agents.client import Server
from mainspring.console import fail
from mainspring.scenarios.finance.pipeline import (ResearchOutcome, audit_jsonl, put_agents, start_research,
                                                   wait_research)

out, err = Console(), Console(stderr=True)
API_KEY = typer.Option(None, "--api-key", envvar="MAINSPRING_API_KEY", help="the project's API key")
CORPUS = typer.Option(..., "--corpus", "-c", help="the filings folder (mainspring finance generate); the server "
                      "must be allowed to attach it (MAINSPRING_AGENT_ATTACH_ROOTS)")
MODEL = typer.Option("default", "--model", "-m", help="the model every stage runs on (mainspring models)")


@contextmanager
def refusals(server: Server) -> Iterator[None]:
    """Server errors as the CLI's message and exit code 2."""
    try:
        yield
    except httpx.HTTPStatusError as exc:
        server.refused(exc.response)
    except httpx.ConnectError:
        server.unreachable()
    except TimeoutError as exc:
        fail(str(exc))


def corpus_path(corpus: Path) -> str:
    path = corpus.expanduser().resolve()
    if not (path / "manifest.json").is_file():
        fail(f"{corpus} is not a filings corpus (no manifest.json); make one with: mainspring finance generate")
    return str(path)


def show(outcome: ResearchOutcome) -> None:
    out.print(outcome.markdown or "[dim](no report)[/dim]")
    claims = (outcome.verdict or {}).get("claims", [])
    if claims:
        table = Table("claim", "citation", "status", "reason", title="verifier", expand=False)
        for c in claims:
            table.add_row(str(c.get("text", ""))[:60], " ".join(c.get("citations") or ["-"])[:40], str(c.get("status")),
                          str(c.get("reason") or "")[:60])
        out.print(table)
    state = "[green]verified[/green]" if outcome.verified else "[red]unverified[/red]"
    reason = (outcome.verdict or {}).get("reason") or outcome.error or ""
    err.print(f"{outcome.plan_id} · {outcome.status} · {state}" + (f" · {reason}" if reason else ""))


def ask_cmd(
    question: str = typer.Argument(..., help="e.g. 'What was Orbital Dynamics' revenue growth in fiscal 2024?'"),
    corpus: Path = CORPUS,
    model: str = MODEL,
    audit_out: Optional[Path] = typer.Option(None, "--audit-out", help="write the reasoning chain (every stage's "
                                             "audit trail and the plan's chain head) to this JSONL file"),
    as_json: bool = typer.Option(False, "--json", help="print the outcome as JSON"),
    timeout: float = typer.Option(1800.0, "--timeout", min=1, help="seconds to wait for the plan"),
    api_key: Optional[str] = API_KEY,
) -> None:
    """Answer one question with the four-stage pipeline; exit 0 only when the report is verified."""
    folder = corpus_path(corpus)
    server = Server(api_key)
    with refusals(server):
        put_agents(server.http, model)
        plan_id = start_research(server.http, question, folder)
        with err.status(f"{plan_id}: collect → analyse → report → verify …"):
            outcome = wait_research(server.http, plan_id, timeout_s=timeout)
        if audit_out is not None:
            audit_out.write_text(audit_jsonl(server.http, outcome))
    if as_json:
        out.print_json(json.dumps(asdict(outcome), default=str))
    else:
        show(outcome)
    raise typer.Exit(0 if outcome.verified else 1)


def eval_cmd(
    corpus: Path = CORPUS,
    model: str = MODEL,
    limit: int = typer.Option(20, "--limit", "-n", min=1, help="questions (the first N of each type in turn)"),
    types: Optional[str] = typer.Option(None, "--types", help="comma-separated question types"),
    out_file: Optional[Path] = typer.Option(None, "--out", help="one JSON line per question"),
    api_key: Optional[str] = API_KEY,
) -> None:
    """The question set through the pipeline: accuracy by type, citations, cost per correct answer."""
    from mainspring.scenarios.finance.corpus import load_questions
    from mainspring.scenarios.finance.evaluate import as_rows, pick_questions, run_eval, summarize

    folder = corpus_path(corpus)
    try:
        questions = pick_questions(load_questions(Path(folder)), limit, types.split(",") if types else None)
    except ValueError as exc:
        fail(str(exc))
    server = Server(api_key)
    with refusals(server):
        put_agents(server.http, model)
        results = run_eval(server.http, folder, questions, progress=lambda r: err.print(
            f"{r.id} {r.question_type}: {'right' if r.correct else 'wrong'}, "
            f"{'verified' if r.verified else 'unverified'} ({r.claims_ok}/{r.claims} claims)"))
    if out_file is not None:
        out_file.write_text("".join(json.dumps(row) + "\n" for row in as_rows(results)))
    out.print_json(json.dumps(summarize(results)))
