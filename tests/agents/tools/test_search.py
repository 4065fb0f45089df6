import os
from pathlib import Path

import pytest

from mainspring.agents.tools.base import ToolContext
from mainspring.agents.tools.doc_index import CHUNK_CHARS, chunk_spans
from mainspring.agents.tools.search import minilm_embedder, search_tool
from mainspring.config import Settings

from .conftest import call

FACT = "The backup generator in building C is tested every second Tuesday at 07:30."
REFUND = ("Refunds for annual plans are issued within 14 days of the cancellation request, to the original "
          "payment method.")
FILLER = ("The facilities team keeps a log of every visit by contractors. Badges are collected at the front "
          "desk and returned at the end of the day. Parking spaces near the loading dock are reserved for "
          "deliveries between six and nine in the morning. ")

DOCS = {
    "ops/facilities.md": "# Facilities\n\n" + FILLER * 3 + "\n\n" + FACT + "\n\n" + FILLER * 2,
    "billing/refunds.md": "# Billing policy\n\n" + REFUND + " Monthly plans are not refunded.\n",
    "newsletter.txt": "Subscribing to the newsletter is free. You can stop it at any time with one click, and "
                      "we never sell your address to get money from advertisers.\n",
    "kitchen.md": "The kitchen on floor two has a coffee machine, a fridge and a microwave. Clean up after use.\n",
    "code/util.py": "def add(a, b):\n    \"\"\"Return the sum of two numbers.\"\"\"\n    return a + b\n",
    "notes/travel.md": "Travel must be booked through the portal. Economy class for flights under six hours.\n",
}


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("docs")
    for name, text in DOCS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "image.png").write_bytes(b"\x89PNG\x00\x00\x00binary")
    (root / ".hidden.md").write_text(FACT)  # hidden files are not indexed
    return root


class CountingEmbedder:
    def __init__(self) -> None:
        self.texts = 0

    def __call__(self, texts):
        self.texts += len(texts)
        return minilm_embedder(texts)


@pytest.fixture(scope="module")
def cache_settings(tmp_path_factory) -> Settings:
    return Settings(data_dir=tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def search(cache_settings):
    return search_tool(cache_settings)


def docs_ctx(workspace, docs) -> ToolContext:
    return ToolContext("run", "call", "key", workspace=workspace, attachments={"docs": str(docs)})


def test_a_planted_fact_is_cited_by_file_and_exact_span(search, docs, workspace):
    result = call(search, {"query": "when is the backup generator tested", "k": 3}, docs_ctx(workspace, docs))
    assert not result.is_error, result.content
    top = result.data["citations"][0]
    assert top["file"] == "ops/facilities.md"
    text = (docs / "ops/facilities.md").read_text()
    assert text[top["start"]:top["end"]] == top["text"]
    assert top["start"] <= text.index(FACT) and text.index(FACT) + len(FACT) <= top["end"]
    assert top["end"] - top["start"] <= CHUNK_CHARS
    assert top["bm25_rank"] == 1 and top["semantic_rank"] == 1
    assert result.content.startswith(f"[1] ops/facilities.md (characters {top['start']}-{top['end']})\n")
    assert result.data["skipped"] == ["image.png (binary)"]
    assert all(c["file"] != ".hidden.md" for c in result.data["citations"])


def test_hybrid_finds_a_paraphrase_that_keywords_miss(search, docs, workspace):
    ctx = docs_ctx(workspace, docs)
    query = "how quickly will I get my money back if I stop a yearly subscription"

    def rank_of(mode: str, file: str) -> float:
        files = [c["file"] for c in call(search, {"query": query, "k": 5, "mode": mode}, ctx).data["citations"]]
        return files.index(file) + 1 if file in files else float("inf")

    bm25 = rank_of("bm25", "billing/refunds.md")
    hybrid = rank_of("hybrid", "billing/refunds.md")
    assert bm25 == float("inf")  # no shared words: BM25 alone cannot find it
    assert rank_of("semantic", "billing/refunds.md") == 1
    assert hybrid <= 2 and hybrid <= bm25


def test_results_do_not_repeat_overlapping_windows(search, docs, workspace):
    citations = call(search, {"query": "facilities contractors badges parking", "k": 10},
                     docs_ctx(workspace, docs)).data["citations"]
    spans = [(c["file"], c["start"], c["end"]) for c in citations]
    for i, (f1, s1, e1) in enumerate(spans):
        for f2, s2, e2 in spans[i + 1:]:
            assert f1 != f2 or e1 <= s2 or e2 <= s1


def test_index_is_cached_in_memory_and_on_disk_and_rebuilt_only_for_changes(cache_settings, docs, workspace,
                                                                             tmp_path):
    folder = tmp_path / "mydocs"
    folder.mkdir()
    for name in ("billing/refunds.md", "kitchen.md", "ops/facilities.md"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(DOCS[name])
    ctx = docs_ctx(workspace, folder)
    first = CountingEmbedder()
    tool = search_tool(cache_settings, embedder=first)
    call(tool, {"query": "coffee"}, ctx)
    chunks = first.texts - 1  # every chunk once, plus the query
    assert chunks >= 4
    call(tool, {"query": "coffee"}, ctx)
    assert first.texts == chunks + 2  # second search: only the query is embedded

    second = CountingEmbedder()  # a new process: the disk cache is used
    result = call(search_tool(cache_settings, embedder=second), {"query": "coffee machine"}, ctx)
    assert second.texts == 1
    assert result.data["citations"][0]["file"] == "kitchen.md"

    (folder / "kitchen.md").write_text("The kitchen now has a tea kettle as well.\n")
    os.utime(folder / "kitchen.md", ns=(1, 1))  # a different mtime even on coarse clocks
    third = CountingEmbedder()
    result = call(search_tool(cache_settings, embedder=third), {"query": "tea kettle"}, ctx)
    assert third.texts == 2  # the one changed chunk and the query; unchanged chunks keep their vectors
    top = result.data["citations"][0]
    assert top["file"] == "kitchen.md" and top["text"] == "The kitchen now has a tea kettle as well."


def test_errors_are_results_for_the_model(search, docs, workspace, tmp_path):
    assert call(search, {"query": "x"}, ToolContext("r", "c", "k", workspace=workspace)).content \
        == "no document folder is attached to this run (attachment 'docs')"
    assert call(search, {"query": "  "}, docs_ctx(workspace, docs)).content == "the query is empty"
    missing = call(search, {"query": "x"}, docs_ctx(workspace, tmp_path / "nope"))
    assert missing.is_error and "does not exist" in missing.content
    empty = tmp_path / "empty"
    empty.mkdir()
    assert call(search, {"query": "x"}, docs_ctx(workspace, empty)).content \
        == "the attached folder has no text documents"
    assert call(search, {"query": "x", "k": 0}, docs_ctx(workspace, docs)).is_error


def test_chunks_cover_the_text_with_overlap_and_break_at_words():
    text = " ".join(f"word{i}" for i in range(600)) + ". End."
    spans = chunk_spans(text, size=200, overlap=50)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    for (s1, e1), (s2, _) in zip(spans, spans[1:]):
        assert s2 < e1 and s2 > s1  # overlapping, always moving forward
        assert e1 - s1 <= 200 and text[s2 - 1] == " " and text[e1 - 1] != " "
    assert chunk_spans("") == [] and chunk_spans("  \n ") == []
    assert chunk_spans("short text") == [(0, 10)]
