"""A filing as pages of blocks (headings, paragraphs, tables), before rendering. Table cells that print a
reported fact carry it, so facts.json and the evidence pages are collected from what is actually printed."""

from __future__ import annotations

from dataclasses import dataclass, field

from mainspring.scenarios.finance.corpus.fiscal_calendar import Period


@dataclass(frozen=True)
class PrintedFact:
    concept: str  # "us-gaap:Revenues"
    unit: str  # "USD", "shares", "USD/shares"
    period: Period
    val: int | float  # whole units


@dataclass
class Cell:
    text: str
    fact: PrintedFact | None = None


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[tuple[str, list[Cell]]]


@dataclass
class Block:
    kind: str  # "h1", "h2", "p", "table"
    text: str = ""
    table: Table | None = None


@dataclass
class Page:
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Document:
    title: str
    pages: list[Page] = field(default_factory=list)
    passages: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)  # (concept, label) -> page, text

    def new_page(self) -> Page:
        self.pages.append(Page())
        return self.pages[-1]

    def printed(self) -> list[tuple[PrintedFact, int]]:
        """Every fact the document prints, with its first page (1-based), once each."""
        seen: dict[tuple[str, str, object, object], tuple[PrintedFact, int]] = {}
        for n, page in enumerate(self.pages, start=1):
            for b in page.blocks:
                if b.table is None:
                    continue
                for _, cells in b.table.rows:
                    for c in cells:
                        if c.fact is not None:
                            key = (c.fact.concept, c.fact.unit, c.fact.period.start, c.fact.period.end)
                            seen.setdefault(key, (c.fact, n))
        return list(seen.values())


def money(units: int) -> str:
    """A table amount in the table's units: 1,234 or (1,234) for a negative."""
    return f"({-units:,})" if units < 0 else f"{units:,}"


def millions(dollars: int | float) -> str:
    """How text states an amount: "$1,234.5 million"."""
    return f"${dollars / 1e6:,.1f} million"
