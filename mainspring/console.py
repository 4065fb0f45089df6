"""The command line's one way to stop on bad input: `fail(message)` prints `error: message` on stderr and exits
with code 2 (or `code`), never a traceback. Used by every CLI (mainspring/cli.py and each layer's cli.py), so it
sits beside config.py, below every layer.

The message is printed as text (rich markup in it is escaped, so paths with brackets survive) and never
wrapped: a script or a log reading stderr gets the message on one line whatever the terminal width.
"""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(code)
