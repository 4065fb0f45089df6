"""A filing's pages as text, the way citations count characters in them.

Markdown: the raw source of each page (pages split at the `<!-- page-break -->` line). HTML: split at the same
comment, then the text of each page (tags dropped, block elements end lines, table cells joined with " | ").
PDF: pypdf's `extract_text()` of each page. `[D:doc_id p.N c.S-E]` is `pages[N-1][S:E]`.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from mainspring.scenarios.finance.corpus_format import PAGE_BREAK

_BREAK_LINE = re.compile(r"^[ \t]*" + re.escape(PAGE_BREAK) + r"[ \t]*(?:\r?\n|$)", re.MULTILINE)
_BLOCKS = {"p", "div", "br", "tr", "table", "h1", "h2", "h3", "h4", "h5", "h6", "li", "ul", "ol", "section",
           "article", "header", "footer", "thead", "tbody", "tfoot", "caption", "blockquote", "pre", "hr", "title"}
_SKIP = {"script", "style", "head"}


def split_pages(source: str) -> list[str]:
    return _BREAK_LINE.split(source)


class _HtmlText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0
        self.cells_in_row = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP:
            self.skipping += 1
        elif tag == "tr":
            self.cells_in_row = 0
            self.parts.append("\n")
        elif tag in ("td", "th"):
            if self.cells_in_row:
                self.parts.append(" | ")
            self.cells_in_row += 1
        elif tag in _BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in _BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(re.sub(r"\s+", " ", data))

    def text(self) -> str:
        lines = [line.strip() for line in "".join(self.parts).split("\n")]
        return "\n".join(line for line in lines if line)


def html_to_text(html: str) -> str:
    parser = _HtmlText()
    parser.feed(html)
    parser.close()
    return parser.text()


def filing_pages(path: Path, fmt: str) -> list[str]:
    """The page texts of one filing file."""
    if fmt == "md":
        return split_pages(path.read_text(encoding="utf-8"))
    if fmt == "html":
        return [html_to_text(page) for page in split_pages(path.read_text(encoding="utf-8"))]
    if fmt == "pdf":
        from pypdf import PdfReader

        return [page.extract_text() or "" for page in PdfReader(str(path)).pages]
    raise ValueError(f"unknown filing format {fmt!r}")


def render_with_offsets(text: str) -> str:
    """The page text with each line's starting character offset, so a span can be cited as c.S-E."""
    out, at = [], 0
    for line in text.split("\n"):
        out.append(f"c.{at}| {line}")
        at += len(line) + 1
    return "\n".join(out)
