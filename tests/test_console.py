"""Every CLI fails the same way: `error: <message>` on stderr, exit code 2, on one line whatever the terminal
width (a script or log reading stderr must not find the message broken), markup-like text kept as written."""

from __future__ import annotations

import os
import subprocess
import sys

MESSAGE = "the file /tmp/" + "very-long-directory-name/" * 12 + "notes[1].jsonl, line 4: not JSON"


def test_fail_prints_one_unwrapped_line_and_exits_2():
    env = {**os.environ, "COLUMNS": "40", "TERM": "xterm"}
    script = ("import typer\nfrom mainspring.console import fail\napp = typer.Typer()\n"
              f"@app.command()\ndef main() -> None:\n    fail({MESSAGE!r})\napp()\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"error: {MESSAGE}\n"


def test_every_cli_uses_it():
    """No CLI module defines a failing helper of its own (they drifted: some wrapped, some ate brackets)."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "mainspring"
    own = [str(p.relative_to(root)) for p in root.rglob("cli.py") if "def _fail(" in p.read_text()]
    assert own == []
