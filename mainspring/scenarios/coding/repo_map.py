"""A repository map after aider's: what each Python file defines and uses, ranked for the task, as signatures.

- Tags: per file, from stdlib `ast`, the definitions (classes, functions, methods, with their signatures) and
  the references (every name loaded, attribute used or imported). Cached on disk under the data dir, one entry
  per file keyed by its path, mtime and size, so a second map of an unchanged repository parses nothing.
- Graph: file A uses a name that file B defines → edge A→B, weighted as aider does: sqrt(uses) × 10 when the
  task mentions the name, × 10 for a long (≥ 8 chars) snake/camel name, × 0.1 for a `_private` one, × 0.1 for
  a name defined in more than 5 files, × 50 when A is a file the task names. A definition nobody uses gets a
  self-edge of 0.1, which shares its file's rank with it (the walk itself leaves self-edges out).
- Rank: personalized PageRank (power iteration below; no networkx, which is not a dependency of ours) with the
  restart mass on the files the task names or whose stem it mentions; each file's rank is then spread over its
  out-edges onto (file, name) pairs, which orders the definitions.
- Render: the files the task names first (their whole outline: the task is about them), then definitions by
  rank, grouped by file in line order, as `file:` then `⋮ def f(a, b)` lines; the largest prefix of that order
  that fits `budget` tokens (binary search; the budget is a hard cap). Token counts come from the caller's
  counter (the engine's tokenizer) or `estimate_tokens`, ceil(chars / 4), the runtime's own estimate.

The output depends only on the files and the task, in a fixed order, so it is byte-identical turn after turn:
it heads the system prompt and every turn after the first reads it from the prefix cache.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

DEFAULT_BUDGET = 1024
CACHE_VERSION = 1
LINE_CHARS = 100  # a rendered line is cut here (aider does the same)
MAX_FILES = 5000
SKIP_DIRS = {"__pycache__", "node_modules", "venv", "build", "dist", "site-packages"}  # and every .hidden dir
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PATHLIKE = re.compile(r"[\w./-]+\.py\b")
TokenCounter = Callable[[str], int]


def estimate_tokens(text: str) -> int:
    """ceil(chars / 4): the agent runtime's estimate (agents/context.py), rounded up so it never undercounts."""
    return -(-len(text) // 4)


@dataclass(frozen=True)
class Definition:
    name: str  # "f", "Ledger", "Ledger.add"
    kind: str  # class | function | method
    line: int
    signature: str  # "def add(self, entry) -> None", indented for methods


@dataclass
class FileTags:
    path: str  # relative, '/' separators
    definitions: list[Definition] = field(default_factory=list)
    references: dict[str, int] = field(default_factory=dict)  # name -> uses


# ---- tags ----------------------------------------------------------------------------------------------
def _signature(node: ast.AST, indent: str) -> str:
    if isinstance(node, ast.ClassDef):
        bases = [ast.unparse(b) for b in node.bases] + [ast.unparse(k) for k in node.keywords]
        return f"{indent}class {node.name}" + (f"({', '.join(bases)})" if bases else "")
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"{indent}{prefix} {node.name}({ast.unparse(node.args)}){returns}"


def extract_tags(path: str, source: str) -> FileTags:
    """Definitions and references of one file; a file that does not parse has none (it stays a graph node)."""
    tags = FileTags(path)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return tags

    def visit_body(body: list[ast.stmt], owner: str | None) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and owner is None:
                tags.definitions.append(Definition(node.name, "class", node.lineno, _signature(node, "")))
                visit_body(node.body, node.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{owner}.{node.name}" if owner else node.name
                kind = "method" if owner else "function"
                tags.definitions.append(Definition(name, kind, node.lineno,
                                                   _signature(node, "    " if owner else "")))

    visit_body(tree.body, None)
    uses: Counter[str] = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            uses[node.id] += 1
        elif isinstance(node, ast.Attribute):
            uses[node.attr] += 1
        elif isinstance(node, ast.ImportFrom):
            uses.update(alias.name for alias in node.names if alias.name != "*")
    tags.references = dict(sorted(uses.items()))
    return tags


def python_files(root: Path) -> list[str]:
    """The repository's .py files, relative and sorted; hidden folders, caches and environments skipped."""
    found: list[str] = []
    for here, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
        for name in sorted(names):
            if name.endswith(".py") and len(found) < MAX_FILES:
                found.append(Path(here, name).relative_to(root).as_posix())
    return sorted(found)


class TagCache:
    """Tags per file on disk, keyed by path + mtime + size: only files changed since the last map are parsed."""

    def __init__(self, cache_dir: Path | None, root: Path):
        key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
        self.path = cache_dir / f"tags-{key}.json" if cache_dir is not None else None
        self.entries: dict[str, dict] = {}
        self.parsed = 0  # files parsed (not read from the cache) by the last `tags` call
        if self.path is not None and self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                if data.get("version") == CACHE_VERSION:
                    self.entries = data["files"]
            except (OSError, ValueError, KeyError):
                self.entries = {}  # a broken cache is rebuilt, never trusted

    def tags(self, root: Path, paths: Iterable[str]) -> list[FileTags]:
        out, fresh, self.parsed = [], {}, 0
        for rel in paths:
            st = (root / rel).stat()
            key = [st.st_mtime_ns, st.st_size]
            entry = self.entries.get(rel)
            if entry is None or entry.get("key") != key:
                source = (root / rel).read_text(encoding="utf-8", errors="replace")
                tags = extract_tags(rel, source)
                entry = {"key": key, "definitions": [asdict(d) for d in tags.definitions],
                         "references": tags.references}
                self.parsed += 1
            fresh[rel] = entry
            out.append(FileTags(rel, [Definition(**d) for d in entry["definitions"]], dict(entry["references"])))
        if self.path is not None and (self.parsed or set(fresh) != set(self.entries)):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"version": CACHE_VERSION, "files": fresh}, sort_keys=True))
            tmp.replace(self.path)
        self.entries = fresh
        return out


# ---- ranking -------------------------------------------------------------------------------------------
def pagerank(nodes: list[str], edges: dict[tuple[str, str], float], personalization: dict[str, float] | None,
             alpha: float = 0.85, iterations: int = 300, tol: float = 1e-12) -> dict[str, float]:
    """Personalized PageRank by power iteration. `edges` (src, dst) -> weight; a node without out-edges gives
    its rank back through the restart vector, as networkx does."""
    if not nodes:
        return {}
    restart = {n: (personalization or {}).get(n, 0.0) for n in nodes}
    total = sum(restart.values())
    restart = {n: v / total for n, v in restart.items()} if total > 0 else {n: 1 / len(nodes) for n in nodes}
    out_weight: dict[str, float] = defaultdict(float)
    for (src, _), w in edges.items():
        out_weight[src] += w
    rank = dict(restart)
    flows = [(src, dst, w / out_weight[src]) for (src, dst), w in sorted(edges.items())]
    for _ in range(iterations):
        dangling = sum(rank[n] for n in nodes if out_weight[n] == 0)
        new = {n: (1 - alpha + alpha * dangling) * restart[n] for n in nodes}
        for src, dst, share in flows:
            new[dst] += alpha * rank[src] * share
        done = sum(abs(new[n] - rank[n]) for n in nodes) < tol * len(nodes)
        rank = new
        if done:
            break
    return rank


def _long_name(name: str) -> bool:
    return len(name) >= 8 and ("_" in name.strip("_") or any(c.isupper() for c in name[1:]))


@dataclass
class Ranking:
    file_rank: dict[str, float]
    definition_rank: dict[tuple[str, str], float]  # (file, definition name) -> rank
    named_files: list[str]  # files the task names, in path order


def task_mentions(task: str, paths: list[str]) -> tuple[list[str], set[str], set[str]]:
    """(files the task names by path or file name, identifiers it mentions, files whose stem it mentions)."""
    words = set(IDENT.findall(task))
    named_paths = {m.strip("./") for m in PATHLIKE.findall(task)}
    # a path as written (relative to the root or to a folder above it) or as its tail ("leases.py")
    named = [p for p in paths if any(p == m or p.endswith("/" + m) or m.endswith("/" + p) for m in named_paths)]
    stems = {p for p in paths if Path(p).stem in words and Path(p).stem != "__init__"}
    return named, words, stems


def rank(all_tags: list[FileTags], task: str = "") -> Ranking:
    paths = [t.path for t in all_tags]
    named, mentioned, stem_files = task_mentions(task, paths)
    defines: dict[str, set[str]] = defaultdict(set)
    for tags in all_tags:
        for d in tags.definitions:
            defines[d.name.rsplit(".", 1)[-1]].add(tags.path)  # a method is used by its own name: obj.add(...)
    edges: dict[tuple[str, str], float] = defaultdict(float)
    per_name: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    referenced: set[str] = set()
    for tags in all_tags:
        for name, uses in tags.references.items():
            for definer in sorted(defines.get(name, ())):
                if definer == tags.path:
                    continue
                referenced.add(name)
                mul = 1.0
                if name in mentioned:
                    mul *= 10
                if _long_name(name):
                    mul *= 10
                if name.startswith("_"):
                    mul *= 0.1
                if len(defines[name]) > 5:
                    mul *= 0.1
                if tags.path in named:
                    mul *= 50
                w = mul * math.sqrt(uses)
                edges[(tags.path, definer)] += w
                per_name[(tags.path, definer)][name] += w
    for name, definers in defines.items():
        if name not in referenced:
            for definer in definers:
                edges[(definer, definer)] += 0.1
                per_name[(definer, definer)][name] += 0.1
    chosen = set(named) | stem_files
    personalization = {p: 100 / len(chosen) for p in chosen} if chosen else None
    # self-edges only share a file's rank among its own definitions: in the walk a self-loop would hoard rank,
    # and a file of unused helpers would lead the map
    file_rank = pagerank(paths, {k: w for k, w in edges.items() if k[0] != k[1]}, personalization)
    out_weight: dict[str, float] = defaultdict(float)
    for (src, _), w in edges.items():
        out_weight[src] += w
    definition_rank: dict[tuple[str, str], float] = defaultdict(float)
    for (src, dst), names in sorted(per_name.items()):
        for name, w in sorted(names.items()):
            definition_rank[(dst, name)] += file_rank[src] * w / out_weight[src]
    return Ranking(file_rank, dict(definition_rank), sorted(named))


# ---- rendering -----------------------------------------------------------------------------------------
def ordered_definitions(all_tags: list[FileTags], ranking: Ranking) -> list[tuple[str, Definition]]:
    """Every definition in map order: the named files' whole outlines, then the rest by rank (ties: by the
    file's rank, then path and line, so the order is total and the map deterministic)."""
    first: list[tuple[str, Definition]] = []
    rest: list[tuple[float, float, str, int, Definition]] = []
    for tags in sorted(all_tags, key=lambda t: t.path):
        for d in tags.definitions:
            if tags.path in ranking.named_files:
                first.append((tags.path, d))
                continue
            score = ranking.definition_rank.get((tags.path, d.name.rsplit(".", 1)[-1]), 0.0)
            rest.append((-score, -ranking.file_rank.get(tags.path, 0.0), tags.path, d.line, d))
    first.sort(key=lambda item: (ranking.named_files.index(item[0]), item[1].line))
    rest.sort(key=lambda r: r[:4])
    return first + [(path, d) for *_, path, _, d in rest]


def render(selected: list[tuple[str, Definition]], all_tags: dict[str, FileTags]) -> str:
    """`file:` then one `⋮ signature` line per definition in line order; a method brings its class line."""
    by_file: dict[str, set[int]] = defaultdict(set)
    order: list[str] = []
    for path, d in selected:
        if path not in by_file:
            order.append(path)
        by_file[path].add(d.line)
        if d.kind == "method":  # its class, for context
            owner = d.name.split(".", 1)[0]
            cls = next((c for c in all_tags[path].definitions if c.kind == "class" and c.name == owner), None)
            if cls is not None:
                by_file[path].add(cls.line)
    blocks = []
    for path in order:
        lines = [f"{path}:"]
        for d in sorted((d for d in all_tags[path].definitions if d.line in by_file[path]), key=lambda d: d.line):
            text = f"⋮ {d.signature}"
            lines.append(text if len(text) <= LINE_CHARS else text[:LINE_CHARS - 1] + "…")
        blocks.append("\n".join(lines))
    return "\n".join(blocks) + ("\n" if blocks else "")


@dataclass
class RepoMap:
    text: str
    tokens: int  # by the counter it was made with
    files: list[str]  # files shown, in map order
    definitions: int  # definitions shown
    total_definitions: int
    parsed_files: int  # files parsed this time (the rest came from the cache)


def build_repo_map(root: Path | str, task: str = "", *, budget: int = DEFAULT_BUDGET,
                   count_tokens: TokenCounter = estimate_tokens, cache_dir: Path | None = None) -> RepoMap:
    """The map of the repository at `root` for `task`, at most `budget` tokens by `count_tokens`."""
    root = Path(root)
    cache = TagCache(cache_dir, root)
    all_tags = cache.tags(root, python_files(root))
    ordered = ordered_definitions(all_tags, rank(all_tags, task))
    by_path = {t.path: t for t in all_tags}
    lo, hi = 0, len(ordered)  # the longest prefix that fits: rendering grows with every definition added
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(render(ordered[:mid], by_path)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    text = render(ordered[:lo], by_path)
    files = list(dict.fromkeys(path for path, _ in ordered[:lo]))
    return RepoMap(text, count_tokens(text), files, lo, len(ordered), cache.parsed)
