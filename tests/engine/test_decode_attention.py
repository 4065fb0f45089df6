"""Decode attention's two kernels agree: torch's CPU flash kernel (what the CPU runs) and the matmul path (what
CUDA runs, kept honest here on the CPU), over a shared prefix plus ragged per-row tails, in fp32 and bf16."""

import pytest
import torch

from mainspring.engine import attention, shared_prefix
from mainspring.engine.attention import AttentionMetadata

BLOCK = 4


def _rows():
    # three rows share blocks 0-2 (12 tokens); their tails are scattered blocks of 1, 6 and 3 tokens
    return [([0, 1, 2, 7], 13), ([0, 1, 2, 9, 4], 18), ([0, 1, 2, 5], 15)]


@pytest.mark.skipif(shared_prefix.FLASH is None, reason="this torch has no CPU flash kernel")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows", [_rows(), [([3, 1, 6], 10)], [([0, 1, 2], 12), ([0, 1, 2], 12)]],
                         ids=["prefix-and-ragged-tails", "one-row-scattered", "prefix-only"])
def test_flash_and_matmul_decode_agree(rows, dtype, tol, monkeypatch):
    torch.manual_seed(0)
    h, kvh, d = 6, 2, 16
    k_cache = torch.randn(12 * BLOCK, kvh, d, dtype=dtype)
    v_cache = torch.randn(12 * BLOCK, kvh, d, dtype=dtype)
    q = torch.randn(len(rows), h, d, dtype=dtype)
    meta = AttentionMetadata.build(rows, [], BLOCK)
    flash = attention._decode_attention(q, k_cache, v_cache, meta.decode, d**-0.5)
    monkeypatch.setattr(shared_prefix, "FLASH", None)  # the dispatch falls to the matmul path
    matmul = attention._decode_attention(q, k_cache, v_cache, meta.decode, d**-0.5)
    assert flash.shape == matmul.shape == q.shape and flash.dtype == dtype
    torch.testing.assert_close(flash.float(), matmul.float(), atol=tol, rtol=tol)
    # and both are plain softmax attention over each row's own context
    for i, (table, n) in enumerate(rows):
        slots = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(n)])
        k, v = (c[slots].float().repeat_interleave(h // kvh, 1).transpose(0, 1) for c in (k_cache, v_cache))
        ref = torch.softmax(q[i].float()[:, None] @ k.transpose(1, 2) * d**-0.5, -1) @ v
        torch.testing.assert_close(flash[i].float(), ref[:, 0], atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"])
def test_merge_is_attention_over_both_halves(dtype, tol):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(5, n, 8, generator=gen) for n in (1, 12, 12))
    k[3, 7:] *= 40  # one row whose second half holds nearly all the weight: its lse far above the first's

    def attend(keys, values):
        scores = q @ keys.transpose(1, 2)  # [5, 1, n]
        return (torch.softmax(scores, -1) @ values).to(dtype), torch.logsumexp(scores, -1)

    whole, _ = attend(k, v)
    got = shared_prefix.merge(*attend(k[:, :7], v[:, :7]), *attend(k[:, 7:], v[:, 7:]))
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), whole.float(), atol=tol, rtol=tol)
