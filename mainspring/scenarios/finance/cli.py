"""`mainspring finance …`: the financial research scenario's commands. `generate` writes the synthetic filings
corpus (corpus/) for a seed, by default into ./finance-corpus-seed<N>, and prints what it wrote; `ask` and
`eval` run the research pipeline through the server (research_cli.py).

The default folder is the current one's, not the data directory's: runs may attach folders under
MAINSPRING_AGENT_ATTACH_ROOTS and never the data directory, so the corpus lives where the operator allows.

Exit codes: 0 written (ask: verified), 1 ask: unverified, 2 bad input (a message, never a traceback)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from mainspring.console import fail
from mainspring.scenarios.finance.research_cli import ask_cmd, eval_cmd

out = Console(highlight=False, soft_wrap=True)

finance_app = typer.Typer(no_args_is_help=True, help="financial research: generate the corpus, ask, eval")


@finance_app.callback()
def finance() -> None:
    """Financial research: the synthetic filings corpus and its questions."""  # keeps `generate` a subcommand


@finance_app.command("generate")
def generate_cmd(out_dir: Optional[Path] = typer.Option(None, "--out", help="folder to write the corpus into "
                                                         "(default ./finance-corpus-seed<N>)"),
                 seed: int = typer.Option(0, "--seed", help="the seed; the same seed writes the same bytes")) -> None:
    """Write the synthetic filings corpus: filings, facts.json per company, manifest.json, questions.jsonl."""
    from mainspring.scenarios.finance.corpus import generate_corpus, load_questions

    if seed < 0:
        fail(f"--seed must be a non-negative integer, got {seed}")
    target = out_dir or Path(f"finance-corpus-seed{seed}")
    if target.exists() and not target.is_dir():
        fail(f"--out {target} exists and is not a folder")
    try:
        manifest = generate_corpus(target, seed)
    except OSError as e:
        fail(f"cannot write the corpus into {target}: {e}")
    questions = load_questions(target)
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    table = Table(title=f"corpus seed {seed}: {target}")
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("companies", ", ".join(c.ticker for c in manifest.companies))
    for form, n in sorted(Counter(f.form for f in manifest.filings).items()):
        table.add_row(f"filings {form}", str(n))
    for fmt, n in sorted(Counter(f.format for f in manifest.filings).items()):
        table.add_row(f"format {fmt}", str(n))
    for qtype, n in sorted(Counter(q.question_type for q in questions).items()):
        table.add_row(f"questions {qtype}", str(n))
    table.add_row("pages", str(_pages(target, manifest)))
    table.add_row("bytes", f"{size:,}")
    out.print(table)


finance_app.command("ask")(ask_cmd)
finance_app.command("eval")(eval_cmd)


def _pages(target: Path, manifest: object) -> int:
    from pypdf import PdfReader

    from mainspring.scenarios.finance.corpus_format import PAGE_BREAK, Manifest

    assert isinstance(manifest, Manifest)
    total = 0
    for f in manifest.filings:
        path = target / f.path
        if f.format == "pdf":
            total += len(PdfReader(path).pages)
        else:
            total += path.read_text().count(PAGE_BREAK) + 1
    return total
