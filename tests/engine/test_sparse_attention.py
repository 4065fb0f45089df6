"""Sparse attention (sinks + sliding window, hot and cold runs) against a direct reference."""

from __future__ import annotations

import pytest
import torch

from mainspring.engine.attention import AttentionMetadata, paged_attention
from mainspring.engine.kv_policy import KVPolicy, plan_blocks, snap_plan
from mainspring.engine.layers import RotaryEmbedding
from mainspring.engine.sparse_attention import QUERY_TILE

BS, KVH, G, D = 16, 2, 3, 16
H = KVH * G


def rope() -> RotaryEmbedding:
    return RotaryEmbedding(D, 64, 10000.0, None)  # a short table: long positions exercise ensure()


def reference(q_raw, k_raw, v, qpos: int, window: int | None, sinks: int, r: RotaryEmbedding) -> torch.Tensor:
    """StreamingLLM by the book: window keys at their text positions, sinks placed right before
    the window (cache positions), each key rotated explicitly; one query at qpos."""
    lo = max(0, qpos - window + 1) if window is not None else 0
    keys, vals, kpos = [], [], []
    for j in range(min(sinks, lo)):
        keys.append(k_raw[j]), vals.append(v[j]), kpos.append(max(0, lo - sinks) + j)
    for p in range(lo, qpos + 1):
        keys.append(k_raw[p]), vals.append(v[p]), kpos.append(p)
    k = torch.stack(keys)
    r.ensure(torch.tensor(kpos + [qpos]))
    (k_rot,) = r(torch.tensor(kpos), k)
    (q_rot,) = r(torch.tensor([qpos]), q_raw[None])
    qg = q_rot[0].view(KVH, G, D)
    scores = torch.einsum("hgd,khd->hgk", qg, k_rot) * D**-0.5
    out = torch.einsum("hgk,khd->hgd", scores.softmax(-1), torch.stack(vals))
    return out.reshape(H, D)


def paged(n: int, seed: int = 0):
    """n tokens of random raw K/V/Q and a shuffled block table over a cache of 2n slots."""
    g = torch.Generator().manual_seed(seed)
    k_raw, v = torch.randn(n, KVH, D, generator=g), torch.randn(n, KVH, D, generator=g)
    q_raw = torch.randn(n, H, D, generator=g)
    nblocks = -(-n // BS)
    table = torch.randperm(2 * nblocks, generator=g)[:nblocks].tolist()
    k_cache, v_cache = torch.zeros(2 * nblocks * BS, KVH, D), torch.zeros(2 * nblocks * BS, KVH, D)
    return q_raw, k_raw, v, table, k_cache, v_cache


@pytest.mark.parametrize("window,sinks,start,num", [
    (None, 0, 0, 40),  # no window: plain causal prefill through the sparse path
    (32, 4, 0, 300),  # one chunk longer than a query tile, window moving past the sinks
    (32, 4, 150, 1),  # a decode step far past the window
    (48, 4, 100, 37),  # a chunk in the middle
    (32, 0, 120, 20),  # window only
    (32, 20, 150, 5),  # more sinks than a block
])
def test_matches_streamingllm_reference(window, sinks, start, num):
    r = rope()
    n = start + num
    q_raw, k_raw, v, table, k_cache, v_cache = paged(n)
    # the cache holds keys rotated at their text position, as the model writes them
    r.ensure(torch.arange(n))
    (k_rot,) = r(torch.arange(n), k_raw)
    slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(n)])
    k_cache[slots[:start]], v_cache[slots[:start]] = k_rot[:start], v[:start]
    policy = KVPolicy(window=window, sink_tokens=sinks)
    meta = AttentionMetadata.build([], [], BS, [(table, {}, start, num, policy)], r.inv_freq)
    (q_rot,) = r(torch.arange(start, n), q_raw[start:])
    out = paged_attention(q_rot, k_rot[start:], v[start:], (k_cache, v_cache), meta, D**-0.5)
    assert len(meta.sparse[0].tiles) == -(-num // QUERY_TILE)
    for i in range(num):
        ref = reference(q_raw[start + i], k_raw, v, start + i, window, sinks, r)
        torch.testing.assert_close(out[i], ref, atol=2e-5, rtol=1e-4)


def test_wide_window_equals_dense_causal_attention():
    r = rope()
    q_raw, k_raw, v, table, k_cache, v_cache = paged(70, seed=1)
    r.ensure(torch.arange(70))
    (k_rot,) = r(torch.arange(70), k_raw)
    (q_rot,) = r(torch.arange(70), q_raw)
    dense = AttentionMetadata.build([], [(table, 0, 70)], BS)
    want = paged_attention(q_rot, k_rot, v, (k_cache.clone(), v_cache.clone()), dense, D**-0.5)
    sparse = AttentionMetadata.build([], [], BS, [(table, {}, 0, 70, KVPolicy(window=1024))], r.inv_freq)
    got = paged_attention(q_rot, k_rot, v, (k_cache, v_cache), sparse, D**-0.5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_cold_runs_are_read_from_the_cold_store_in_position_order():
    """Blocks 1-3 live in a (here exact) cold store; the result equals the all-hot one, and
    the loader is asked for exactly those blocks once per step and layer (K and V together)."""
    r = rope()
    n = 80
    q_raw, k_raw, v, table, k_cache, v_cache = paged(n, seed=2)
    r.ensure(torch.arange(n))
    (k_rot,) = r(torch.arange(n), k_raw)
    (q_rot,) = r(torch.arange(n - 1, n), q_raw[n - 1 :])
    slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(n)])
    k_cache[slots], v_cache[slots] = k_rot, v
    policy = KVPolicy(window=60, sink_tokens=4, hot_tokens=32)
    hot = AttentionMetadata.build([], [], BS, [(table, {}, n - 1, 1, policy)], r.inv_freq)
    want = paged_attention(q_rot, k_rot[-1:], v[-1:], (k_cache, v_cache), hot, D**-0.5)

    cold_ids = {1: 7, 2: 5, 3: 6}
    store = {cid: (k_rot[b * BS : (b + 1) * BS], v[b * BS : (b + 1) * BS]) for b, cid in cold_ids.items()}
    calls = []

    def load(ids):
        calls.append(ids.tolist())
        return torch.cat([store[i][0] for i in ids.tolist()]), torch.cat([store[i][1] for i in ids.tolist()])

    split = [t if b not in cold_ids else -1 for b, t in enumerate(table)]
    for b in cold_ids:  # scribble over the released hot blocks: they must not be read
        k_cache[table[b] * BS : (table[b] + 1) * BS] = float("nan")
    meta = AttentionMetadata.build([], [], BS, [(split, cold_ids, n - 1, 1, policy)], r.inv_freq)
    got = paged_attention(q_rot, k_rot[-1:], v[-1:], (k_cache, v_cache, load), meta, D**-0.5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert calls == [[7, 5, 6]]  # window starts at 20 (block 1): blocks 1..3 cold, skip 4 of block 1


def test_a_released_block_inside_the_window_is_an_error():
    r = rope()
    policy = KVPolicy(window=40, sink_tokens=4)
    with pytest.raises(RuntimeError, match="released"):
        AttentionMetadata.build([], [], BS, [([0, -1, 2, 3], {}, 60, 1, policy)], r.inv_freq)


def test_plan_blocks_drops_behind_the_window_demotes_behind_the_hot_span_and_keeps_sinks():
    policy = KVPolicy(window=64, sink_tokens=4, hot_tokens=32)
    table, cold = list(range(10)), {}
    plan = plan_blocks(policy, table, cold, 160, BS)
    # next query at 160 reads >= 97: blocks 1..5 (tokens 16..95) go; sinks keep block 0;
    # hot span starts at 128: blocks 6, 7 (96..127) turn cold
    assert plan.drop == [1, 2, 3, 4, 5] and plan.demote == [6, 7]
    assert (plan.drop_to, plan.demote_to) == (6, 8)
    # the cursors make the next plan look only at new blocks
    table2 = [0, -1, -1, -1, -1, -1, -1, -1, 8, 9, 10]
    later = plan_blocks(policy, table2, {6: 0, 7: 1}, 176, BS, plan.drop_to, plan.demote_to)
    assert later.drop == [6] and later.demote == [8]
    no_sinks = plan_blocks(KVPolicy(window=64, sink_tokens=0), table, {}, 160, BS)
    assert no_sinks.drop == [0, 1, 2, 3, 4, 5] and no_sinks.demote == []


def test_rope_table_grows_past_the_trained_context_exactly():
    r = rope()
    pos = torch.tensor([5, 63, 64, 1000, 40000])
    r.ensure(pos)
    x = torch.randn(5, 1, D, dtype=torch.float64)
    (got,) = r(pos, x.float())
    ang = pos.double()[:, None] * r.inv_freq.double()[None, :]
    emb = torch.cat([ang, ang], -1)[:, None, :]
    half = D // 2
    want = x * emb.cos() + torch.cat([-x[..., half:], x[..., :half]], -1) * emb.sin()
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_snapkv_observation_votes_with_the_last_queries_attention_per_key():
    r = rope()
    n = 300  # two query tiles; the observed (last 32) rows all sit in the second
    q_raw, k_raw, v, table, k_cache, v_cache = paged(n, seed=3)
    r.ensure(torch.arange(n))
    (k_rot,) = r(torch.arange(n), k_raw)
    (q_rot,) = r(torch.arange(n), q_raw)
    policy = KVPolicy(snap_tokens=256)
    meta = AttentionMetadata.build([], [], BS, [(table, {}, 0, n, policy, 32)], r.inv_freq)
    paged_attention(q_rot, k_rot, v, (k_cache, v_cache), meta, D**-0.5)
    seg = meta.sparse[0]
    assert seg.key_pos.tolist() == list(range(n))
    # per key: the 32 observed rows' attention summed per head, the most attentive head's sum
    per_head = torch.zeros(KVH, G, n)
    for i in range(n - 32, n):
        (qi,) = r(torch.tensor([i]), q_raw[i][None])
        w = torch.einsum("hgd,khd->hgk", qi[0].view(KVH, G, D), k_rot[: i + 1]) * D**-0.5
        per_head[..., : i + 1] += w.softmax(-1)
    torch.testing.assert_close(seg.scores, per_head.amax(dim=(0, 1)), atol=1e-4, rtol=1e-4)
    assert float(seg.scores.max()) <= 32 + 1e-4 and float(seg.scores[: n - 32].min()) > 0


def test_snap_plan_keeps_sinks_recent_and_most_attended_blocks_within_budget():
    policy = KVPolicy(snap_tokens=96)  # 6 blocks
    table = list(range(12))  # 190 tokens computed: blocks 0..11, the last one partial
    key_pos = torch.arange(190)
    scores = torch.zeros(190)
    scores[5 * BS + 3] = 5.0  # block 5 is what the question looks at
    scores[8 * BS] = 2.0
    scores[2 * BS] = 1.0
    drop = snap_plan(policy, table, {}, 190, scores, key_pos, BS)
    kept = sorted(set(range(12)) - set(drop))
    # block 0 (sinks), blocks 9..11 (the last 32 tokens and the partial block), then 5 and 8 by mass
    assert kept == [0, 5, 8, 9, 10, 11] and drop == [1, 2, 3, 4, 6, 7]


def check_segment_on(device: torch.device) -> None:
    """Window + sinks over hot slots and int8 cold blocks, with the segment's metadata, the caches and the cold tier
    moved to `device`: the answer computed on the CPU (fp32 both), for a prefill chunk and a decode row
    (tests/engine/test_cuda.py runs it on a GPU)."""
    from mainspring.engine.kv_quant import ColdKVStore
    from mainspring.engine.sparse_attention import build_segment, sparse_attention

    g = torch.Generator().manual_seed(0)
    blocks, heads, d = 20, 9, 64
    k_cache, v_cache = (torch.randn(blocks * BS, 3, d, generator=g) for _ in range(2))
    stores = [ColdKVStore(1, 16, BS, 3, d, bits=8, device=dev) for dev in (torch.device("cpu"), device)]
    cold_blocks = range(2, 10)  # positions 32..159 live in the cold tier
    for store in stores:
        kv = (c[2 * BS : 10 * BS].reshape(1, 8, BS, 3, d).to(store.k_q.device) for c in (k_cache, v_cache))
        store.store(torch.tensor(store.allocate(8)), *kv)
    table = [-1 if b in cold_blocks else b for b in range(blocks)]
    cold = {b: i for i, b in enumerate(cold_blocks)}
    inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
    for start, num in ((300, 20), (319, 1)):
        seg = build_segment(0, table, cold, start, num, KVPolicy(window=200, sink_tokens=4), BS, inv_freq)
        assert seg.sink_slots is not None and {kind for kind, *_ in seg.runs} == {"hot", "cold"}
        q = torch.randn(num, heads, d, generator=g)
        want = sparse_attention(q, k_cache, v_cache, lambda i: stores[0].load(0, i), seg, d**-0.5)
        moved = seg.to(device)
        assert moved.sink_slots is not None and moved.sink_slots.device.type == device.type
        assert all(t.sink_mask is not None and t.cos is not None for t in moved.tiles)
        got = sparse_attention(q.to(device), k_cache.to(device), v_cache.to(device),
                               lambda i: stores[1].load(0, i), moved, d**-0.5)
        assert got.device.type == device.type and torch.allclose(got.cpu(), want, atol=1e-4, rtol=1e-4)


def test_a_segment_and_its_cold_tier_moved_to_a_device_give_the_same_answer():
    check_segment_on(torch.device("cpu"))  # the round trip of SparseSegment.to; a GPU's in test_cuda.py
