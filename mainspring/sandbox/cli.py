"""`mainspring sandbox run|check|profiles`, wired in by mainspring/cli.py.

    mainspring sandbox run -- python3 -c 'print(1)'
    mainspring sandbox run --file script.py --out results/ -- python3 script.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from mainspring.console import fail
from mainspring.sandbox.errors import SandboxError, SandboxUnavailable

sandbox_app = typer.Typer(help="Run untrusted code isolated: bubblewrap, cgroups, seccomp, Landlock.",
                          no_args_is_help=True)
out = Console(soft_wrap=True)  # notes and paths stay on one line whatever the terminal width
err = Console(stderr=True, soft_wrap=True)




def _sandbox():
    from mainspring.sandbox.sandbox import Sandbox

    try:
        return Sandbox()
    except SandboxError as exc:
        fail(str(exc))


@sandbox_app.command("run", context_settings={"allow_interspersed_args": False})
def run(
    command: list[str] = typer.Argument(..., help="the command and its arguments (put them after --)"),
    profile: str = typer.Option("python", "--profile", "-p", help="python, pytest, shell, render or your own"),
    files: list[Path] = typer.Option([], "--file", "-f", help="copy this file (or directory) into the workspace"),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="write the job's new or changed files here"),
    as_json: bool = typer.Option(False, "--json", help="print the whole result as JSON"),
    stdin: bool = typer.Option(False, "--stdin", help="pass this command's stdin to the job"),
) -> None:
    """Run COMMAND in a fresh sandbox; its exit code becomes ours (128+N when a signal killed it)."""
    inputs = _read_inputs(files)
    sandbox = _sandbox()
    try:
        result = sandbox.run(command, inputs, profile, stdin=sys.stdin.buffer.read() if stdin else None)
    except SandboxUnavailable as exc:
        fail(str(exc))
    except SandboxError as exc:
        fail(str(exc))
    if out_dir is not None:
        _write_outputs(out_dir, result.files)
    if as_json:
        payload = {k: v for k, v in vars(result).items() if k != "files"}
        payload["files"] = {name: len(data) for name, data in result.files.items()}
        print(json.dumps(payload, indent=2))
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        if result.killed_by:
            err.print(f"[yellow]sandbox:[/yellow] killed by the {result.killed_by} limit "
                      f"(wall {result.wall_s:.2f}s, cpu {result.cpu_s:.2f}s, peak {result.peak_memory >> 20} MiB)")
        if result.insecure:
            err.print("[red]sandbox: ran WITHOUT isolation (MAINSPRING_SANDBOX_INSECURE_LOCAL)[/red]")
    raise typer.Exit(result.exit_code if result.exit_code >= 0 else 128 - result.exit_code)


def _read_inputs(paths: list[Path]) -> dict[str, bytes]:
    inputs: dict[str, bytes] = {}
    for path in paths:
        if path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                inputs[str(Path(path.name) / file.relative_to(path))] = file.read_bytes()
        elif path.is_file():
            inputs[path.name] = path.read_bytes()
        else:
            fail(f"no such file: {path}")
    return inputs


def _write_outputs(directory: Path, files: dict[str, bytes]) -> None:
    root = directory.resolve()
    for name, data in files.items():
        target = (root / name).resolve()
        if not target.is_relative_to(root):  # names come from the job: never let one point outside --out
            err.print(f"[yellow]sandbox:[/yellow] skipped output {name!r} (outside {directory})")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


@sandbox_app.command("check")
def check() -> None:
    """Say which isolation layers this host offers, then start one sandbox to prove it."""
    from mainspring.sandbox.host import Host
    from mainspring.config import get_settings

    host = Host.detect(get_settings().sandbox_bwrap)
    table = Table("layer", "status", show_header=True)
    table.add_row("bubblewrap",
                  f"{host.bwrap} {'.'.join(map(str, host.bwrap_version))}" if host.bwrap else "[red]missing")
    table.add_row("per-slot uid", "yes (root launcher)" if host.is_root else "no (not root)")
    table.add_row("cgroups", host.cgroups.describe())
    table.add_row("seccomp", host.seccomp_error or "deny-list ready")
    table.add_row("Landlock", f"ABI {host.landlock_abi}" if host.landlock_abi else "not available")
    out.print(table)
    for note in host.weaker_layers():
        out.print(f"[yellow]note:[/yellow] {note}")
    sandbox = _sandbox()
    try:
        sandbox.prepare()
    except SandboxUnavailable as exc:
        fail(str(exc))
    if sandbox.runtime.problem:
        out.print(f"[yellow]note:[/yellow] project runtime unavailable in sandboxes: {sandbox.runtime.problem}")
    out.print("[green]ok:[/green] a sandbox started and ran /bin/true")


@sandbox_app.command("profiles")
def profiles() -> None:
    """List the sandbox profiles and their limits."""
    sandbox = _sandbox()
    table = Table("profile", "cpu s", "wall s", "memory MiB", "cpus", "pids", "file MiB", "workspace MiB", "runtime",
                  "egl")
    # a narrow terminal folds the numbers' columns, never the profile names (what a reader looks for)
    for col in table.columns[1:]:
        col.overflow = "fold"
    table.columns[0].min_width = max((len(n) for n in sandbox.profiles), default=7)
    for p in sandbox.profiles.values():
        table.add_row(p.name, str(p.cpu_s), f"{p.wall_s:g}", str(p.memory_mb), f"{p.cpus:g}", str(p.pids),
                      str(p.file_size_mb), str(p.workspace_mb), "yes" if p.runtime else "no", "yes" if p.egl else "no")
    out.print(table)
