"""Tables as aligned plain text, cells cut to a maximum width."""

from __future__ import annotations

from csvtext.table import Table

ELLIPSIS = "…"


def truncate(text: str, width: int) -> str:
    """`text` in at most `width` characters: a longer text is cut and ends with an ellipsis."""
    if width < 1:
        raise ValueError("width must be at least 1")
    if len(text) <= width:
        return text
    return text[:width] + ELLIPSIS


def render(table: Table, max_width: int = 20) -> str:
    """The header, a rule, then the rows; columns padded to their widest cell, numbers right-aligned."""
    cells = [[truncate(c, max_width) for c in row] for row in [table.header, *table.rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(table.header))]
    numeric = [all(_is_number(r[i]) for r in table.rows) and bool(table.rows) for i in range(len(table.header))]
    lines = []
    for n, row in enumerate(cells):
        parts = [c.rjust(w) if numeric[i] and n else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True
