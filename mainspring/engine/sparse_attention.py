"""Attention for sequences under a KV policy: sinks + sliding window, over hot and cold blocks.

Each such sequence's rows in a step (one decode token, a prefill chunk or a verified draft run)
form one SparseSegment. Its keys are the positions [lo, end) of the window (all of [0, end) when
there is no window), gathered from hot fp32 slots and dequantized cold blocks in position order,
plus the sink tokens [0, S) when the window has moved past them.

Positions, as in StreamingLLM: a model has never seen a query thousands of tokens past the sink
tokens, so the sinks are attended as if they sat right before the window (cache positions, not
text positions). Keys are stored already rotated by RoPE at their text position, so instead of
re-rotating the sink keys per query we rotate the query back by the same distance: q·R(d)k =
(R(-d)q)·k. Window keys keep their true relative distances (< window), which RoPE only sees.

Long chunks are split into query tiles, each reading only the key range its window covers: the
prefill is block-sparse, O(n · window) instead of O(n²).

SnapKV (arXiv 2404.14469): on a prompt's last chunk a segment can `observe` its last rows'
attention per key: summed over those rows, the most attentive head's sum, summed over layers. The
policy then keeps the prompt blocks those queries read. The max over heads, not the sum, is what
lets a few retrieval heads outvote the many heads that only look at the sinks and recent tokens (a
summed vote ranked a needle's block 11th of 40; the max ranks it first after the recent blocks).
Blocks it evicts leave holes; the sequence then only decodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from mainspring.engine.kv_policy import KVPolicy
from mainspring.engine.transfers import upload

QUERY_TILE = 256
ColdLoader = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # cold ids -> (K, V) [n*bs, KVH, D]


@dataclass
class Tile:
    q0: int  # query rows [q0, q1) of the segment
    q1: int
    k0: int  # key rows [k0, k1) of the gathered keys
    k1: int
    mask: torch.Tensor | None  # [q, k] bool, True = attend; None = every key
    sink_mask: torch.Tensor | None = None  # [q, S] bool
    cos: torch.Tensor | None = None  # [q, 1, D] rotation of the query for the sinks
    sin: torch.Tensor | None = None


@dataclass
class SparseSegment:
    q_start: int  # first row in the step's flat token batch
    q_len: int
    runs: list[tuple[str, torch.Tensor, int, int]]  # (kind "hot"|"cold", slots|cold ids, skip, take)
    tiles: list[Tile] = field(default_factory=list)
    sink_slots: torch.Tensor | None = None
    observe: int = 0  # SnapKV: vote with the attention of the last `observe` rows into `scores`
    scores: torch.Tensor | None = None  # [C] per gathered key: max over heads of the rows' sum, + over layers
    key_pos: torch.Tensor | None = None  # [C] text position of each gathered key (when observing)

    def to(self, device: torch.device) -> "SparseSegment":
        """This segment's index tensors, masks, rotations and SnapKV votes on `device` (built on the CPU); the key
        positions stay on the host, where the votes are counted."""
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else upload(t, device)

        tiles = [Tile(t.q0, t.q1, t.k0, t.k1, move(t.mask), move(t.sink_mask), move(t.cos), move(t.sin))
                 for t in self.tiles]
        runs = [(kind, upload(ids, device), skip, take) for kind, ids, skip, take in self.runs]
        return SparseSegment(self.q_start, self.q_len, runs, tiles, move(self.sink_slots), self.observe,
                             move(self.scores), self.key_pos)


def build_segment(q_start: int, block_table: list[int], cold: dict[int, int], start: int, num_tokens: int,
                  policy: KVPolicy, block_size: int, inv_freq: torch.Tensor, observe: int = 0) -> SparseSegment:
    """Metadata for queries at positions [start, start + num_tokens) of one sequence."""
    end, bs, w = start + num_tokens, block_size, policy.window
    lo = max(0, start - w + 1) if w is not None else 0
    runs: list[tuple[str, torch.Tensor, int, int]] = []
    kind: str | None = None
    ids: list[int] = []
    skip = take = 0
    holes = False
    key_pos: list[int] = []
    for b in range(lo // bs, (end - 1) // bs + 1):
        first, last = max(lo, b * bs), min(end, (b + 1) * bs)
        if block_table[b] >= 0:
            k, unit = "hot", list(range(block_table[b] * bs + first - b * bs, block_table[b] * bs + last - b * bs))
        elif b in cold:
            k, unit = "cold", [cold[b]]
        elif policy.snap_tokens is not None:  # evicted by SnapKV: not attended any more
            holes = True
            if kind is not None:
                runs.append((kind, torch.tensor(ids, dtype=torch.long), skip, take))
            kind, ids, take = None, [], 0
            continue
        else:
            raise RuntimeError(f"KV block {b} was released but position {first} is still attended")
        if observe:
            key_pos.extend(range(first, last))
        if k != kind and kind is not None:
            runs.append((kind, torch.tensor(ids, dtype=torch.long), skip, take))
            ids, take = [], 0
        if k != kind:
            skip = first - b * bs if k == "cold" else 0
        kind = k
        ids.extend(unit)
        take += last - first
    if kind is not None:
        runs.append((kind, torch.tensor(ids, dtype=torch.long), skip, take))
    seg = SparseSegment(q_start, num_tokens, runs)
    if holes:
        if num_tokens != 1 or w is not None:
            raise RuntimeError("a sequence with evicted KV blocks can only decode, one token a step")
        seg.tiles.append(Tile(0, 1, 0, sum(r[3] if r[0] == "cold" else len(r[1]) for r in runs), None))
        return seg
    if observe:
        seg.observe, seg.key_pos = min(observe, num_tokens), torch.tensor(key_pos)
        seg.scores = torch.zeros(len(key_pos))
    sinks = min(policy.sink_tokens, end) if w is not None else 0
    if w is not None and sinks and end - w > 0:  # the window of the last query has left position 0
        seg.sink_slots = torch.tensor([block_table[p // bs] * bs + p % bs for p in range(sinks)])
    for q0 in range(0, num_tokens, QUERY_TILE):
        seg.tiles.append(_tile(q0, min(num_tokens, q0 + QUERY_TILE), start, lo, w, seg.sink_slots is not None,
                               sinks, inv_freq))
    return seg


def _tile(q0: int, q1: int, start: int, lo: int, w: int | None, has_sinks: bool, sinks: int,
          inv_freq: torch.Tensor) -> Tile:
    qpos = torch.arange(start + q0, start + q1)
    kmin = max(lo, start + q0 - w + 1) if w is not None else 0
    kpos = torch.arange(kmin, start + q1)
    mask = kpos[None, :] <= qpos[:, None]
    if w is not None:
        mask &= kpos[None, :] > qpos[:, None] - w
    tile = Tile(q0, q1, kmin - lo, start + q1 - lo, None if bool(mask.all()) else mask)
    if has_sinks:
        assert w is not None  # sinks exist only under a window
        win_lo = (qpos - w + 1).clamp(min=0)  # first window position of each query
        tile.sink_mask = torch.arange(sinks)[None, :] < win_lo[:, None]
        # sinks sit right before each query's window: shift by max(0, window start - S)
        shift = (win_lo - sinks).clamp(min=0).double()
        ang = -shift[:, None] * inv_freq.double()[None, :]
        emb = torch.cat([ang, ang], dim=-1)
        tile.cos, tile.sin = emb.cos().float().unsqueeze(1), emb.sin().float().unsqueeze(1)
    return tile


def _gather(seg: SparseSegment, k_cache: torch.Tensor, v_cache: torch.Tensor,
            cold: ColdLoader | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The segment's keys and values in position order, fp32: hot slots as they are (cast from a bf16 or fp16
    cache), cold blocks dequantized (K and V of a run in one load)."""
    ks, vs = [], []
    for kind, ids, skip, take in seg.runs:
        if kind == "hot":
            ks.append(k_cache[ids].float())
            vs.append(v_cache[ids].float())
        else:
            if cold is None:
                raise RuntimeError("cold KV blocks but no cold store")
            k, v = cold(ids)
            ks.append(k[skip : skip + take])
            vs.append(v[skip : skip + take])
    if len(ks) == 1:
        return ks[0], vs[0]
    return torch.cat(ks), torch.cat(vs)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def sparse_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cold: ColdLoader | None,
                     seg: SparseSegment, scale: float) -> torch.Tensor:
    """q: [n, H, D] for the segment's rows; returns [n, H, D] in q's dtype. The segment attends in fp32 whatever
    the cache's precision: cold blocks come back fp32, and only the window's keys are cast."""
    dtype, q = q.dtype, q.float()
    k, v = _gather(seg, k_cache, v_cache, cold)
    n, h, d = q.shape
    kvh = k.shape[1]
    g = h // kvh
    out = torch.empty_like(q)
    ks = vs = None
    if seg.sink_slots is not None:
        ks = k_cache[seg.sink_slots].float().permute(1, 2, 0)  # [KVH, D, S]
        vs = v_cache[seg.sink_slots].float().transpose(0, 1)  # [KVH, S, D]
    kT, vT = k.permute(1, 2, 0), v.transpose(0, 1)  # [KVH, D, C], [KVH, C, D]
    for t in seg.tiles:
        qt = q[t.q0 : t.q1] * scale
        m = t.q1 - t.q0
        # GQA as one batched matmul per KV head: its G query heads x m rows share the keys
        # (broadcasting K over G instead would copy it G times)
        qg = qt.view(m, kvh, g, d).permute(1, 2, 0, 3).reshape(kvh, g * m, d)
        s = torch.bmm(qg, kT[:, :, t.k0 : t.k1])  # [KVH, G*m, c]
        if t.mask is not None:
            s.view(kvh, g, m, -1).masked_fill_(~t.mask, float("-inf"))
        num_sinks = 0
        if ks is not None:
            assert t.cos is not None and t.sin is not None and t.sink_mask is not None  # set with the sinks
            qs = (qt * t.cos + _rotate_half(qt) * t.sin).view(m, kvh, g, d).permute(1, 2, 0, 3).reshape(kvh, g * m, d)
            ss = torch.bmm(qs, ks)
            ss.view(kvh, g, m, -1).masked_fill_(~t.sink_mask, float("-inf"))
            num_sinks = ss.shape[-1]
            s = torch.cat([ss, s], dim=-1)
        p = torch.softmax(s, dim=-1)
        if seg.scores is not None and t.q1 > seg.q_len - seg.observe:
            r0 = max(0, seg.q_len - seg.observe - t.q0)
            seg.scores[t.k0 : t.k1] += p.view(kvh, g, m, -1)[:, :, r0:, num_sinks:].sum(dim=2).amax(dim=(0, 1))
        o = torch.bmm(p[..., num_sinks:], vT[:, t.k0 : t.k1])  # [KVH, G*m, D]
        if num_sinks and vs is not None:
            o += torch.bmm(p[..., :num_sinks], vs)
        out[t.q0 : t.q1] = o.view(kvh, g, m, d).permute(2, 0, 1, 3).reshape(m, h, d)
    return out.to(dtype)
