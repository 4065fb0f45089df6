"""The `mainspring` command line: serve, worker, up/down, chat, generate, perplexity, keys, usage, sim, sandbox,
run, runs, audit, scene."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from mainspring.config import get_settings
from mainspring.console import fail
from mainspring.engine.errors import EngineError

app = typer.Typer(help="Mainspring: self-hosted inference, agents and RL post-training.", no_args_is_help=True)
err = Console(stderr=True)




@app.callback()
def _check_settings() -> None:
    """Fail early, without a traceback, on a malformed MAINSPRING_* variable."""
    from pydantic import ValidationError

    try:
        get_settings()
    except ValidationError as exc:
        problems = "; ".join(f"MAINSPRING_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        fail(f"bad setting: {problems}")


def _engine():
    from mainspring.engine.engine import LLMEngine

    with err.status("loading model (the first load converts the GGUF file, later ones take ~1 s)"):
        try:
            return LLMEngine.from_settings()
        except EngineError as exc:
            fail(str(exc))


def _params(max_tokens: int, temperature: float, top_p: float, seed: Optional[int], stop: list[str]):
    from mainspring.engine.params import SamplingParams

    try:
        return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop)
    except EngineError as exc:
        fail(str(exc))


def _stream(engine, prompt, params) -> str:
    try:
        rid = engine.add_request(prompt, params)
    except EngineError as exc:
        fail(str(exc))
    text = ""
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid:
                sys.stdout.write(out.delta_text)
                sys.stdout.flush()
                text = out.text
    sys.stdout.write("\n")
    return text


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="the prompt text"),
    chat: bool = typer.Option(False, "--chat", help="wrap the prompt as a user message in the chat template"),
    max_tokens: int = typer.Option(128, "--max-tokens", "-n"),
    temperature: float = typer.Option(0.0, "--temperature", "-t"),
    top_p: float = typer.Option(1.0, "--top-p"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    stop: list[str] = typer.Option([], "--stop", help="stop string (repeatable)"),
) -> None:
    """Complete one prompt and stream the text to stdout."""
    params = _params(max_tokens, temperature, top_p, seed, stop)
    engine = _engine()
    if chat:
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    _stream(engine, prompt, params)


@app.command("chat")
def chat_cmd(
    system: Optional[str] = typer.Option(None, "--system", help="system message"),
    message: Optional[str] = typer.Option(None, "--message", "-m", help="ask one question and exit"),
    max_tokens: int = typer.Option(256, "--max-tokens", "-n"),
    temperature: float = typer.Option(0.0, "--temperature", "-t"),
    top_p: float = typer.Option(1.0, "--top-p"),
    seed: Optional[int] = typer.Option(None, "--seed"),
) -> None:
    """Chat with the model: streams each answer; the conversation is the prefix-cached context."""
    params = _params(max_tokens, temperature, top_p, seed, [])
    engine = _engine()
    messages: list[dict] = [{"role": "system", "content": system}] if system else []
    interactive = message is None and sys.stdin.isatty()
    if interactive:
        err.print(f"[bold]{engine.name}[/bold] — type a message, Ctrl-D to quit")
    questions = [message] if message is not None else _read_questions(interactive)
    for question in questions:
        if not question.strip():
            continue
        messages.append({"role": "user", "content": question})
        prompt = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        answer = _stream(engine, prompt, params)
        messages.append({"role": "assistant", "content": answer})


def _read_questions(interactive: bool):
    while True:
        try:
            line = input("you> ") if interactive else sys.stdin.readline()
        except (EOFError, KeyboardInterrupt):
            return
        if not interactive and not line:
            return
        yield line.rstrip("\n")


def _refuse_bad_database(settings) -> None:
    """Exit 2 with one message, before any model loads, when the database cannot be served: a corrupt file
    (`PRAGMA quick_check`) or one that cannot be opened."""
    from sqlalchemy.exc import SQLAlchemyError

    from mainspring.store.db import DatabaseCorrupt, check_database, get_engine

    try:
        check_database(get_engine(settings.resolved_database_url()))
    except DatabaseCorrupt as exc:
        fail(str(exc))
    except SQLAlchemyError as exc:
        fail(f"cannot open the database {settings.resolved_database_url()}: {getattr(exc, 'orig', exc)}")


@app.command()
def serve(
    host: Optional[str] = typer.Option(None, help="bind address (default MAINSPRING_HOST, 127.0.0.1)"),
    port: Optional[int] = typer.Option(None, help="port (default MAINSPRING_PORT, 8321)"),
    model: Optional[str] = typer.Option(None, "--model", help="'smollm2', a .gguf file or a Hugging Face folder "
                                        "(e.g. a fine-tuning job's export); default MAINSPRING_MODEL"),
) -> None:
    """Run the HTTP server in the foreground."""
    import uvicorn

    from mainspring.api.app import create_app
    from mainspring.scenarios.scene3d.thread_state import SceneThreads

    s = get_settings()
    if model:
        s = s.model_copy(update={"model": model})
    _refuse_bad_database(s)
    try:
        # the design dialogue behind /v1/scenes/threads: api may not import scenarios, so it is handed in here
        uvicorn.run(create_app(s, scene_dialogue=SceneThreads()), host=host or s.host, port=port or s.port,
                    log_level="info")
    except EngineError as exc:
        fail(str(exc))


@app.command()
def worker(
    model: Optional[str] = typer.Option(None, "--model", help="the model the local engine serves to agent runs; "
                                        "default MAINSPRING_MODEL"),
) -> None:
    """Drive agent runs and plans without serving HTTP, beside servers on the same database (stop: Ctrl-C)."""
    import asyncio
    import logging

    from mainspring.api.worker_process import run_worker

    s = get_settings()
    if model:
        s = s.model_copy(update={"model": model})
    _refuse_bad_database(s)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        asyncio.run(run_worker(s))
    except EngineError as exc:
        fail(str(exc))


def _pid_file() -> Path:
    return get_settings().data_dir / "server.pid"


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@app.command()
def up(timeout: float = typer.Option(300, help="seconds to wait for the server to become healthy")) -> None:
    """Start the server in the background (if not running) and print its URL."""
    s = get_settings()
    url = f"http://{s.host}:{s.port}"
    if _healthy(url):
        typer.echo(f"Mainspring is running at {url}")
        return
    _refuse_bad_database(s)
    s.data_dir.mkdir(parents=True, exist_ok=True)
    log_path = s.data_dir / "server.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mainspring", "serve"], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    _pid_file().write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    with err.status(f"starting the server (log: {log_path})"):
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                fail(f"the server exited with code {proc.returncode}; see {log_path}")
            if _healthy(url):
                typer.echo(f"Mainspring is running at {url}  (stop it with `mainspring down`)")
                return
            time.sleep(0.5)
    fail(f"the server did not become healthy within {timeout:.0f} s; see {log_path}")


@app.command()
def down() -> None:
    """Stop the background server started by `up`."""
    path = _pid_file()
    if not path.exists():
        typer.echo("no server started by `mainspring up` is running")
        return
    pid = int(path.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
        typer.echo(f"stopped server (pid {pid})")
    except ProcessLookupError:
        typer.echo("the server had already stopped")
    path.unlink(missing_ok=True)


def _register_subcommands() -> None:
    from mainspring.billing.cli import keys_app, sim, usage
    from mainspring.store.projects_cli import projects_app
    from mainspring.sandbox.cli import sandbox_app
    from mainspring.agents.cli import audit_app, run_cmd, runs_app
    from mainspring.agents.plans.cli import plan_cmd, plans_app
    from mainspring.agents.plans.schedule_cli import schedules_app
    from mainspring.agents.plans.deadlocks_cli import deadlocks_app
    from mainspring.scenes.cli import app as scene_app
    from mainspring.engine.cli import perplexity_cmd
    from mainspring.train.cli import train_cmd
    from mainspring.train.inspect.cli import inspect_cmd, inspect_outputs_cmd
    from mainspring.scenarios.coding.review_cli import review_cmd
    from mainspring.scenarios.coding.cli import code_app
    from mainspring.scenarios.finance.cli import finance_app

    app.add_typer(keys_app, name="keys", help="API keys: create, list, revoke")
    app.add_typer(projects_app, name="projects", help="projects' data policy: show, set (training, local-only, "
                                                      "retention), sweep")
    app.command("usage", help="usage and cost by key, project, model, tier or day")(usage)
    app.command("sim", help="replay a trace under prompt-cache policies: cost by scenario, advice")(sim)
    app.add_typer(sandbox_app, name="sandbox", help="run untrusted code isolated: run, check, profiles")
    app.command("run", help="run an agent on a goal, showing its steps live")(run_cmd)
    app.add_typer(runs_app, name="runs", help="agent runs: list, show, events, approve, reject, cancel, pause, "
                                              "resume, budget")
    app.add_typer(audit_app, name="audit", help="verify or export a run's audit trail")
    app.command("plan", help="start a plan: a DAG of agent tasks from a YAML or JSON file, or from a goal "
                             "(the planner agent writes the tasks)")(plan_cmd)
    app.add_typer(plans_app, name="plans", help="plans: list, show, events, approve, reject, cancel, pause, "
                                                "resume, approve-task, reject-task")
    app.add_typer(schedules_app, name="schedules", help="cron schedules and webhooks that start plans or agent "
                                                        "runs: list, create, delete, pause, resume")
    app.add_typer(deadlocks_app, name="deadlocks", help="deadlocks and livelocks between plan tasks: list, show, "
                                                        "resolve; and who waits for whom (waits)")
    app.add_typer(code_app, name="code", help='the coding agent: mainspring code "task" [--repo PATH] edits and '
                                              "tests in the sandbox until green, then prints the diff; bench; diff")
    app.add_typer(finance_app, name="finance", help="financial research: generate the filings corpus, ask a "
                  "question (every number cited and verified), eval")
    app.command("review", help="review comments on a diff (a file, - for stdin, or --staged): file:line: comment, "
                               "or JSON")(review_cmd)
    from mainspring.scenarios.scene3d.chat_cli import chat_cmd as scene_chat_cmd

    # the design dialogue lives with its scenario (it drives a model); it is offered beside the scene tools
    scene_app.command("chat", help="Design a scene over several turns; every agreed constraint is re-checked "
                                   "and kept")(scene_chat_cmd)
    app.add_typer(scene_app, name="scene", help="3D scenes: validate, check, render, export, chat")
    app.command("perplexity", help="perplexity of a text file under a KV policy "
                                   "(window, sinks, cold tier)")(perplexity_cmd)
    app.command("train", help="RL post-training (GRPO) across domains: evaluate, gate, export, report")(train_cmd)
    app.command("inspect", help="inspect training domains: verifier, reward hacking, duplicates, leaks, "
                                "difficulty; exit 1 on an error finding")(inspect_cmd)
    app.command("inspect-outputs", help="check served outputs (a batch output file or agent runs): schema "
                                        "validity, refusals, truncation")(inspect_outputs_cmd)


_register_subcommands()

if __name__ == "__main__":
    app()
