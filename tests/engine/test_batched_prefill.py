"""Prefill chunks padded into one attention call (engine/batched_prefill.py): the answer of the per-chunk path,
row for row, for fresh prompts and chunks over cached context of different lengths, beside decode rows. The path
runs off the CPU (AttentionMetadata.to); here it is built on the CPU directly (tests/engine/test_cuda.py runs
the engine on a GPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mainspring.engine import batched_prefill
from mainspring.engine.attention import AttentionMetadata, paged_attention
from mainspring.engine.batched_prefill import batch_prefills

BS, KVH, H, D = 16, 3, 9, 32


def step(g: torch.Generator, dtype: torch.dtype = torch.float32):
    """A step of two decode rows and four prefill chunks (two fresh, two over cached context), with its cache
    already holding the context and q/k/v for the step's rows."""
    tables = [list(range(i * 8, i * 8 + 8)) for i in range(6)]
    decode = [(tables[0], 40), (tables[1], 70)]
    prefill = [(tables[2], 0, 23), (tables[3], 48, 30), (tables[4], 0, 5), (tables[5], 100, 1)]
    meta = AttentionMetadata.build(decode, prefill, BS)
    k_cache, v_cache = (torch.randn(6 * 8 * BS, KVH, D, generator=g).to(dtype) for _ in range(2))
    n = meta.slot_mapping.numel()
    q = torch.randn(n, H, D, generator=g).to(dtype)
    k, v = (torch.randn(n, KVH, D, generator=g).to(dtype) for _ in range(2))
    return meta, q, k, v, k_cache, v_cache


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_padded_chunks_attend_as_each_chunk_does_alone(dtype, tol):
    g = torch.Generator().manual_seed(0)
    meta, q, k, v, k_cache, v_cache = step(g, dtype)
    batch = batch_prefills(meta.prefills, meta.slot_mapping)
    assert batch is not None and batch.q_rows.shape == (4, 30) and batch.ctx_slots.shape == (4, 101)
    assert batch.out_rows.tolist() == list(range(2, meta.slot_mapping.numel()))  # every prefill row, in order
    want = paged_attention(q, k, v, (k_cache.clone(), v_cache.clone()), meta, D**-0.5)
    got = paged_attention(q, k, v, (k_cache.clone(), v_cache.clone()), dataclasses.replace(meta, batched=batch),
                          D**-0.5)
    assert torch.isfinite(got).all()
    assert (got.float() - want.float()).abs().max().item() <= tol * want.float().abs().max().item()
    assert torch.equal(got[:2], want[:2])  # decode rows take their own path either way


def test_one_chunk_or_too_much_padding_keeps_the_per_chunk_path(monkeypatch):
    meta, *_ = step(torch.Generator().manual_seed(1))
    assert batch_prefills(meta.prefills[:1], meta.slot_mapping) is None
    monkeypatch.setattr(batched_prefill, "MAX_PADDED", 4 * 30 * 101 - 1)  # one element short of this step's
    assert batch_prefills(meta.prefills, meta.slot_mapping) is None
    monkeypatch.setattr(batched_prefill, "MAX_PADDED", 4 * 30 * 101)
    assert batch_prefills(meta.prefills, meta.slot_mapping) is not None
