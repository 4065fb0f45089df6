"""Our paged-attention model against Hugging Face transformers on the same random weights."""

import pytest
import torch

from mainspring.engine import shared_prefix
from mainspring.engine.attention import AttentionMetadata
from mainspring.engine.config import ModelConfig
from mainspring.engine.model import CausalLM

transformers = pytest.importorskip("transformers")

BLOCK = 4
# bf16 keeps 8 bits of mantissa: its logits are compared with fp32 transformers' at a bf16 tolerance
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def tiny_hf(arch: str, **extra):
    common = dict(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=arch == "llama", **extra,
    )
    torch.manual_seed(0)
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    return model.eval()


def ours_from(hf, dtype: torch.dtype = torch.float32) -> CausalLM:
    c = hf.config
    cfg = ModelConfig(
        architecture=c.model_type, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        head_dim=c.hidden_size // c.num_attention_heads, max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else c.rope_theta,
        rope_scaling=getattr(c, "rope_scaling", None), tie_word_embeddings=c.tie_word_embeddings,
        attention_bias=c.model_type == "qwen2" or bool(getattr(c, "attention_bias", False)),
    )
    model = CausalLM(cfg).eval()
    model.load_weights(hf.state_dict(), dtype)
    return model


def new_cache(model: CausalLM, num_blocks: int = 64):
    c, dtype = model.config, model.embed_tokens.weight.dtype
    return [
        (torch.zeros(num_blocks * BLOCK, c.num_key_value_heads, c.head_dim, dtype=dtype),
         torch.zeros(num_blocks * BLOCK, c.num_key_value_heads, c.head_dim, dtype=dtype))
        for _ in range(c.num_hidden_layers)
    ]


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


@DTYPES
@pytest.mark.parametrize("arch,extra", [("llama", {}), ("qwen2", {}), ("llama", {"attention_bias": True})])
def test_full_prefill_matches_transformers(arch, extra, dtype):
    hf = tiny_hf(arch, **extra)
    if extra:  # random init leaves biases at zero; make them matter
        with torch.no_grad():
            for name, p in hf.named_parameters():
                if name.endswith("bias"):
                    p.normal_()
    ours = ours_from(hf, dtype)
    ids = torch.randint(0, 97, (23,)).tolist()
    table = list(range(6))
    meta = AttentionMetadata.build([], [(table, 0, len(ids))], BLOCK)
    with torch.no_grad():
        hidden = ours(torch.tensor(ids), torch.arange(len(ids)), new_cache(ours), meta)
        logits = ours.compute_logits(hidden)
    assert hidden.dtype == dtype and logits.dtype == torch.float32  # the sampler reads fp32 in every precision
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(logits, hf_logits(hf, ids), atol=tol, rtol=tol)


def test_rope_scaling_llama3_matches_transformers():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
    hf = tiny_hf("llama", rope_scaling=scaling)
    ours = ours_from(hf)
    assert ours.config.rope_scaling is not None
    ids = torch.randint(0, 97, (60,)).tolist()
    meta = AttentionMetadata.build([], [(list(range(16)), 0, len(ids))], BLOCK)
    with torch.no_grad():
        logits = ours.compute_logits(ours(torch.tensor(ids), torch.arange(len(ids)), new_cache(ours), meta))
    torch.testing.assert_close(logits, hf_logits(hf, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
# consecutive blocks are read through a view of the cache, scattered ones gathered (attention.py)
@pytest.mark.parametrize("table_a,table_b", [([0, 1, 2, 3, 4], [0, 1, 5, 6, 7]), ([9, 3, 2, 8, 4], [9, 3, 5, 6, 7])],
                         ids=["consecutive", "scattered"])
# together: step 2's two chunks over cached context attend their shared prefix in one call (shared_prefix.py)
@pytest.mark.parametrize("together", [False, True], ids=["per-chunk", "together"])
@DTYPES
def test_chunked_prefill_then_decode_matches_transformers(arch, table_a, table_b, together, dtype, monkeypatch):
    """Chunks attend cached context through the block table; decode rows use the cascade path."""
    monkeypatch.setattr(shared_prefix, "MIN_PREFIX_TOKENS", 1 if together else 10**9)
    hf = tiny_hf(arch)
    ours = ours_from(hf, dtype)
    torch.manual_seed(1)
    shared = torch.randint(0, 97, (9,)).tolist()  # two full blocks shared + one partial
    a = shared + torch.randint(0, 97, (6,)).tolist()
    b = shared[:8] + torch.randint(0, 97, (5,)).tolist()
    ref_a, ref_b = hf_logits(hf, a), hf_logits(hf, b)
    cache = new_cache(ours)
    # table_b shares table_a's first two blocks (prefix cache), then its own tail blocks
    got_a, got_b = [], []
    with torch.no_grad():
        # step 1: A prefills 7 tokens; step 2: A's next 5 (cached context) + B's tail after its 8 shared
        for rows in ([(table_a, 0, 7)], [(table_a, 7, 5), (table_b, 8, 3)]):
            meta = AttentionMetadata.build([], rows, BLOCK)
            assert (meta.shared is not None) == (together and len(rows) == 2)
            ids = [t for bt, s, n in rows for t in (a if bt is table_a else b)[s : s + n]]
            pos = [p for _, s, n in rows for p in range(s, s + n)]
            logits = ours.compute_logits(ours(torch.tensor(ids), torch.tensor(pos), cache, meta))
            off = 0
            for bt, _, n in rows:
                (got_a if bt is table_a else got_b).append(logits[off : off + n])
                off += n
        # decode the remaining tokens of both together (B has 13 tokens: one decode step at a time)
        na, nb = 12, 11
        while na < len(a) or nb < len(b):
            rows, ids, pos = [], [], []
            for seq, n, table in ((a, na, table_a), (b, nb, table_b)):
                if n < len(seq):
                    rows.append((table, n + 1))
                    ids.append(seq[n])
                    pos.append(n)
            meta = AttentionMetadata.build(rows, [], BLOCK)
            logits = ours.compute_logits(ours(torch.tensor(ids), torch.tensor(pos), cache, meta))
            i = 0
            if na < len(a):
                got_a.append(logits[i : i + 1])
                i += 1
                na += 1
            if nb < len(b):
                got_b.append(logits[i : i + 1])
                nb += 1
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(torch.cat(got_a), ref_a, atol=tol, rtol=tol)
    torch.testing.assert_close(torch.cat(got_b), ref_b[8:], atol=tol, rtol=tol)
