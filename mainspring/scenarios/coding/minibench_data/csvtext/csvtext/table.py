"""A table: a header and rows of text cells, with column lookup by name (case and surrounding spaces ignored),
selection, filtering and sorting."""

from __future__ import annotations

from csvtext.parse import read_csv


def normalize_name(name: str) -> str:
    return name.strip().lower()


def to_number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


class Table:
    def __init__(self, header: list[str], rows: list[list[str]]) -> None:
        self.header = list(header)
        self.rows = [list(r) for r in rows]
        for r in self.rows:
            if len(r) != len(self.header):
                raise ValueError(f"row {r!r} has {len(r)} cells, the header {len(self.header)}")

    @classmethod
    def from_csv(cls, text: str) -> Table:
        rows = read_csv(text)
        if not rows:
            raise ValueError("no header: the text is empty")
        return cls(rows[0], rows[1:])

    def index(self, name: str) -> int:
        key = normalize_name(name)
        for i, h in enumerate(self.header):
            if normalize_name(h) == key:
                return i
        raise KeyError(f"no column {name!r}; columns: {', '.join(self.header)}")

    def column(self, name: str) -> list[str]:
        i = self.index(name)
        return [r[i] for r in self.rows]

    def select(self, *names: str) -> Table:
        idx = [self.index(n) for n in names]
        return Table([self.header[i] for i in idx], [[r[i] for i in idx] for r in self.rows])

    def where(self, name: str, value: str) -> Table:
        i = self.index(name)
        return Table(self.header, [r for r in self.rows if r[i] == value])

    def sort_by(self, name: str, reverse: bool = False) -> Table:
        """Rows ordered by a column: by value when every cell is a number, else as text."""
        i = self.index(name)
        numbers = [to_number(r[i]) for r in self.rows]
        if all(n is not None for n in numbers):
            rows = sorted(self.rows, key=lambda r: float(r[i]), reverse=reverse)
        else:
            rows = sorted(self.rows, key=lambda r: r[i], reverse=reverse)
        return Table(self.header, rows)
