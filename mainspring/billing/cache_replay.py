"""Replaying a trace through a prompt cache: which input tokens would have been read from cache,
which written to it, under four cache mechanisms.

All four share one structure: a prefix trie per routing group whose nodes are trace segments
(keyed by content hash), so two requests share a node exactly when they share every segment up to
it. A node remembers how many of its tokens are held (from its start: prefix caches keep a head,
never a middle) and when it was last used. What differs is the granularity of a hit, what a
request leaves behind, and how entries die:

- `automatic_prefix` (OpenAI-like): prompts of ≥1,024 tokens cache their prefix in 128-token
  increments; a hit is the longest held common prefix, rounded down to an increment; entries die
  after `ttl_s` without use (in-memory retention is "typically 5–10 minutes"; 24 h when extended).
- `explicit_breakpoints` (Anthropic-like): only prefixes ending at a breakpoint are written (≤4 per
  request: the end of each stable run of tools / system / documents, then the request's end); a read
  at a breakpoint looks back ≤20 segments for a live entry; writes are billed (1.25× for 5 min,
  2× for 1 h), a read refreshes the entry.
- `disk_units` (DeepSeek-like): the whole prompt is kept; a hit needs complete units, which end at
  the end of a conversation turn or else on a 64-token boundary; no write charge; hours of life.
- `kv_blocks` (this server's engine): only full 16-token blocks hit, and never the prompt's last
  token (the engine computes at least one); blocks are evicted least-recently-used, deepest first,
  once the held tokens exceed `capacity_tokens`.

A trace only knows segments, so a prefix that diverges inside a segment is counted as diverging at
the segment's start, and a model's reply is only matched once it comes back as history: the
simulated hits are a lower bound on what a token-level cache would find.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Iterable

from mainspring.billing.trace import STABLE_KINDS, TraceRequest

POLICIES = ("automatic_prefix", "explicit_breakpoints", "disk_units", "kv_blocks")
TURN_KINDS = ("history", "user", "assistant")  # a DeepSeek cache unit ends where one of these ends


@dataclass(frozen=True)
class PolicySpec:
    name: str
    min_tokens: int = 0  # shorter prefixes are never cached
    increment: int = 1  # hits come in multiples of this
    ttl_s: float = math.inf  # an entry unused this long is gone
    capacity_tokens: int | None = None  # LRU bound on held tokens (kv_blocks)
    retention: str = "5m"  # explicit_breakpoints: "5m" (1.25× writes) or "1h" (2× writes)
    max_breakpoints: int = 4
    lookback: int = 20

    def with_(self, **changes: object) -> PolicySpec:
        return replace(self, **changes)  # type: ignore[arg-type]


DEFAULTS = {
    # 5 min: the low end of OpenAI's "5–10 minutes of inactivity", so the estimate errs low
    "automatic_prefix": PolicySpec("automatic_prefix", min_tokens=1024, increment=128, ttl_s=300),
    "explicit_breakpoints": PolicySpec("explicit_breakpoints", min_tokens=1024, ttl_s=300),
    # DeepSeek: cleared "within a few hours to days" when unused; assume the low end
    "disk_units": PolicySpec("disk_units", min_tokens=64, increment=64, ttl_s=3 * 3600),
    # 256k tokens ≈ 12 GB of fp32 KV for a 135M model; the bench passes the engine's real capacity
    "kv_blocks": PolicySpec("kv_blocks", increment=16, capacity_tokens=262_144),
}


def policy(name: str, **overrides: object) -> PolicySpec:
    if name not in DEFAULTS:
        raise ValueError(f"unknown cache policy {name!r}; policies are {', '.join(POLICIES)}")
    return DEFAULTS[name].with_(**overrides)


@dataclass(frozen=True)
class Hit:
    """Input tokens of one request by cache class; `uncached` is what is left."""

    input_total: int
    cache_read: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0

    @property
    def cache_write(self) -> int:
        return self.cache_write_5m + self.cache_write_1h

    @property
    def uncached(self) -> int:
        return self.input_total - self.cache_read - self.cache_write


@dataclass(eq=False)
class _Node:
    start: int  # tokens before this segment (the same for every request that reaches the node)
    tokens: int
    depth: int
    parent: _Node | None
    kind: str = ""
    children: dict[tuple[str, int], _Node] = field(default_factory=dict)
    held: int = 0  # tokens of this segment in cache, counted from its start
    used: float = -math.inf  # last read or write
    entry_ttl: float = 0.0  # explicit_breakpoints: a live entry ends here when > 0

    @property
    def end(self) -> int:
        return self.start + self.tokens


class _Trie:
    def __init__(self) -> None:
        self.roots: dict[tuple[str, ...], _Node] = {}

    def path(self, group: tuple[str, ...], req: TraceRequest) -> list[_Node]:
        """The request's nodes, created where new (new ones hold nothing)."""
        node = self.roots.setdefault(group, _Node(0, 0, 0, None))
        out = []
        for seg in req.segments:
            key = (seg.hash, seg.tokens)  # a hash reused with another length is another segment (bad trace)
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node(node.end, seg.tokens, node.depth + 1, node, seg.kind)
            out.append(child)
            node = child
        return out


class _PrefixCache:
    """automatic_prefix, disk_units and kv_blocks: a request leaves its whole (rounded) prefix."""

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec
        self.trie = _Trie()
        self.held_total = 0
        self._lru: list[tuple[float, int, int, _Node]] = []  # (used, -depth, seq, node): oldest, deepest first
        self._seq = itertools.count()

    def _alive(self, n: _Node, t: float) -> bool:
        return t - n.used <= self.spec.ttl_s

    def held_extent(self, path: list[_Node], t: float) -> int:
        """Tokens from the start that are in cache without a gap."""
        extent = 0
        for n in path:
            if not self._alive(n, t) or (n.held == 0 and n.tokens > 0):
                break
            extent = n.start + n.held
            if n.held < n.tokens:
                break
        return extent

    def read(self, path: list[_Node], extent: int, n_tokens: int) -> int:
        s = self.spec
        if s.name == "kv_blocks":
            extent = min(extent, n_tokens - 1)  # the engine always computes the last prompt token
        elif s.name == "disk_units":
            at_turn_end = any(n.end == extent and n.kind in TURN_KINDS for n in path)
            if at_turn_end:
                return extent if extent >= s.min_tokens else 0
        hit = extent // s.increment * s.increment
        return hit if hit >= s.min_tokens else 0

    def kept(self, n_tokens: int) -> int:
        """How much of a request's prompt it leaves in cache."""
        s = self.spec
        if s.name == "disk_units":
            return n_tokens
        kept = n_tokens // s.increment * s.increment
        return kept if kept >= s.min_tokens else 0

    def store(self, path: list[_Node], extent: int, t: float) -> None:
        for n in path:
            if n.start >= extent and n.tokens > 0:
                break
            old = n.held
            n.held = max(old if self._alive(n, t) else 0, min(n.tokens, extent - n.start))
            self.held_total += n.held - old
            n.used = t
            if self.spec.capacity_tokens is not None:
                heapq.heappush(self._lru, (t, -n.depth, next(self._seq), n))
        self._evict()

    def _evict(self) -> None:
        cap = self.spec.capacity_tokens
        if cap is None:
            return
        while self.held_total > cap and self._lru:
            used, _, _, n = heapq.heappop(self._lru)
            if n.used != used or n.held == 0:
                continue  # stale entry: touched again since, or already gone
            if any(c.held for c in n.children.values()):
                continue  # a child is newer-or-equal and goes first; the child's eviction re-queues us
            self.held_total -= n.held
            n.held, n.used = 0, -math.inf
            p = n.parent
            if p is not None and p.held and p.depth > 0:
                heapq.heappush(self._lru, (p.used, -p.depth, next(self._seq), p))

    def replay(self, group: tuple[str, ...], req: TraceRequest) -> Hit:
        path = self.trie.path(group, req)
        n_tokens = req.input_tokens
        hit = self.read(path, self.held_extent(path, req.t), n_tokens)
        self.store(path, max(hit, self.kept(n_tokens)), req.t)
        return Hit(n_tokens, cache_read=hit)


class _Breakpoints:
    """explicit_breakpoints: entries only where the client put cache_control."""

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec
        self.ttl = 3600.0 if spec.retention == "1h" else spec.ttl_s
        self.trie = _Trie()

    def breakpoints(self, req: TraceRequest) -> list[int]:
        """Where a careful client puts them: the end of each run of stable segments (tools, system,
        documents), then the request's last segment, so the next turn reads this one."""
        kinds = [s.kind for s in req.segments]
        last = len(kinds) - 1
        stable = [i for i, k in enumerate(kinds) if k in STABLE_KINDS and (i == last or kinds[i + 1] != k)]
        chosen = stable[: self.spec.max_breakpoints - 1] + ([last] if last >= 0 else [])
        return sorted(set(chosen))

    def replay(self, group: tuple[str, ...], req: TraceRequest) -> Hit:
        path = self.trie.path(group, req)
        t, spec = req.t, self.spec
        bps = [b for b in self.breakpoints(req) if path[b].end >= spec.min_tokens]
        read, read_node = 0, None
        for b in bps:
            for j in range(b, max(-1, b - spec.lookback), -1):
                n = path[j]
                if n.entry_ttl and t - n.used <= n.entry_ttl:
                    if n.end > read:
                        read, read_node = n.end, n
                    break
        if read_node is not None:
            read_node.used = t  # a read refreshes the entry's lifetime
        top = max((path[b].end for b in bps), default=0)
        write = max(0, top - read)
        for b in bps:
            if path[b].end > read:
                path[b].entry_ttl, path[b].used = self.ttl, t
        one_hour = spec.retention == "1h"
        return Hit(req.input_tokens, cache_read=read, cache_write_5m=0 if one_hour else write,
                   cache_write_1h=write if one_hour else 0)


def group_of(spec: PolicySpec, req: TraceRequest) -> tuple[str, ...]:
    # our engine has one cache per model and no per-tenant salt; providers cache per organisation
    return (req.model,) if spec.name == "kv_blocks" else (req.model, req.project)


def replay(spec: PolicySpec, requests: Iterable[TraceRequest]) -> list[Hit]:
    """Each request's hit, in the order given (the caller sorts by time)."""
    cache = _Breakpoints(spec) if spec.name == "explicit_breakpoints" else _PrefixCache(spec)
    return [cache.replay(group_of(spec, r), r) for r in requests]
