"""Paged attention: write new K/V into cache slots, attend through block tables (CPU, and CUDA through the same
torch ops: the metadata is built on the host and moved to the device in one `to` per step).

One engine step mixes decode tokens (one query each) and prefill chunks. Decode rows share a
"cascade" path: the KV blocks that every decoding sequence has in common (a shared system prompt
served from the prefix cache) are gathered once and attended by all queries in a single matmul;
only each sequence's own tail is gathered per row. Without this, 32 agents over a 1,500-token
prompt would copy ~80 MB of K/V per layer per step. Context held in consecutive blocks (a prompt
allocated on a fresh cache, a shared prefix, a chunked prefill's earlier chunks) is not gathered
at all: it is read through a slice of the cache, a view.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from mainspring.engine.kv_policy import KVPolicy
from mainspring.engine import batched_prefill, kv_slots, shared_prefix
from mainspring.engine.batched_prefill import BatchedPrefill, batch_prefills
from mainspring.engine.sparse_attention import ColdLoader, SparseSegment, build_segment, sparse_attention
from mainspring.engine.transfers import upload

# (block_table, cold blocks, start, num_tokens, policy, rows to observe for SnapKV)
SparseRow = tuple[list[int], dict[int, int], int, int, KVPolicy, int]


@dataclass
class PrefillSegment:
    q_start: int  # first row of this chunk in the step's flat token batch
    q_len: int
    ctx_len: int  # tokens attended, cached context + this chunk
    ctx_slots: torch.Tensor | None  # [ctx_len] cache slots; None when the chunk is the whole context
    ctx_start: int | None = None  # the first slot when those slots are one consecutive run (read as a view)


@dataclass
class DecodeBatch:
    num_seqs: int  # decode rows are the first num_seqs rows of the flat batch
    prefix_slots: torch.Tensor  # [Lp] slots shared by every decode row (may be empty)
    prefix_start: int | None  # the first of them when they are one consecutive run (read as a view)
    suffix_slots: torch.Tensor  # [B, Ls] per-row tail slots, padded with a valid slot
    suffix_mask: torch.Tensor | None  # [B, 1, 1, Ls] additive mask (0 / -inf); None if no padding


@dataclass
class StaticDecode:
    """A decode batch in fixed shapes, the form a captured CUDA graph replays (engine/decode_graphs.py): every row
    attends its whole context through a [B, N] block table, padded with a scratch block and masked by its length.
    No prefix is shared and nothing depends on the host: the metadata lives in the graph's input buffers."""

    block_tables: torch.Tensor  # [B, N] block ids, a row's unused entries the scratch block
    ctx_lens: torch.Tensor  # [B] tokens each row attends (its new token included); 1 for a padding row
    block_size: int
    pad_slot: int  # a slot that always holds finite values (the scratch block's first), read where masked


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is written
    decode: DecodeBatch | None = None
    prefills: list[PrefillSegment] = field(default_factory=list)
    # sequences under a KV policy (window + sinks, cold tiers): their own gather and masks
    sparse: list[SparseSegment] = field(default_factory=list)
    # prefill chunks over one cached prefix (agents on a shared system prompt): attended together
    shared: shared_prefix.SharedPrefix | None = None
    # a decode-only step in fixed shapes (CUDA graphs): every row is a decode row, attended by static_decode
    static: StaticDecode | None = None
    # off the CPU: the prefill chunks padded into one attention call per layer (engine/batched_prefill.py)
    batched: BatchedPrefill | None = None
    # the step's largest position, known on the host (RoPE's table is grown to it without reading the device)
    max_position: int | None = None

    @classmethod
    def build(
        cls,
        decode_rows: list[tuple[list[int], int]],
        prefill_rows: list[tuple[list[int], int, int]],
        block_size: int,
        sparse_rows: Sequence[SparseRow] = (),
        inv_freq: torch.Tensor | None = None,
    ) -> "AttentionMetadata":
        """decode_rows: (block_table, ctx_len); prefill_rows: (block_table, start, num_tokens);
        sparse_rows: (block_table, cold blocks, start, num_tokens, policy, rows to observe for SnapKV),
        RoPE's inv_freq needed.

        Rows are laid out decode first, then prefill chunks, then sparse rows, in the order given.
        """
        slots: list[torch.Tensor] = []
        decode = None
        if decode_rows:
            decode = _build_decode(decode_rows, block_size)
            slots.append(torch.tensor([kv_slots.slot(bt, n - 1, block_size) for bt, n in decode_rows]))
        prefills = []
        q_start = len(decode_rows)
        for block_table, start, num in prefill_rows:
            ctx_len = start + num
            ctx_slots = kv_slots.slots(block_table, ctx_len, block_size)
            slots.append(ctx_slots[start:])
            prefills.append(PrefillSegment(q_start, num, ctx_len, ctx_slots if start else None,
                                           kv_slots.run_start(block_table, ctx_len, block_size) if start else None))
            q_start += num
        sparse = []
        for block_table, cold, start, num, policy, *observe in sparse_rows:
            assert inv_freq is not None, "sparse rows need RoPE's inv_freq"
            slots.append(torch.tensor([kv_slots.slot(block_table, p, block_size) for p in range(start, start + num)]))
            sparse.append(build_segment(q_start, block_table, cold, start, num, policy, block_size, inv_freq,
                                        *observe))
            q_start += num
        ends = [n - 1 for _, n in decode_rows] + [start + num - 1 for _, start, num in prefill_rows] + \
            [row[2] + row[3] - 1 for row in sparse_rows]
        return cls(torch.cat(slots) if slots else torch.empty(0, dtype=torch.long), decode, prefills, sparse,
                   shared_prefix.find(prefill_rows, block_size), max_position=max(ends, default=None))

    def to(self, device: torch.device) -> "AttentionMetadata":
        """This step's metadata on `device` (itself on the CPU). The shared-prefix path calls the CPU's flash
        kernel, so on another device the prefill chunks are padded into one call (batched_prefill.py) or, when
        that would pad too much, attend one by one; sparse rows (KV policies) move their index tensors, masks and
        rotations (their SnapKV votes stay on the device until the step is over)."""
        if device.type == "cpu":
            return self
        batched = batch_prefills(self.prefills, self.slot_mapping)
        d = self.decode
        decode = None if d is None else DecodeBatch(
            d.num_seqs, upload(d.prefix_slots, device), d.prefix_start, upload(d.suffix_slots, device),
            None if d.suffix_mask is None else upload(d.suffix_mask, device))
        prefills = [PrefillSegment(p.q_start, p.q_len, p.ctx_len,
                                   None if p.ctx_slots is None else upload(p.ctx_slots, device), p.ctx_start)
                    for p in self.prefills]
        return AttentionMetadata(upload(self.slot_mapping, device), decode, prefills,
                                 [sp.to(device) for sp in self.sparse], None,
                                 batched=None if batched is None else batched.to(device),
                                 max_position=self.max_position)


def _build_decode(rows: list[tuple[list[int], int]], block_size: int) -> DecodeBatch:
    first = rows[0][0]
    prefix_len = min([kv_slots.common_blocks([bt for bt, _ in rows]) * block_size] + [n for _, n in rows])
    prefix_slots = kv_slots.slots(first, prefix_len, block_size)
    tails = [kv_slots.slots(bt, n, block_size)[prefix_len:] for bt, n in rows]
    width = max(len(t) for t in tails)
    suffix = torch.empty(len(rows), width, dtype=torch.long)
    mask = None
    if any(len(t) != width for t in tails):
        mask = torch.zeros(len(rows), 1, 1, width)
    for i, t in enumerate(tails):
        suffix[i, : len(t)] = t
        if len(t) < width:
            # pad with a real slot so V never holds uninitialised memory (0 * NaN = NaN)
            suffix[i, len(t) :] = t[0] if len(t) else prefix_slots[0]
            assert mask is not None  # made above whenever a tail is short
            mask[i, 0, 0, len(t) :] = float("-inf")
    return DecodeBatch(len(rows), prefix_slots, kv_slots.run_start(first, prefix_len, block_size), suffix, mask)


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,
    kv: tuple,  # (k_cache, v_cache) [num_slots, KVH, D], + this layer's cold-store loader when tiered
    meta: AttentionMetadata,
    scale: float,
    kv_written: bool = False,  # k and v are in the cache at meta.slot_mapping already (native_ops.rope_write_kv)
) -> torch.Tensor:
    k_cache, v_cache = kv[0], kv[1]
    cold: ColdLoader | None = kv[2] if len(kv) > 2 else None
    if not kv_written:
        k_cache.index_copy_(0, meta.slot_mapping, k)
        v_cache.index_copy_(0, meta.slot_mapping, v)
    if meta.static is not None:
        return _static_decode_attention(q, k_cache, v_cache, meta.static, scale)
    out = torch.empty_like(q)
    if meta.decode is not None:
        b = meta.decode.num_seqs
        out[:b] = _decode_attention(q[:b], k_cache, v_cache, meta.decode, scale)
    together = set(meta.shared.segments) if meta.shared is not None else set()
    if meta.shared is not None:
        segs = [meta.prefills[i] for i in meta.shared.segments]
        outs = shared_prefix.attend([q[s.q_start : s.q_start + s.q_len] for s in segs], k_cache, v_cache,
                                    meta.shared, scale)
        for seg, o in zip(segs, outs):
            out[seg.q_start : seg.q_start + seg.q_len] = o
    if meta.batched is not None:  # every prefill chunk, in one call
        out[meta.batched.out_rows] = batched_prefill.attend(q, k_cache, v_cache, meta.batched, scale)
    for i, seg in enumerate(meta.prefills if meta.batched is None else ()):
        rows = slice(seg.q_start, seg.q_start + seg.q_len)
        if i in together:
            continue
        if seg.ctx_slots is None:
            out[rows] = _prefill_attention(q[rows], k[rows], v[rows], scale, offset=0)
        else:
            kc, vc = (kv_slots.gather(c, seg.ctx_slots, seg.ctx_start) for c in (k_cache, v_cache))
            out[rows] = _prefill_attention(q[rows], kc, vc, scale, offset=seg.ctx_len - seg.q_len)
    for sp in meta.sparse:
        rows = slice(sp.q_start, sp.q_start + sp.q_len)
        out[rows] = sparse_attention(q[rows], k_cache, v_cache, cold, sp, scale)
    return out


def _prefill_attention(q, k, v, scale: float, offset: int) -> torch.Tensor:
    # [1, H, Q, D] x [1, KVH, C, D]; query i sits at absolute position offset + i
    qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    if offset == 0:
        # the KV heads repeated for each query head: torch's flash kernel on CPU is a quarter faster without
        # enable_gqa (AMD EPYC, 2,000 tokens, 9 heads over 3: 40 vs 53 ms per layer)
        g = qh.shape[1] // kh.shape[1]
        kh, vh = kh.repeat_interleave(g, 1), vh.repeat_interleave(g, 1)
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
    else:
        qlen, clen = q.shape[0], k.shape[0]
        mask = torch.arange(clen, device=q.device)[None, :] <= (torch.arange(qlen, device=q.device)[:, None] + offset)
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True)
    return o.squeeze(0).transpose(0, 1)


def _decode_attention(q, k_cache, v_cache, d: DecodeBatch, scale: float) -> torch.Tensor:
    if q.device.type == "cpu" and shared_prefix.FLASH is not None:
        return _decode_attention_flash(q, k_cache, v_cache, d, scale)
    b, h, dim = q.shape
    kvh = k_cache.shape[1]
    g = h // kvh
    qg = q.view(b, kvh, g, dim) * scale  # GQA: the g query heads of a KV head share its keys
    lp, ls = d.prefix_slots.numel(), d.suffix_slots.shape[1]
    # scores are laid out KV head first, [KVH, B, G, L]: the prefix's are one matmul per KV head over every
    # row's queries, and its probabilities feed the next matmul as a strided view, never copied
    scores = []
    if lp:
        kp = kv_slots.gather(k_cache, d.prefix_slots, d.prefix_start).permute(1, 2, 0)  # [KVH, D, Lp]
        q_flat = qg.transpose(0, 1).reshape(kvh, b * g, dim)
        scores.append(torch.bmm(q_flat, kp).view(kvh, b, g, lp))
    if ls:
        ks = kv_slots.gather(k_cache, d.suffix_slots).permute(0, 2, 3, 1)  # [B, KVH, D, Ls]
        ss = torch.matmul(qg, ks)  # [B, KVH, G, Ls]
        if d.suffix_mask is not None:
            ss = ss + d.suffix_mask.to(ss.dtype)
        scores.append(ss.transpose(0, 1))
    # softmax in fp32 in every precision (bf16 keeps 8 bits of mantissa), the probabilities back in the cache's
    probs = torch.softmax(torch.cat(scores, dim=-1) if len(scores) > 1 else scores[0], dim=-1,
                          dtype=torch.float32).to(q.dtype)  # [KVH, B, G, L]
    out = None
    if lp:
        vp = kv_slots.gather(v_cache, d.prefix_slots, d.prefix_start).transpose(0, 1)  # [KVH, Lp, D]
        out = torch.bmm(probs[..., :lp].reshape(kvh, b * g, lp), vp).view(kvh, b, g, dim).transpose(0, 1)
    if ls:
        vs = kv_slots.gather(v_cache, d.suffix_slots).transpose(1, 2)  # [B, KVH, Ls, D]
        tail = torch.matmul(probs[..., lp:].transpose(0, 1), vs)
        out = tail if out is None else out + tail
    assert out is not None  # a decode row attends at least its own token
    return out.reshape(b, h, dim)


def _decode_attention_flash(q, k_cache, v_cache, d: DecodeBatch, scale: float) -> torch.Tensor:
    """The same attention through torch's CPU flash kernel: the prefix is one call whose queries are every row's
    (per KV head, the g query heads of each row are its query rows), each row's tail a batched call over the
    gathered tail read in place (the [B, Ls, KVH, D] gather as [B, KVH, Ls, D], no copy), the two merged by their
    log-sum-exps. The matmul path above copies each gathered tail into matmul's layout and writes out every
    score; at 32 rows over a 1,500-token prefix and ~100-token tails this is ~1.3x faster per layer (AMD EPYC)."""
    flash = shared_prefix.FLASH
    assert flash is not None  # dispatched here only when torch has the kernel
    b, h, dim = q.shape
    kvh = k_cache.shape[1]
    g = h // kvh
    qg = q.view(b, kvh, g, dim)
    lp, ls = d.prefix_slots.numel(), d.suffix_slots.shape[1]
    parts = []
    if lp:
        kp, vp = (kv_slots.gather(c, d.prefix_slots, d.prefix_start).transpose(0, 1).unsqueeze(0)
                  for c in (k_cache, v_cache))  # [1, KVH, Lp, D]
        o, lse = flash(qg.transpose(0, 1).reshape(1, kvh, b * g, dim), kp, vp, 0.0, False, scale=scale)
        parts.append((o.view(kvh, b, g, dim).transpose(0, 1), lse.view(kvh, b, g).transpose(0, 1)))
    if ls:
        ks, vs = (kv_slots.gather(c, d.suffix_slots).transpose(1, 2) for c in (k_cache, v_cache))  # [B, KVH, Ls, D]
        mask = None if d.suffix_mask is None else d.suffix_mask.to(q.dtype)
        parts.append(flash(qg, ks, vs, 0.0, False, attn_mask=mask, scale=scale))
    assert parts  # a decode row attends at least its own token
    out = parts[0][0] if len(parts) == 1 else shared_prefix.merge(*parts[0], *parts[1])
    return out.reshape(b, h, dim)


def _static_decode_attention(q, k_cache, v_cache, st: StaticDecode, scale: float) -> torch.Tensor:
    """Each row over its whole context, gathered through its padded block table: shapes fixed by [B, N], values
    only on the device, so a CUDA graph can capture it. Per KV head, a row's g query heads are the query rows of
    one SDPA call (no key is repeated for grouped-query attention)."""
    b, h, dim = q.shape
    kvh = k_cache.shape[1]
    bs = st.block_size
    c = st.block_tables.shape[1] * bs
    slots = (st.block_tables[:, :, None] * bs + torch.arange(bs, device=q.device)).view(b, c)
    attended = torch.arange(c, device=q.device)[None, :] < st.ctx_lens[:, None]  # [B, C]
    # a masked key still meets a zero weight, and 0 * NaN = NaN: slots past a row's length (never written, or
    # garbage) are read from the pad slot instead
    slots = torch.where(attended, slots, st.pad_slot).view(b * c)
    k, v = (torch.index_select(cache, 0, slots).view(b, c, kvh, dim).transpose(1, 2) for cache in (k_cache, v_cache))
    out = F.scaled_dot_product_attention(q.view(b, kvh, h // kvh, dim), k, v, attn_mask=attended.view(b, 1, 1, c),
                                         scale=scale)
    return out.reshape(b, h, dim)
