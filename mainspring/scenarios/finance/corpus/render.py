"""Documents to bytes: Markdown and HTML through Jinja2 templates (pages joined by PAGE_BREAK), PDF through fpdf2
with a fixed creation date so the same seed gives the same bytes. PDF text is ASCII (fpdf2's core fonts are
latin-1 only), as is every string the builders write."""

from __future__ import annotations

from datetime import datetime, timezone

import jinja2
from fpdf import FPDF

from mainspring.scenarios.finance.corpus.document import Document
from mainspring.scenarios.finance.corpus_format import PAGE_BREAK

_ENV = jinja2.Environment(autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)

MARKDOWN = _ENV.from_string("""\
{% for page in doc.pages %}
{% if not loop.first %}
{{ page_break }}

{% endif %}
{% for b in page.blocks %}
{% if b.kind == "h1" %}
# {{ b.text }}

{% elif b.kind == "h2" %}
## {{ b.text }}

{% elif b.kind == "p" %}
{{ b.text }}

{% else %}
**{{ b.table.title }}**

| {{ b.table.columns | join(" | ") }} |
|{% for c in b.table.columns %}{{ "---|" if loop.first else "---:|" }}{% endfor %}

{% for name, cells in b.table.rows %}
| {{ name }} | {{ cells | map(attribute="text") | join(" | ") }} |
{% endfor %}

{% endif %}
{% endfor %}
{% endfor %}
""")

HTML = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True).from_string("""\
<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{{ doc.title }}</title></head>
<body>
{% for page in doc.pages %}
{% if not loop.first %}
{{ page_break | safe }}
{% endif %}
<section class="page">
{% for b in page.blocks %}
{% if b.kind == "h1" %}
<h1>{{ b.text }}</h1>
{% elif b.kind == "h2" %}
<h2>{{ b.text }}</h2>
{% elif b.kind == "p" %}
<p>{{ b.text }}</p>
{% else %}
<table>
<caption>{{ b.table.title }}</caption>
<tr>{% for c in b.table.columns %}<th>{{ c }}</th>{% endfor %}</tr>
{% for name, cells in b.table.rows %}
<tr><td>{{ name }}</td>{% for c in cells %}<td>{{ c.text }}</td>{% endfor %}</tr>
{% endfor %}
</table>
{% endif %}
{% endfor %}
</section>
{% endfor %}
</body></html>
""")

FIXED_DATE = datetime(2025, 1, 1, tzinfo=timezone.utc)


def render_markdown(doc: Document) -> bytes:
    return MARKDOWN.render(doc=doc, page_break=PAGE_BREAK).encode()


def render_html(doc: Document) -> bytes:
    return HTML.render(doc=doc, page_break=PAGE_BREAK).encode()


def render_pdf(doc: Document) -> bytes:
    pdf = FPDF(orientation="L", format="letter")
    pdf.set_creation_date(FIXED_DATE)
    pdf.set_title(doc.title)
    pdf.set_auto_page_break(False)
    pdf.set_margins(12, 12)
    width = pdf.w - 24
    for page in doc.pages:
        pdf.add_page()
        for b in page.blocks:
            if b.kind in ("h1", "h2"):
                pdf.set_font("Helvetica", "B", 15 if b.kind == "h1" else 12)
                pdf.multi_cell(width, 7, b.text, new_x="LMARGIN", new_y="NEXT")
                pdf.ln(2)
            elif b.kind == "p":
                pdf.set_font("Helvetica", "", 10)
                pdf.multi_cell(width, 5, b.text, new_x="LMARGIN", new_y="NEXT")
                pdf.ln(2)
            elif b.table is not None:
                t = b.table
                pdf.set_font("Helvetica", "B", 9)
                pdf.multi_cell(width, 5, t.title, new_x="LMARGIN", new_y="NEXT")
                first = 85.0
                rest = (width - first) / max(1, len(t.columns) - 1)
                pdf.set_font("Helvetica", "B", 7)
                for i, c in enumerate(t.columns):
                    pdf.cell(first if i == 0 else rest, 5, c, align="L" if i == 0 else "R")
                pdf.ln(5)
                pdf.set_font("Helvetica", "", 8)
                for row_name, cells in t.rows:
                    pdf.cell(first, 4.6, row_name)
                    for cell in cells:
                        pdf.cell(rest, 4.6, cell.text, align="R")
                    pdf.ln(4.6)
                pdf.ln(3)
    return bytes(pdf.output())


def render(doc: Document, fmt: str) -> bytes:
    return {"md": render_markdown, "html": render_html, "pdf": render_pdf}[fmt](doc)
