"""Perplexity of a long text through the engine's own KV path (dense, sinks + window, cold tiers).

The text is fed as one sequence in chunks, exactly as a chunked prefill runs: the same block
manager, model runner, sparse attention and KV policy (blocks released behind the window, cold
blocks quantized after each chunk). Every chunk's logits are kept, so each token is scored with the
context the policy left it: a sliding window scores token i against its window, not the full past.

With a cold tier, keys become cold a chunk at a time rather than a token at a time, so a chunk of
C tokens sees up to C more hot tokens than a decode would; keep C well under hot_tokens.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

import torch
from rich.progress import Progress

from mainspring.engine.kv_policy import KVPolicy
from mainspring.engine.model_runner import kv_bytes_per_block
from mainspring.engine.params import SamplingParams
from mainspring.engine.scheduler import ScheduledSeq
from mainspring.engine.sequence import Sequence


@dataclass
class PerplexityResult:
    nll: list[float]  # per scored token (token i+1 given tokens <= i)
    top1: list[int] = field(default_factory=list)  # the most likely next token at each scored position
    peak_hot_blocks: int = 0
    peak_cold_blocks: int = 0
    kv_bytes_peak: int = 0  # hot blocks at fp32 + cold blocks at their quantized size
    kv_bytes_end: int = 0  # the same once the whole text is in
    details: dict = field(default_factory=dict)

    def ppl(self, start: int = 0, end: int | None = None) -> float:
        """Perplexity over scored tokens [start, end)."""
        part = self.nll[start:end]
        return math.exp(sum(part) / len(part)) if part else float("nan")


@torch.inference_mode()
def perplexity(engine, token_ids: list[int], policy: KVPolicy | None = None, chunk: int = 256,
               progress: bool = False) -> PerplexityResult:
    """Score `token_ids` through `engine` (an LLMEngine with no requests running) under `policy`."""
    if engine.has_unfinished():
        raise RuntimeError("perplexity needs an idle engine: it uses the engine's KV pool directly")
    bm, runner, bs = engine.block_manager, engine.runner, engine.config.block_size
    if policy is not None:
        policy = policy.validate(bs)
        if policy.hot_tokens is not None and runner.cold_store is None:
            raise ValueError("a policy with hot_tokens needs an engine built with a cold tier (kv_policy bits)")
    # a salt of its own: no prefix-cache hit in either direction, so every token is computed here
    seq = Sequence("perplexity", list(token_ids), SamplingParams(max_tokens=1), kv_policy=policy,
                   cache_salt=f"perplexity-{uuid.uuid4()}")
    chunked = policy is not None  # blocks chunk by chunk, as the scheduler gives them
    if not bm.can_allocate(seq, chunk if chunked else None):
        raise RuntimeError("the KV pool is too small for this text; enlarge kv_cache_mb or use a window")
    bm.allocate(seq, chunk if chunked else None)
    out = PerplexityResult([])
    cold_bytes = runner.cold_store.bytes_per_token() * bs if runner.cold_store is not None else 0
    hot_bytes = kv_bytes_per_block(runner.model, bs)
    n = len(token_ids)
    try:
        with Progress(disable=not progress, transient=True) as bar:
            task = bar.add_task("scoring", total=n - 1)
            while seq.num_computed_tokens < n - 1:
                start = seq.num_computed_tokens
                take = min(chunk, n - 1 - start)
                if not bm.can_append(seq, upto=start + take if chunked else None):
                    raise RuntimeError("the KV pool is too small for this text; enlarge kv_cache_mb or use a window")
                bm.may_append(seq, upto=start + take if chunked else None)
                logits = runner.score(ScheduledSeq(seq, take))
                targets = torch.tensor(token_ids[start + 1 : start + take + 1], device=logits.device)
                nll = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")
                out.nll.extend(nll.tolist())
                out.top1.extend(logits.argmax(-1).tolist())
                seq.num_computed_tokens = start + take
                bm.mark_computed(seq, seq.num_computed_tokens)
                runner.apply_kv_policy([seq], bm)
                hot = sum(1 for b in seq.block_table if b >= 0)
                out.peak_hot_blocks = max(out.peak_hot_blocks, hot)
                out.peak_cold_blocks = max(out.peak_cold_blocks, len(seq.cold_blocks))
                out.kv_bytes_end = int(hot * hot_bytes + len(seq.cold_blocks) * cold_bytes)
                out.kv_bytes_peak = max(out.kv_bytes_peak, out.kv_bytes_end)
                bar.advance(task, take)
    finally:
        bm.deallocate(seq)
    return out
