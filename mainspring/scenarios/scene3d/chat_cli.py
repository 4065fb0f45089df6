"""`mainspring scene chat`: the design dialogue (dialogue.py) in a terminal, on the embedded model.

    mainspring scene chat --brief cup_on_table [--out scene-chat] [--turn "make the table longer" ...]
    mainspring scene chat --request "A red ball beside a box." --ids ball,box

Each turn prints the check table of every pinned constraint (rich; plain text without a TTY or on
a narrow terminal), what the edit broke and whether it was repaired, and writes the scene and its
preview PNG into --out (turn-N.json, turn-N.png). Turns come from --turn, else one per line of
stdin until EOF or "quit". Exit status 0; 2 for input that cannot be used (no traceback).
Registered on the `scene` command group by mainspring/cli.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mainspring.console import fail
from mainspring.models.base import ChatModel

out = Console(soft_wrap=False, highlight=False)
QUIT = {"quit", "exit", ":q"}


def open_model() -> tuple[ChatModel, Callable[[], None]]:
    """The embedded model as a ChatModel, and how to close it (tests replace this)."""
    from mainspring.compute import compute_thread
    from mainspring.config import Settings
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.loader import load_model
    from mainspring.models.local import LocalModel

    settings = Settings()
    # built on the compute thread that steps it: built here, the main thread would keep a libgomp pool of its own
    # and every step would pay futex wake-ups (mainspring/compute.py; 13.4-13.7 against 17.7-19.8 tok/s here)
    engine = AsyncLLMEngine(compute_thread().call(
        lambda: LLMEngine(load_model(settings.model, settings.cache_dir), EngineConfig(kv_cache_mb=256))))
    return LocalModel(engine), engine.close


def _start(brief: Optional[str], request: Optional[str], ids: Optional[str]) -> tuple[str, list[str], list[Any]]:
    from mainspring.scenarios.scene3d.briefs import load_briefs

    if brief and (request or ids):
        fail("give --brief, or --request with --ids, not both")
    if brief:
        found = {b.id: b for b in load_briefs()}
        if brief not in found:
            fail(f"no brief named {brief!r}; briefs: {', '.join(found)}")
        b = found[brief]
        return b.request(), list(b.objects), list(b.constraints)
    if not request or not ids:
        fail("give --brief NAME, or --request TEXT with --ids a,b,...")
    names = [s.strip() for s in ids.split(",") if s.strip()]
    from pydantic import TypeAdapter, ValidationError

    from mainspring.scenes.constraint_model import Id

    try:
        TypeAdapter(list[Id]).validate_python(names)
    except ValidationError:
        fail(f"--ids must be snake_case ids (a-z, 0-9, _), got {ids!r}")
    if not names or len(set(names)) != len(names) or len(names) > 8:
        fail("--ids needs 1 to 8 distinct ids")
    return f"{request} Use the ids: {', '.join(names)}.", names, []


def check_table(result: Any) -> Table:
    """The pinned constraints after a turn: pass/fail, the measured quantity, the detail."""
    table = Table(title=f"turn {result.turn}: pinned constraints", expand=False, show_lines=False)
    table.add_column("constraint", overflow="fold")
    table.add_column("", no_wrap=True)
    table.add_column("measured", overflow="fold")
    table.add_column("detail", overflow="fold")
    score = result.score
    if score is None or not score.valid:
        for v in (score.violations if score else []):
            table.add_row(escape(v.path), "[red]INVALID[/red]", "", escape(v.message))
        return table
    for r in score.results:
        value = "n/a" if r.value is None else f"{r.quantity} {r.value:.4g} {r.unit}"
        mark = "[green]PASS[/green]" if r.passed else "[red]FAIL[/red]"
        table.add_row(escape(r.label), mark, escape(value), escape(r.detail))
    return table


def _report(result: Any, png: Path | None, scene: Path | None) -> None:
    if result.edit_error:
        out.print(f"[yellow]{escape(result.edit_error)}[/yellow]")
    for kind, labels in (("pinned", result.added), ("changed", result.changed), ("not understood", result.rejected)):
        if labels:
            out.print(f"{kind} constraint(s): {escape(', '.join(labels))}")
    if result.broken:
        state = "[green]repaired[/green]" if result.repaired else "[red]NOT repaired[/red]"
        out.print(f"the edit broke {escape(', '.join(result.broken))}: {state}")
    out.print(check_table(result))
    spent = sum(r.prompt_tokens + r.completion_tokens for r in result.rounds)
    out.print(f"{len(result.rounds)} model call(s), {spent} tokens; stopped: {result.stop_reason or '-'}"
              + (f"; wrote {scene}" if scene else "") + (f", {png}" if png else ""))


def _write_turn(out_dir: Path, doc: Any, n: int, render: bool) -> tuple[Path | None, Path | None]:
    if doc is None:
        return None, None
    scene = out_dir / f"turn-{n}.json"
    scene.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if not render:
        return None, scene
    from mainspring.scenarios.scene3d.tools import render_in_process

    job = render_in_process(doc)
    if job.preview_png is None:
        out.print(f"[yellow]no preview: {escape(str(job.report.get('error') or job.report.get('violations')))}"
                  "[/yellow]")
        return None, scene
    png = out_dir / f"turn-{n}.png"
    png.write_bytes(job.preview_png)
    return png, scene


def _turns(given: list[str]):
    if given:
        yield from given
        return
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            out.print("[bold]> [/bold]", end="")
        line = sys.stdin.readline()
        if not line or line.strip().lower() in QUIT:
            return
        if line.strip():
            yield line.strip()


def chat_cmd(brief: Optional[str] = typer.Option(None, "--brief", help="start from a brief (its constraints pinned)"),
             request: Optional[str] = typer.Option(None, "--request", help="what to build (with --ids)"),
             ids: Optional[str] = typer.Option(None, "--ids", help="the scene's object ids, comma-separated"),
             turn: list[str] = typer.Option([], "--turn", help="a user turn (repeatable; else read from stdin)"),
             out_dir: Path = typer.Option(Path("scene-chat"), "--out", help="folder for turn-N.json / turn-N.png"),
             max_rounds: int = typer.Option(3, "--max-rounds", min=0, max=10, help="repair rounds per turn"),
             render: bool = typer.Option(True, "--render/--no-render", help="write the preview PNG each turn"),
             as_json: bool = typer.Option(False, "--json", help="print the thread as JSON at the end")) -> None:
    """A design dialogue: each turn is an edit; every constraint agreed so far is re-checked and kept."""
    from mainspring.scenarios.scene3d.dialogue import start_thread, user_turn
    from mainspring.scenarios.scene3d.refine import RefineConfig

    text, names, constraints = _start(brief, request, ids)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"cannot write {out_dir}: {exc.strerror or exc}")
    model, close = open_model()
    config = RefineConfig(max_rounds=max_rounds)

    async def session():
        thread = await start_thread(model, text, names, constraints, config)
        out.print(f"[bold]{escape(text)}[/bold]")
        _report(thread.turns[0], *_write_turn(out_dir, thread.doc, 0, render))
        for said in _turns(turn):
            result = await user_turn(model, thread, said)
            out.print(f"[bold]> {escape(said)}[/bold]")
            _report(result, *_write_turn(out_dir, thread.doc, result.turn, render))
        return thread

    try:
        thread = asyncio.run(session())
    finally:
        close()
    if as_json:
        typer.echo(json.dumps(thread.to_dict(), indent=1))
