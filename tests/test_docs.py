"""The documentation stays true to the code: the settings table matches config.py, every relative link
resolves, and every bench's `--update-readme` finds its table somewhere."""

import re
from pathlib import Path

import pytest

from mainspring import settings_doc

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text outside code blocks and code spans, where a link is a link."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    return {_anchor(h) for h in _HEADING.findall(_FENCE.sub("", doc.read_text(encoding="utf-8")))}


def test_the_settings_table_matches_config_py():
    text = settings_doc.CONFIGURATION_DOC.read_text(encoding="utf-8")
    table = settings_doc.table_in(text)
    assert table is not None, f"{settings_doc.CONFIGURATION_DOC} lost its settings markers"
    assert table == settings_doc.settings_markdown(), (
        f"the settings table in {settings_doc.CONFIGURATION_DOC.relative_to(ROOT)} is out of date with "
        f"mainspring/config.py; regenerate it with: {settings_doc.REGENERATE}")


def test_every_setting_has_a_row():
    table = settings_doc.settings_markdown()
    for name in settings_doc.Settings.model_fields:
        assert f"`MAINSPRING_{name.upper()}`" in table


def test_write_table_rewrites_only_the_marked_block(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Title\n\nbefore\n\n{settings_doc.START}\nstale\n{settings_doc.END}\n\nafter\n")
    assert settings_doc.write_table(doc)
    text = doc.read_text()
    assert text.startswith("# Title\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert settings_doc.table_in(text) == settings_doc.settings_markdown()
    assert not settings_doc.write_table(doc)  # a second run changes nothing


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_an_existing_file(doc):
    broken = []
    for target in _LINK.findall(_prose(doc.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path_part, _, fragment = target.partition("#")
        path = (doc.parent / path_part).resolve() if path_part else doc
        if not path.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and path.suffix == ".md" and fragment not in _anchors(path):
            broken.append(f"{target} (no heading #{fragment})")
    assert not broken, f"{doc.relative_to(ROOT)} links to: " + ", ".join(broken)


def test_every_bench_table_has_a_place_in_the_docs():
    """Each bench's `--update-readme` (bench/readme_table.py) needs its markers in README.md or docs/*.md."""
    names = set()
    for script in (ROOT / "bench").glob("*.py"):
        names |= set(re.findall(r"write_table\(\s*\"(\w+)\"", script.read_text(encoding="utf-8")))
    assert names, "no bench calls write_table any more: update this test"
    text = "\n".join(doc.read_text(encoding="utf-8") for doc in DOCS)
    missing = sorted(n for n in names if f"<!-- bench:{n} -->" not in text or f"<!-- /bench:{n} -->" not in text)
    assert not missing, f"no <!-- bench:NAME --> ... <!-- /bench:NAME --> block for: {missing}"
