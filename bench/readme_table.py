"""Write a bench's markdown table into README.md between its `<!-- bench:NAME -->` markers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def update_readme(name: str, markdown: str) -> None:
    text = README.read_text()
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    if start not in text or end not in text:
        raise SystemExit(f"README.md has no {start} ... {end} block")
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    README.write_text(f"{head}{start}\n{markdown}\n{end}{tail}")


def write_table(name: str, results: str | Path, markdown: Callable[[dict], str]) -> None:
    """The `--update-readme` of every bench: render its saved results JSON into README.md."""
    update_readme(name, markdown(json.loads(Path(results).read_text())))
