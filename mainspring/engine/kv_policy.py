"""Which KV a sequence keeps and at what precision: sinks + sliding window, hot and cold tiers.

A policy turns the paged cache from "every token, fp32, forever" into a bounded one:

- window: attend only to the last `window` tokens plus the first `sink_tokens` (StreamingLLM,
  arXiv 2309.17453). Blocks wholly behind the window are released, so KV memory and decode cost
  stay flat however long the sequence grows, and the sequence may run past the trained context.
- hot_tokens: the most recent `hot_tokens` stay fp32 ("hot"); older full blocks are quantized
  into the cold store (int8 / int4, KIVI layout: engine/kv_quant.py) and their fp32 block is
  released. Attention reads the mixed-precision blocks (sparse_attention.py).

- snap_tokens: once the prompt is in, keep only `snap_tokens` of it (SnapKV, arXiv 2404.14469, at
  block granularity): the sink block, the last blocks, and the blocks the prompt's last
  SNAP_OBSERVE queries attend to most, summed over heads and layers. Decode then reads the kept
  blocks only. For dense attention (no window): the window already bounds a windowed sequence.

Sink blocks (the ones holding the first `sink_tokens`) are never dropped or quantized: the
attention mass they absorb is what keeps a windowed model stable.

Blocks are released to the BlockManager with their prefix-cache hash intact, so a later request
with the same prefix can still hit them until the allocator hands them out again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Self

import torch

from mainspring.engine.errors import InvalidRequestError

DEFAULT_SINK_TOKENS = 4
SNAP_OBSERVE = 32  # SnapKV's observation window: the prompt's last queries vote for the blocks to keep
# the longest span a request may name: past any KV cache, and past int64 one cannot even enter an index tensor
MAX_SPAN_TOKENS = 2**31 - 1


@dataclass(frozen=True)
class KVPolicy:
    window: int | None = None  # tokens attended besides sinks; None = dense
    sink_tokens: int = DEFAULT_SINK_TOKENS
    hot_tokens: int | None = None  # None = no cold tier
    snap_tokens: int | None = None  # None = keep the whole prompt

    @property
    def bounded(self) -> bool:
        """KV memory stays bounded: blocks behind the window are released as the sequence grows."""
        return self.window is not None

    @property
    def is_dense(self) -> bool:
        return self.window is None and self.hot_tokens is None and self.snap_tokens is None

    def sink_blocks(self, block_size: int) -> int:
        return -(-self.sink_tokens // block_size) if self.sink_tokens else 0

    def validate(self, block_size: int) -> "KVPolicy":
        for name, span in (("attention_window", self.window), ("kv_hot_tokens", self.hot_tokens),
                           ("kv_snap_tokens", self.snap_tokens)):
            if span is not None and span > MAX_SPAN_TOKENS:
                raise InvalidRequestError(f"{name} must be at most {MAX_SPAN_TOKENS} tokens")
        # Two blocks of margin: the newest block is being written, and mark_computed reads the
        # hash of the block before it when it registers a newly full block.
        if self.window is not None and self.window < 2 * block_size:
            raise InvalidRequestError(f"attention_window must be at least {2 * block_size} tokens (two KV blocks)")
        if self.hot_tokens is not None and self.hot_tokens < 2 * block_size:
            raise InvalidRequestError(f"kv_hot_tokens must be at least {2 * block_size} tokens (two KV blocks)")
        if self.snap_tokens is not None:
            if self.window is not None:
                raise InvalidRequestError("kv_snap_tokens applies to dense attention; drop attention_window "
                                          "(a window already bounds the KV)")
            if self.snap_tokens < SNAP_OBSERVE + 3 * block_size:
                raise InvalidRequestError(f"kv_snap_tokens must be at least {SNAP_OBSERVE + 3 * block_size} tokens")
        if not 0 <= self.sink_tokens <= 1024:
            raise InvalidRequestError("attention_sinks must be between 0 and 1024")
        return self

    def max_blocks(self, block_size: int, chunk_tokens: int) -> int | None:
        """Most hot blocks the sequence holds at once (None: grows with the sequence). A cold tier
        bounds them too, as long as its store has room (a full store leaves blocks hot)."""
        span = min(x for x in (self.window, self.hot_tokens, 1 << 62) if x is not None)
        if span == 1 << 62:
            return None
        return self.sink_blocks(block_size) + -(-(span + chunk_tokens) // block_size) + 1


@dataclass
class BlockPlan:
    """What to do with a sequence's blocks once `num_computed` tokens are in the cache."""

    drop: list[int]  # logical block indices to release entirely (hot or cold)
    demote: list[int]  # logical block indices to move from the hot pool to the cold store
    drop_to: int  # every block below this index is now released (the sequence's next cursor)
    demote_to: int  # every block below this is cold or released


def plan_blocks(policy: KVPolicy, block_table: list[int], cold: Mapping[int, int], num_computed: int,
                block_size: int, drop_from: int = 0, demote_from: int = 0) -> BlockPlan:
    """Blocks that left the window (drop) or the hot span (demote) since the cursors of the last
    plan, so each step looks at a block or two, not the whole table."""
    protected = policy.sink_blocks(block_size)
    drop_to, demote_to = drop_from, demote_from
    if policy.window is not None:
        # the next query sits at num_computed and reads keys >= num_computed - window + 1
        drop_to = max(drop_from, min(len(block_table), (num_computed - policy.window + 1) // block_size))
    if policy.hot_tokens is not None:
        demote_to = max(demote_from, min(len(block_table), (num_computed - policy.hot_tokens) // block_size))
    drop = [i for i in range(max(drop_from, protected), drop_to) if block_table[i] >= 0 or i in cold]
    demote = [i for i in range(max(demote_from, drop_to, protected), demote_to) if block_table[i] >= 0]
    return BlockPlan(drop, demote, drop_to, max(demote_to, drop_to))


def snap_plan(policy: KVPolicy, block_table: list[int], cold: Mapping[int, int], num_computed: int,
              scores: torch.Tensor, key_pos: torch.Tensor, block_size: int) -> list[int]:
    """SnapKV's eviction: the prompt blocks to release, given the attention mass `scores` that the
    prompt's last queries gave each key (at `key_pos`). Keeps the sink block, the blocks of the
    observation window and the partial last block, then the most-attended blocks up to the budget."""
    bs, budget = block_size, policy.snap_tokens
    assert budget is not None  # the runner snaps only sequences whose policy has snap_tokens
    held = [i for i in range(len(block_table)) if block_table[i] >= 0 or i in cold]
    mass = torch.zeros(len(block_table)).index_add_(0, key_pos // bs, scores)
    keep = set(range(policy.sink_blocks(bs))) | set(range(max(0, (num_computed - SNAP_OBSERVE) // bs),
                                                          len(block_table)))
    room = budget // bs - sum(1 for i in held if i in keep)
    ranked = sorted((i for i in held if i not in keep), key=lambda i: -float(mass[i]))
    return sorted(ranked[max(room, 0):])


@dataclass(frozen=True)
class KVPolicyConfig:
    """The engine's KV policy: every request's default, and the precision of the cold tier that
    kv_hot_tokens demotes into (None: no cold tier; a default with hot_tokens implies int8)."""

    default: KVPolicy = KVPolicy()
    cold_bits: int | None = None  # 8 | 4

    def __post_init__(self) -> None:
        if self.cold_bits is None and self.default.hot_tokens is not None:
            object.__setattr__(self, "cold_bits", 8)
        if self.cold_bits not in (None, 4, 8):
            raise ValueError("kv policy bits must be 8 or 4")

    @classmethod
    def parse(cls, text: str) -> Self | None:
        """The MAINSPRING_KV_POLICY syntax: "" / "dense" -> None; "window=1024,sinks=4,hot=256,bits=8"
        (also snap); or a JSON object of those keys."""
        text = text.strip()
        if text.lower() in ("", "off", "none", "dense"):
            return None
        if text.startswith("{"):
            options = dict(json.loads(text))
        else:
            options = {}
            for opt in filter(None, (o.strip() for o in text.split(","))):
                key, eq, val = opt.partition("=")
                if not eq:
                    raise ValueError(f"kv policy option {opt!r} must be key=value (window, sinks, hot, bits)")
                options[key.strip()] = int(val)
        unknown = set(options) - {"window", "sinks", "hot", "bits", "snap"}
        if unknown:
            raise ValueError(f"unknown kv policy option(s) {sorted(unknown)}; known: window, sinks, hot, bits, snap")
        default = KVPolicy(window=options.get("window"), sink_tokens=options.get("sinks", DEFAULT_SINK_TOKENS),
                           hot_tokens=options.get("hot"), snap_tokens=options.get("snap"))
        return cls(default, options.get("bits"))


def request_policy(default: KVPolicy, window: int | None, sinks: int | None, hot_tokens: int | None,
                   cold_available: bool, block_size: int, snap_tokens: int | None = None) -> KVPolicy | None:
    """The engine default overlaid with a request's own choices; 0 turns a feature off.
    Returns None for plain dense attention (the fast cascade path)."""
    p = default
    if window is not None:
        p = replace(p, window=window or None)
    if sinks is not None:
        p = replace(p, sink_tokens=sinks)
    if hot_tokens is not None:
        if hot_tokens and not cold_available:
            raise InvalidRequestError("kv_hot_tokens needs the engine's cold KV tier (MAINSPRING_KV_POLICY bits=8|4)")
        p = replace(p, hot_tokens=hot_tokens or None)
    if snap_tokens is not None:
        p = replace(p, snap_tokens=snap_tokens or None)
    if p.is_dense:
        return None
    return p.validate(block_size)
