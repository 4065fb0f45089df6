"""`mainspring review [DIFF|--staged]`: review comments on a diff, for a terminal, a git hook or an editor task.
Wired in by mainspring/cli.py:

    app.command("review")(review_cmd)

The diff is a file, `-` for stdin (also when stdin is a pipe and no DIFF is given), or `git diff --staged` in
the current repository. The model is reached through an OpenAI-compatible API: the running Mainspring server
(`make up`, at http://MAINSPRING_HOST:MAINSPRING_PORT/v1) or any upstream given by --base-url; without --model,
the first model that endpoint's /v1/models lists. Comments print as a JSON array of {file, line, comment} or as
`file:line: comment` lines. An empty diff, no git repository, an unreachable server or an error it answers
print a message and exit with code 2, never a traceback.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Optional

import httpx
import typer

from mainspring.agents.client import Server
from mainspring.console import fail
from mainspring.models.base import UpstreamError
from mainspring.models.openai_compatible import OpenAICompatibleModel
from mainspring.scenarios.coding.review import MAX_COMMENTS, DiffError, FileDiff, as_json, as_text, parse_diff, review

FORMATS = ("json", "text")


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        fail("--staged needs git, which is not installed")
    except subprocess.TimeoutExpired:
        fail(f"git {' '.join(args)} did not finish within 60 s")


def staged_diff(cwd: Path) -> str:
    """`git diff --staged` of the repository at `cwd`; exit 2 if git is missing or `cwd` is not in a repository
    (asked first: outside one, `git diff` compares paths instead and fails on --staged)."""
    inside = _git(["rev-parse", "--is-inside-work-tree"], cwd)
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        fail(f"--staged: {cwd} is not in a git repository")
    r = _git(["diff", "--staged", "--no-color", "--no-ext-diff"], cwd)
    if r.returncode != 0:
        fail(f"git diff --staged failed: {r.stderr.strip()}")
    return r.stdout


def read_diff(diff: str | None, staged: bool) -> str:
    if staged and diff is not None:
        fail("give a DIFF or --staged, not both")
    if staged:
        return staged_diff(Path.cwd())
    if diff is None and sys.stdin.isatty():
        fail("give a diff file, - for stdin, or --staged for the staged changes of this repository")
    if diff is None or diff == "-":
        return sys.stdin.read()
    path = Path(diff)
    if not path.is_file():
        fail(f"{diff}: no such file")
    return path.read_text(encoding="utf-8", errors="replace")


def diff_files(text: str) -> list[FileDiff]:
    if not text.strip():
        fail("the diff is empty: nothing to review")
    try:
        files = parse_diff(text)
    except DiffError as e:
        fail(str(e))
    if not any(f.reviewable for f in files):
        fail("the diff has no added or changed lines to review (only deletions or binary files)")
    return files


def first_model(base_url: str, api_key: str | None) -> str:
    """The first model the endpoint lists (GET /models)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(base_url.rstrip("/") + "/models", headers=headers, timeout=30)
    except httpx.HTTPError as e:
        fail(f"no server at {base_url} ({type(e).__name__}) — start it with `make up`, or pass --base-url")
    if r.status_code >= 400:
        fail(f"{base_url}/models answered HTTP {r.status_code}: {r.text[:300]}"
             + (" (set MAINSPRING_API_KEY or pass --api-key)" if r.status_code == 401 else ""))
    try:
        return str(r.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        fail(f"{base_url}/models lists no model; pass --model")


def review_cmd(
    diff: Optional[str] = typer.Argument(None, help="a unified diff file, or - for stdin"),
    staged: bool = typer.Option(False, "--staged", help="review `git diff --staged` of the current repository"),
    output: str = typer.Option("text", "--format", "-f", help="json (an array of {file, line, comment}) or text"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="model name (default: the first /v1/models "
                                        "lists)"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="an OpenAI-compatible API, e.g. "
                                           "https://api.openai.com/v1 (default: the Mainspring server)"),
    max_comments: int = typer.Option(MAX_COMMENTS, "--max-comments", min=1, max=50, help="at most this many"),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="MAINSPRING_API_KEY", show_envvar=True,
                                          help="API key, when the server requires one"),
) -> None:
    """Review a diff: comments on its changed lines as file:line: comment (or JSON)."""
    if output not in FORMATS:
        fail(f"--format {output!r} is not one of {', '.join(FORMATS)}")
    files = diff_files(read_diff(diff, staged))
    url = base_url or Server(api_key).url + "/v1"
    name = model or first_model(url, api_key)
    chat = OpenAICompatibleModel(url, api_key, name, timeout=600, max_retries=1)

    async def ask() -> list:
        try:
            return await review(chat, files, max_comments)
        finally:
            await chat.aclose()

    try:
        comments = asyncio.run(ask())
    except UpstreamError as e:
        if e.status is None:
            fail(f"no server at {url} ({e.message}) — start it with `make up`, or pass --base-url")
        fail(f"{url} answered HTTP {e.status}: {e.message}")
    except ValueError as e:
        fail(str(e))
    text = as_json(comments) if output == "json" else as_text(comments)
    if text:
        typer.echo(text)
