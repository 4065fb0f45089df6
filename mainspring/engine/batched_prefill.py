"""A step's prefill chunks attended in one padded call, for devices where each call costs a launch sequence.

On the CPU every chunk attends on its own (torch's flash kernel over its context, or the shared-prefix kernel for
chunks over one cached prefix: engine/shared_prefix.py), and the cost is the arithmetic. On a GPU the cost of a
small chunk is the dozen kernel launches around its SDPA call (the mask, the gathers, the transposes): the agent
workload's step of ten 50-token chunks over a 1,500-token system prompt is 30 layers x 10 chunks of launches that
each run for microseconds. Here the chunks are padded into one batch per step instead:

  queries  [B, Q, H, D]   the chunks' rows of the flat batch, padded with each chunk's first row
  keys     [B, L, KVH, D] each chunk's whole context (cached prefix + its own rows, written before attention)
                          gathered from the paged cache, padded with the chunk's first slot
  mask     [B, 1, Q, L]   causal at each chunk's offset, padding keys off; a padding query attends key 0 only
                          (a fully masked row would be NaN), and its output is dropped

so a layer's prefill attention is one gather per K and V and one SDPA call, whatever the number of chunks. The
index tensors are built once per step on the host (`batch_prefills`, from the same PrefillSegments the per-chunk
path reads) and sent with the rest of the step's metadata; a step whose padding would exceed MAX_PADDED elements
of mask keeps the per-chunk path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from mainspring.engine import kv_slots
from mainspring.engine.transfers import upload

if TYPE_CHECKING:
    from mainspring.engine.attention import PrefillSegment

MAX_PADDED = 1 << 22  # mask elements (B * Q * L) above which the chunks attend one by one: SDPA with a mask and
# grouped KV heads runs the math path, whose scores are B * H * Q * L values (at the bound and 9 heads, 151 MB in fp32)


@dataclass
class BatchedPrefill:
    """Every prefill chunk of a step, padded."""

    q_rows: torch.Tensor  # [B, Q] rows of the flat batch
    q_valid: torch.Tensor  # [N] where the chunks' real rows are in [B * Q] (an index, not a mask: selecting by a
    # boolean mask on a GPU makes the host wait to learn how many rows it keeps, at every layer)
    out_rows: torch.Tensor  # [N] the flat rows of those entries, in their order
    ctx_slots: torch.Tensor  # [B, L] cache slots
    mask: torch.Tensor  # [B, 1, Q, L] bool, True = attend

    def to(self, device: torch.device) -> "BatchedPrefill":
        return BatchedPrefill(*(upload(t, device) for t in (self.q_rows, self.q_valid, self.out_rows, self.ctx_slots,
                                                            self.mask)))


def batch_prefills(prefills: list[PrefillSegment], slot_mapping: torch.Tensor) -> BatchedPrefill | None:
    """The padded batch of these chunks (host tensors), or None for fewer than two or too much padding."""
    if len(prefills) < 2:
        return None
    b, q, ctx = len(prefills), max(p.q_len for p in prefills), max(p.ctx_len for p in prefills)
    if b * q * ctx > MAX_PADDED:
        return None
    q_rows = torch.empty(b, q, dtype=torch.long)
    ctx_slots = torch.empty(b, ctx, dtype=torch.long)
    qi, kj = torch.arange(q), torch.arange(ctx)
    q_valid = qi[None, :] < torch.tensor([p.q_len for p in prefills])[:, None]
    mask = torch.zeros(b, 1, q, ctx, dtype=torch.bool)
    for i, p in enumerate(prefills):
        rows = torch.arange(p.q_start, p.q_start + p.q_len)
        q_rows[i] = rows[0]
        q_rows[i, : p.q_len] = rows
        own = p.ctx_slots if p.ctx_slots is not None else slot_mapping[p.q_start : p.q_start + p.q_len]
        ctx_slots[i] = own[0]
        ctx_slots[i, : p.ctx_len] = own
        offset = p.ctx_len - p.q_len  # query r sits at position offset + r
        mask[i, 0, : p.q_len] = kj[None, :] <= (qi[: p.q_len, None] + offset)
        mask[i, 0, p.q_len :, 0] = True
    return BatchedPrefill(q_rows, q_valid.flatten().nonzero().squeeze(1), q_rows[q_valid], ctx_slots, mask)


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: BatchedPrefill,
           scale: float) -> torch.Tensor:
    """q: the step's flat [T, H, D]; returns the batched chunks' outputs [N, H, D] for `batch.out_rows`."""
    qp = q[batch.q_rows].transpose(1, 2)  # [B, H, Q, D]
    kp, vp = (kv_slots.gather(c, batch.ctx_slots).transpose(1, 2) for c in (k_cache, v_cache))  # [B, KVH, L, D]
    o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=batch.mask, scale=scale, enable_gqa=True)
    return o.transpose(1, 2).flatten(0, 1)[batch.q_valid]
