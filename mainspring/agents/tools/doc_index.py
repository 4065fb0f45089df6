"""The index behind `search`: a folder's text files cut into overlapping chunks with exact character spans,
each with a BM25 entry and an all-MiniLM-L6-v2 embedding.

Embedding is the slow part (about 40 chunks a second per core), so chunks and their vectors are cached on disk
under `<cache_dir>/search/<folder hash>/`, keyed by the files' sizes and mtimes; when some files change, the
chunks whose text is unchanged keep their vectors. BM25 is rebuilt from the chunks on load (milliseconds). A
process keeps its last few indexes in memory too, so repeated searches only embed the query.

Offsets are characters of the file's bytes decoded as UTF-8 (bad bytes become U+FFFD) without newline
translation: `path.read_bytes().decode("utf-8", "replace")[start:end]` is the cited text.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from mainspring.store.db import is_platform_db

CHUNK_CHARS = 800  # ~150-200 word pieces: inside MiniLM's 256-token window, small enough to cite precisely
OVERLAP_CHARS = 160  # a fact cut by one window boundary is whole in the next window
MAX_FILE_BYTES = 2 << 20
MAX_FILES = 5_000
INDEX_VERSION = 1  # bump when chunking or the cache format changes
MEMORY_INDEXES = 8

Embedder = Callable[[Sequence[str]], np.ndarray]  # texts -> unit vectors [n, dim] float32


@dataclass(frozen=True)
class Chunk:
    file: str  # path relative to the folder, '/' separators
    start: int  # character offsets into the decoded file text, end exclusive
    end: int
    text: str


class DocumentIndex:
    def __init__(self, chunks: list[Chunk], vectors: np.ndarray, skipped: list[str]) -> None:
        self.chunks = chunks
        self.vectors = vectors
        self.skipped = skipped  # "path (why)" for files that were not indexed
        self._bm25 = _build_bm25([c.text for c in chunks]) if chunks else None

    def bm25_scores(self, query: str) -> np.ndarray:
        if self._bm25 is None:
            return np.zeros(0, dtype=np.float32)
        tokens = _tokenize([query], return_ids=False)[0]
        if not tokens:  # only stopwords: no lexical signal at all
            return np.zeros(len(self.chunks), dtype=np.float32)
        return np.asarray(self._bm25.get_scores(tokens), dtype=np.float32)

    def semantic_scores(self, query_vector: np.ndarray) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, dtype=np.float32)
        return self.vectors @ query_vector.astype(np.float32)


# ---- reading and chunking --------------------------------------------------------------------------------------
def read_documents(folder: Path) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """{relative path: (size, mtime_ns)} for the text files under `folder`, and "path (why)" for skipped files."""
    found: dict[str, tuple[int, int]] = {}
    skipped: list[str] = []
    for root, dirs, names in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "node_modules"))
        for name in sorted(names):
            full = Path(root) / name
            rel = full.relative_to(folder).as_posix()
            if name.startswith(".") or full.is_symlink() or not full.is_file():
                continue
            if is_platform_db(full):  # never open()ed: that would drop this process's SQLite locks on it
                skipped.append(f"{rel} (the platform's own database)")
                continue
            info = full.stat()
            if info.st_size > MAX_FILE_BYTES:
                skipped.append(f"{rel} (larger than {MAX_FILE_BYTES >> 20} MiB)")
            elif len(found) >= MAX_FILES:
                skipped.append(f"{rel} (more than {MAX_FILES} files)")
            else:
                found[rel] = (info.st_size, info.st_mtime_ns)
    return found, skipped


def decode_text(data: bytes) -> str | None:
    """The file as text, or None when it looks binary (a NUL byte early on)."""
    if b"\x00" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def chunk_spans(text: str, size: int = CHUNK_CHARS, overlap: int = OVERLAP_CHARS) -> list[tuple[int, int]]:
    """Overlapping (start, end) windows of about `size` characters, cut at paragraph, sentence or word breaks."""
    spans: list[tuple[int, int]] = []
    start, n = 0, len(text)
    while start < n:
        end = min(start + size, n)
        if end < n:
            end = _break_before(text, start + size * 3 // 5, end)
        s, e = start, end
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s:
            spans.append((s, e))
        if end >= n:
            break
        nxt = max(end - overlap, start + 1)
        space = text.find(" ", nxt, end)  # begin the next window on a word, not in the middle of one
        start = space + 1 if space != -1 else nxt
    return spans


def _break_before(text: str, lo: int, hi: int) -> int:
    for sep in ("\n\n", ". ", ".\n", "\n", " "):
        at = text.rfind(sep, lo, hi)
        if at != -1:
            return at + len(sep)
    return hi


# ---- building and caching --------------------------------------------------------------------------------------
class IndexCache:
    """Indexes by folder: in memory for this process, chunks and vectors on disk across processes."""

    def __init__(self, cache_dir: Path, embedder: Embedder, model_name: str) -> None:
        self.cache_dir = Path(cache_dir)
        self.embed = embedder
        self.model_name = model_name
        self._memory: OrderedDict[tuple[str, str], DocumentIndex] = OrderedDict()
        self._lock = threading.Lock()  # guards the two dicts
        self._folder_locks: dict[str, threading.Lock] = {}

    def index(self, folder: str | Path) -> DocumentIndex:
        root = Path(os.path.realpath(folder))
        if not root.is_dir():
            raise FileNotFoundError(f"the attached documents folder {Path(folder).name!r} does not exist")
        files, skipped = read_documents(root)
        manifest = {"version": INDEX_VERSION, "model": self.model_name, "chunk": [CHUNK_CHARS, OVERLAP_CHARS],
                    "files": files}
        key = (str(root), hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest())
        with self._lock:
            folder_lock = self._folder_locks.setdefault(str(root), threading.Lock())
        with folder_lock:  # one build per folder at a time; other folders are not held up
            with self._lock:
                if key in self._memory:
                    self._memory.move_to_end(key)
                    return self._memory[key]
            index = self._load_or_build(root, manifest, files, skipped)
            with self._lock:
                self._memory[key] = index
                while len(self._memory) > MEMORY_INDEXES:
                    self._memory.popitem(last=False)
            return index

    def _folder_dir(self, root: Path) -> Path:
        return self.cache_dir / "search" / hashlib.sha256(str(root).encode()).hexdigest()[:20]

    def _load_or_build(self, root: Path, manifest: dict, files: dict[str, tuple[int, int]],
                       skipped: list[str]) -> DocumentIndex:
        where = self._folder_dir(root)
        cached = _load_cached(where)
        if cached and cached[0] == manifest:
            _, cached_chunks, cached_vectors, old_skipped = cached
            return DocumentIndex(cached_chunks, cached_vectors, old_skipped)
        chunks: list[Chunk] = []
        for rel in files:
            text = decode_text((root / rel).read_bytes())
            if text is None:
                skipped.append(f"{rel} (binary)")
                continue
            chunks += [Chunk(rel, s, e, text[s:e]) for s, e in chunk_spans(text)]
        reuse: dict[str, np.ndarray] = {}
        if cached:  # vectors of unchanged chunk texts carry over
            reuse = {_text_key(c.text): v for c, v in zip(cached[1], cached[2])}
        todo = [c.text for c in chunks if _text_key(c.text) not in reuse]
        fresh = dict(zip(map(_text_key, todo), self.embed(todo))) if todo else {}
        dim = next(iter(fresh.values())).shape[0] if fresh else (cached[2].shape[1] if cached else 0)
        known = {**fresh, **reuse}  # every chunk's text is in one of them
        vectors = np.stack([known[_text_key(c.text)] for c in chunks]) \
            if chunks else np.zeros((0, dim), dtype=np.float32)
        vectors = vectors.astype(np.float32)
        _save_cached(where, manifest, chunks, vectors, skipped)
        return DocumentIndex(chunks, vectors, skipped)


def _text_key(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def _load_cached(where: Path) -> tuple[dict, list[Chunk], np.ndarray, list[str]] | None:
    try:
        with np.load(where / "index.npz", allow_pickle=False) as saved:
            meta = json.loads(saved["meta"].tobytes())
            vectors = saved["vectors"]
        chunks = [Chunk(**c) for c in meta["chunks"]]
        if vectors.shape[0] != len(chunks):
            return None
        meta["manifest"]["files"] = {k: tuple(v) for k, v in meta["manifest"]["files"].items()}
        return meta["manifest"], chunks, vectors, meta.get("skipped", [])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing, half-written by a crashed process, or an older format: rebuild


def _save_cached(where: Path, manifest: dict, chunks: list[Chunk], vectors: np.ndarray, skipped: list[str]) -> None:
    """One file, replaced atomically, so a reader never pairs new chunks with old vectors."""
    where.mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"manifest": manifest, "chunks": [asdict(c) for c in chunks], "skipped": skipped}).encode()
    tmp = where / f"index.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, vectors=vectors, meta=np.frombuffer(meta, dtype=np.uint8))
    os.replace(tmp, where / "index.npz")


# ---- BM25 ------------------------------------------------------------------------------------------------------
_stemmers = threading.local()  # PyStemmer objects must not be shared between threads


def _stem_words(words: list[str]) -> list[str]:
    """English Snowball stems ("refunds" and "refunded" both match "refund"), one stemmer per thread."""
    stemmer = getattr(_stemmers, "english", None)
    if stemmer is None:
        import Stemmer  # PyStemmer

        stemmer = _stemmers.english = Stemmer.Stemmer("english")
    return stemmer.stemWords(words)


def _tokenize(texts: list[str], return_ids: bool = True):
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", stemmer=_stem_words, return_ids=return_ids, show_progress=False)


def _build_bm25(texts: list[str]):
    import bm25s

    bm25 = bm25s.BM25()
    bm25.index(_tokenize(texts), show_progress=False)
    return bm25
