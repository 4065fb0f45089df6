"""Write a bench's markdown table between its `<!-- bench:NAME -->` markers, in README.md and docs/*.md
(docs/benchmarks.md holds every table; the README repeats the headline one)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def update_readme(name: str, markdown: str) -> None:
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    written = 0
    for doc in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        if start not in text or end not in text:
            continue
        head, _, rest = text.partition(start)
        _, _, tail = rest.partition(end)
        doc.write_text(f"{head}{start}\n{markdown}\n{end}{tail}")
        written += 1
    if not written:
        raise SystemExit(f"neither README.md nor docs/*.md has a {start} ... {end} block")


def write_table(name: str, results: str | Path, markdown: Callable[[dict], str]) -> None:
    """The `--update-readme` of every bench: render its saved results JSON into the documents with its markers."""
    update_readme(name, markdown(json.loads(Path(results).read_text())))
