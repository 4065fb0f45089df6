"""`mainspring code bench`: the coding minibench (minibench.py) against the running server, and optionally the
HumanEval-style functions with pass@k (humaneval.py).

Like `mainspring code "task"`, each task is an ordinary coding run queued in the server's store and driven by its
worker with the server's models: `--model` names any model the server serves, the embedded one or an upstream
OpenAI-compatible model configured there, so one command measures both. The pass@k samples go to the server's
OpenAI-compatible API and run in this machine's sandbox. Trajectories (JSONL, one attempt a line) and the report
(JSON) are written under the data directory unless `--trajectories` names a file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mainspring.agents.cli import API_KEY
from mainspring.agents.client import Server
from mainspring.console import fail
from mainspring.scenarios.coding.cli import local_runtime
from mainspring.scenarios.coding.recipe import LAYOUTS
from mainspring.scenarios.coding.workcopy import MAX_ITERATIONS

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def bench_cmd(
    model: str = typer.Option("default", "--model", "-m", help="a model the server serves (embedded or upstream)"),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="comma-separated instance ids (default: all 15)"),
    layout: str = typer.Option("map_first", "--layout", help=f"prompt layout: {' or '.join(LAYOUTS)}"),
    samples: int = typer.Option(1, "--samples", min=1, max=20, help="attempts per task (pass@1 over them)"),
    max_iterations: int = typer.Option(3, "--max-iterations", min=1, max=MAX_ITERATIONS),
    max_tokens: int = typer.Option(1024, "--max-tokens", min=16, max=8192, help="tokens per model call"),
    max_steps: int = typer.Option(30, "--max-steps", min=1, max=200, help="model calls per attempt"),
    timeout_s: float = typer.Option(900.0, "--timeout", min=10.0, help="seconds per attempt before it is "
                                    "cancelled and judged on its diff so far"),
    humaneval: int = typer.Option(0, "--humaneval", min=0, max=50, help="also sample N completions of each "
                                  "HumanEval-style function and report pass@1 (and pass@k up to N); 0: skip"),
    trajectories: Optional[Path] = typer.Option(None, "--trajectories", help="the JSONL trajectory file"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    api_key: Optional[str] = API_KEY,
) -> None:
    """Run the coding minibench: resolved rate, pass@1, iterations to green, tokens, cache hit rate, $ per
    resolved task and wall time per task."""
    from mainspring.scenarios.coding.instances import load_instances
    from mainspring.scenarios.coding.minibench import run_minibench

    if layout not in LAYOUTS:
        fail(f"--layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    ids = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
    try:
        instances = load_instances(ids=ids)
    except (KeyError, ValueError) as exc:
        fail(f"--tasks: {exc}")
    server = Server(api_key)
    server.get("/v1/runs", params={"limit": 1})  # no server: exit 2 before anything is queued
    runtime = local_runtime(api_key)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = trajectories or runtime.settings.data_dir / "coding-bench" / f"{_safe(model)}-{layout}-{stamp}.jsonl"
    total = len(instances) * samples
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        job = bar.add_task(f"minibench · {model}", total=total)

        def progress(result) -> None:
            bar.console.print(escape(result.line()))
            bar.advance(job)

        report = run_minibench(runtime, model, tasks=instances, layout=layout, trajectories=path, progress=progress,
                               samples=samples, max_iterations=max_iterations, max_tokens=max_tokens,
                               max_steps=max_steps, timeout_s=timeout_s)
    summary = report.to_dict()
    if humaneval:
        summary["humaneval"] = _passk(server, model, humaneval, api_key).to_dict()
    path.with_suffix(".report.json").write_text(json.dumps(summary, indent=2, default=str))
    if as_json:
        out.print_json(json.dumps(summary, default=str))
    else:
        out.print(escape(report.render()))
        if humaneval:
            he = summary["humaneval"]
            out.print(" · ".join(f"{k} {v:.3f}" for k, v in he.items() if k.startswith("pass@"))
                      + f" on {he['problems']} HumanEval-style functions, n={he['n']}")
    err.print(f"[dim]trajectories: {path}; report: {path.with_suffix('.report.json')}[/dim]")


def _passk(server: Server, model: str, n: int, api_key: str | None):
    from mainspring.models.openai_compatible import OpenAICompatibleModel
    from mainspring.scenarios.coding.humaneval import chat_completer, evaluate_passk

    chat = OpenAICompatibleModel(server.url + "/v1", api_key, model=model, timeout=300)
    ks = tuple(k for k in (1, 5, 10) if k <= n)
    err.print(f"[dim]HumanEval-style functions: {n} samples each from {model}…[/dim]")
    return evaluate_passk(chat_completer(chat), n=n, ks=ks)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]
