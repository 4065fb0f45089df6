"""Which engine replica serves a request: the one that already holds its prompt's prefix, unless it is hot.

Each replica keeps its own prefix cache, so a request's cached tokens depend on where it goes. Agents of one
project send the same long system prompt (and each agent its own growing conversation) turn after turn:
round-robin spreads those turns over every replica and each replica prefills the prefix again; routing by
prefix sends them back to the replica that cached it. The policy is SGLang's cache-aware router's, over the
engine's own block hashes instead of text:

- The router remembers, per replica, the chained block hashes (engine/kv_cache.py `hash_block_tokens`, the
  same chain the prefix cache keys its blocks by, tenant salt included) of the prompts it routed there, most
  recent last, up to `max_blocks_per_replica`. It is an estimate of each cache: a replica may have evicted a
  block the router still lists, and then the request is only slower, never wrong.
- A request goes to the replica whose record matches the longest run of its leading blocks, when that run
  covers at least `cache_threshold` of the prompt's full blocks; otherwise to the least loaded replica
  (ties: the smallest record, the most room).
- Load wins over locality when the replicas are imbalanced: the busiest has `balance_abs` more requests in
  flight than the idlest and more than `balance_rel` times as many. Then the idlest takes the request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from mainspring.engine.kv_cache import hash_block_tokens

POLICIES = ("prefix", "round_robin", "least_loaded")


@dataclass(frozen=True)
class RouterConfig:
    policy: str = "prefix"  # "prefix" | "round_robin" | "least_loaded"
    block_size: int = 16  # the engines' KV block size: a prefix is matched in whole blocks
    cache_threshold: float = 0.5  # share of the prompt's full blocks a replica must hold to win on locality
    balance_abs: int = 4  # imbalance: in-flight spread above this ...
    balance_rel: float = 1.5  # ... and the busiest above this multiple of the idlest
    max_blocks_per_replica: int = 65536  # the record's size per replica (about a 1M-token cache at 16)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown routing policy {self.policy!r}; supported: {', '.join(POLICIES)}")
        if self.block_size < 1:
            raise ValueError("block_size must be at least 1")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError("cache_threshold must lie in [0, 1]")


@dataclass
class Route:
    replica: str
    reason: str  # "prefix" (locality), "balance" (imbalanced), "load" (no replica held enough), "round_robin"
    matched_blocks: int  # leading blocks the chosen replica's record held
    prompt_blocks: int


@dataclass
class _Replica:
    in_flight: int = 0
    blocks: OrderedDict[bytes, None] = field(default_factory=OrderedDict)  # block hashes, least recent first


def block_hashes(token_ids: Sequence[int], block_size: int, salt: str | None = None) -> list[bytes]:
    """The chained hashes of the prompt's full blocks, as the prefix cache keys them."""
    out: list[bytes] = []
    parent = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size], salt)
        out.append(parent)
    return out


class PrefixRouter:
    """Routing state for a set of replicas, named by id. Not thread-safe: one event loop drives it."""

    def __init__(self, replicas: Sequence[str], config: RouterConfig | None = None) -> None:
        self.config = config or RouterConfig()
        self._replicas: dict[str, _Replica] = {}
        self._next = 0  # round-robin position
        for r in replicas:
            self.add(r)

    @property
    def replicas(self) -> list[str]:
        return list(self._replicas)

    def add(self, replica: str) -> None:
        self._replicas.setdefault(replica, _Replica())

    def remove(self, replica: str) -> None:
        """A replica that died or left: its record goes with it (its cache did)."""
        self._replicas.pop(replica, None)

    def in_flight(self, replica: str) -> int:
        return self._replicas[replica].in_flight

    def route(self, token_ids: Sequence[int], salt: str | None = None, exclude: Sequence[str] = ()) -> Route:
        """Choose a replica for this prompt (never one in `exclude`: those that failed it) and count the request
        in flight there until `done`."""
        names = [n for n in self._replicas if n not in exclude]
        if not names:
            raise LookupError("no engine replica is available")
        cfg = self.config
        hashes = block_hashes(token_ids, cfg.block_size, salt)
        if cfg.policy == "round_robin":
            name, reason = names[self._next % len(names)], "round_robin"
            self._next += 1
        elif cfg.policy == "least_loaded":
            name, reason = self._least_loaded(names), "load"
        else:
            name, reason = self._by_prefix(names, hashes)
        chosen = self._replicas[name]
        matched = self._matched(chosen, hashes)
        chosen.in_flight += 1
        self._remember(chosen, hashes)
        return Route(name, reason, matched, len(hashes))

    def done(self, replica: str) -> None:
        """The request routed to `replica` finished (or failed there)."""
        r = self._replicas.get(replica)
        if r is not None and r.in_flight > 0:
            r.in_flight -= 1

    def _by_prefix(self, names: list[str], hashes: list[bytes]) -> tuple[str, str]:
        cfg = self.config
        loads = [self._replicas[n].in_flight for n in names]
        lo, hi = min(loads), max(loads)
        if hi - lo > cfg.balance_abs and hi > lo * cfg.balance_rel:
            return self._least_loaded(names), "balance"
        if hashes:
            matched = {n: self._matched(self._replicas[n], hashes) for n in names}
            best = max(names, key=lambda n: (matched[n], -self._replicas[n].in_flight))
            if matched[best] > 0 and matched[best] >= cfg.cache_threshold * len(hashes):
                return best, "prefix"
        return self._least_loaded(names), "load"

    def _least_loaded(self, names: list[str]) -> str:
        return min(names, key=lambda n: (self._replicas[n].in_flight, len(self._replicas[n].blocks)))

    @staticmethod
    def _matched(replica: _Replica, hashes: list[bytes]) -> int:
        # the chain makes block i's hash depend on blocks 0..i: the first miss ends the shared prefix
        n = 0
        for h in hashes:
            if h not in replica.blocks:
                break
            n += 1
        return n

    def _remember(self, replica: _Replica, hashes: list[bytes]) -> None:
        for h in hashes:
            replica.blocks[h] = None
            replica.blocks.move_to_end(h)
        while len(replica.blocks) > self.config.max_blocks_per_replica:
            replica.blocks.popitem(last=False)
