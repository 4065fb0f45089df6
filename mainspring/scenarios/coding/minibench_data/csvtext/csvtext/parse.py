"""CSV lines to fields: fields are separated by commas and may be quoted with double quotes, so a quoted field
can hold a comma; inside quotes, two double quotes ("") stand for one."""

from __future__ import annotations


def split_line(line: str) -> list[str]:
    """The fields of one CSV line."""
    fields: list[str] = []
    current: list[str] = []
    quoted = False
    for ch in line:
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
    if quoted:
        raise ValueError(f"unterminated quote in {line!r}")
    fields.append("".join(current))
    return fields


def read_csv(text: str) -> list[list[str]]:
    """The rows of a CSV text; blank lines are skipped."""
    return [split_line(line) for line in text.splitlines() if line.strip()]
