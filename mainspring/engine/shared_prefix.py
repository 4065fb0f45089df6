"""Prefill chunks that share a cached prefix attend it together, then their own tokens, merged by log-sum-exp.

Agents on one system prompt arrive together: once the first has prefilled the prompt, each other one's chunk is
its own few tokens over that cached prefix. Chunk by chunk, each would read the prefix's K/V and run a masked
attention of a few query rows over it: 31 chunks of 62 rows over 1,550 keys took 70-83 ms a layer on AMD EPYC
(2 threads). Here the rows of every such chunk attend the shared prefix in one unmasked flash call (the whole
prefix precedes every query), each chunk attends its own part causally, and the two halves are merged by their
log-sum-exps, exactly: 58 ms. The prefix counts only the blocks every chunk shares and that every chunk has
already cached, so no query sits inside it.

The flash call is torch's own CPU kernel, which returns the log-sum-exp the merge needs
(`aten::_scaled_dot_product_flash_attention_for_cpu`); a torch without it attends chunk by chunk as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mainspring.engine import kv_slots

MIN_PREFIX_TOKENS = 256  # below this the per-chunk path is as fast, and simpler
FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


@dataclass
class SharedPrefix:
    prefix_slots: torch.Tensor  # [Lp] the shared blocks' slots
    prefix_start: int | None  # their first slot when they are consecutive (read as a view)
    segments: list[int]  # the prefill chunks (indices in AttentionMetadata.prefills) that share it
    own_slots: list[torch.Tensor]  # per chunk: the slots of its context after the prefix, its queries last


def find(rows: Sequence[tuple[list[int], int, int]], block_size: int) -> SharedPrefix | None:
    """rows: the step's prefill chunks, (block_table, start, num_tokens). The prefix that two or more chunks with
    cached context share, or None (fewer such chunks, a short prefix, or no flash kernel)."""
    cached = [i for i, (_, start, _) in enumerate(rows) if start > 0]
    if len(cached) < 2 or FLASH is None:
        return None
    first = rows[cached[0]][0]
    common = kv_slots.common_blocks([rows[i][0] for i in cached])
    prefix_len = min([common * block_size] + [rows[i][1] for i in cached])
    if prefix_len < MIN_PREFIX_TOKENS:
        return None
    own = [kv_slots.slots(rows[i][0], rows[i][1] + rows[i][2], block_size)[prefix_len:] for i in cached]
    return SharedPrefix(kv_slots.slots(first, prefix_len, block_size),
                        kv_slots.run_start(first, prefix_len, block_size), cached, own)


def attend(queries: list[torch.Tensor], k_cache: torch.Tensor, v_cache: torch.Tensor, shared: SharedPrefix,
           scale: float) -> list[torch.Tensor]:
    """Each chunk's attention output ([n, H, D] for its [n, H, D] queries, in `shared.segments` order)."""
    assert FLASH is not None  # find() offers no SharedPrefix without it
    q = torch.cat(queries)
    r, h, d = q.shape
    kvh = k_cache.shape[1]
    g = h // kvh
    # the prefix: the g query heads of a KV head, of every row, are the query rows of one attention per KV head
    kp, vp = (kv_slots.gather(c, shared.prefix_slots, shared.prefix_start).transpose(0, 1).unsqueeze(0)
              for c in (k_cache, v_cache))
    qg = q.view(r, kvh, g, d).transpose(0, 1).reshape(1, kvh, r * g, d)
    out_p, lse_p = FLASH(qg, kp, vp, 0.0, False, scale=scale)
    out_p = out_p.view(kvh, r, g, d).transpose(0, 1).reshape(r, h, d)
    lse_p = lse_p.view(kvh, r, g).transpose(0, 1).reshape(r, h)
    outs, row = [], 0
    for qs, own in zip(queries, shared.own_slots):
        n, s = qs.shape[0], own.numel()
        ko, vo = (kv_slots.gather(c, own).transpose(0, 1).unsqueeze(0).repeat_interleave(g, 1)
                  for c in (k_cache, v_cache))
        qh = qs.transpose(0, 1).unsqueeze(0)
        if s == n:  # the chunk is all of its own part: plain causal
            o, lse = FLASH(qh, ko, vo, 0.0, True, scale=scale)
        else:  # its own cached tokens come first: query i sits at own position s - n + i
            mask = torch.zeros(1, 1, n, s, dtype=qh.dtype)
            mask.masked_fill_(torch.arange(s)[None, :] > torch.arange(n)[:, None] + (s - n), float("-inf"))
            o, lse = FLASH(qh, ko, vo, 0.0, False, attn_mask=mask, scale=scale)
        o, lse = o.squeeze(0).transpose(0, 1), lse.squeeze(0).transpose(0, 1)  # [n, H, D], [n, H]
        outs.append(merge(out_p[row : row + n], lse_p[row : row + n], o, lse))
        row += n
    return outs


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over keys A and B together, exactly, from attention over each ([..., D] outputs and their
    [...] log-sum-exps of the scaled scores): each half weighted by its share of the softmax's denominator, B's
    being exp(lse_b) / (exp(lse_a) + exp(lse_b)) = sigmoid(lse_b - lse_a). Three ops: a decode step merges
    once per layer, where each op's dispatch costs more than its arithmetic."""
    w = torch.sigmoid(lse_b - lse_a).unsqueeze(-1)  # fp32: bf16 outputs are weighed in fp32 (no-op casts in fp32)
    return torch.lerp(out_a.to(w.dtype), out_b.to(w.dtype), w).to(out_a.dtype)
