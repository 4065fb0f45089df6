"""Group-wise int4 weight-only linears: numerics against fp32, shape fallbacks, the disk cache, and
the int4 / `-fast` engines on the embedded model."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from mainspring.engine.attention import AttentionMetadata
from mainspring.engine.config import EngineConfig, ModelConfig, parse_quantization
from mainspring.engine.model import CausalLM
from mainspring.engine.quant import (
    KERNEL_MAX_ROWS, Int4Linear, cuda_inner_k_tiles, dequantize_int4, high_nibble_first, pack_for_kernel,
    quantize_int4, quantize_model, unpack_codes, unsupported_reason,
)
from mainspring.engine.quant_cache import quant_cache_file, quantize_for_engine, quantize_with_cache

BF16, FP32 = torch.bfloat16, torch.float32


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


# -- the quantized form ---------------------------------------------------------------------------
@pytest.mark.parametrize("group", [32, 64])
def test_round_trip_error_is_at_most_half_a_step(group):
    torch.manual_seed(0)
    w = torch.randn(64, 256) * 0.05
    q = quantize_int4(w, group)
    assert q.codes.dtype == torch.uint8 and q.codes.shape == (64, 128) and q.scales.shape == (64, 256 // group)
    err = (dequantize_int4(q) - w).abs().reshape(64, 256 // group, group)
    half_step = q.scales.unsqueeze(-1) / 2
    assert bool((err <= half_step * (1 + 1e-5)).all())
    codes = unpack_codes(q).reshape(64, 256 // group, group)
    # asymmetric: every group uses its lowest and highest code (its min and max are on the grid)
    assert bool((codes.amin(-1) == 0).all()) and bool((codes.amax(-1) == 15).all())


def test_weights_already_on_a_4bit_grid_are_kept_exactly():
    """A GGUF Q4_1 block (scale + min per 32 weights) re-quantizes without loss at group size 32."""
    torch.manual_seed(1)
    codes = torch.randint(0, 16, (32, 128))
    codes[:, ::32], codes[:, 1::32] = 0, 15  # each block spans its whole code range, as Q4_1 does
    scale = torch.rand(32, 4, 1) * 0.01 + 1e-3
    low = torch.randn(32, 4, 1) * 0.05
    w = (codes.reshape(32, 4, 32).float() * scale + low).reshape(32, 128)
    q = quantize_int4(w, 32)
    assert torch.equal(unpack_codes(q), codes.to(torch.uint8))
    torch.testing.assert_close(dequantize_int4(q), w, atol=1e-7, rtol=0)


def test_two_passes_quantize_the_residual_of_the_first():
    torch.manual_seed(8)
    w = torch.randn(32, 128) * 0.05
    one, two = quantize_int4(w, 32), quantize_int4(w, 32, passes=2)
    assert two.shape == (32, 128) and two.stored_shape == (32, 256) and two.passes == 2
    assert torch.equal(two.codes[:, :64], one.codes)  # the first pass is the one-pass form
    # the residual spans at most one first-pass step, so its step is <= 1/15 of it: error <= step / 30
    err = (dequantize_int4(two) - w).abs().reshape(32, 4, 32)
    assert bool((err <= one.scales.unsqueeze(-1) / 30 + 1e-7).all())
    x = torch.randn(3, 128)
    assert rel_err(Int4Linear(two)(x), x @ w.T) < 0.01 < rel_err(Int4Linear(one)(x), x @ w.T)
    with pytest.raises(ValueError, match="passes must be 1 or 2"):
        quantize_int4(w, 32, passes=3)


def test_a_constant_group_is_exact_and_finite():
    w = torch.full((16, 64), 0.25)
    q = quantize_int4(w, 32)
    assert bool(torch.isfinite(q.scales).all())
    assert torch.equal(dequantize_int4(q), w)


# -- the kernel -----------------------------------------------------------------------------------
@pytest.mark.parametrize("compute_dtype,bound", [(FP32, 1e-5), (BF16, 6e-3)])
@pytest.mark.parametrize("rows", [1, 5, KERNEL_MAX_ROWS])
def test_kernel_matches_its_dequantized_weight(compute_dtype, bound, rows):
    """Relative error of the packed kernel against x @ dequantize(W)^T: float rounding only
    (bf16 activations: ~3e-3, from rounding x and the output to 8 mantissa bits)."""
    torch.manual_seed(2)
    q = quantize_int4(torch.randn(256, 512) * 0.02, 32)
    x = torch.randn(rows, 512)
    got = Int4Linear(q, compute_dtype=compute_dtype, dense_prefill=False)(x)
    assert got.dtype == FP32 and got.shape == (rows, 256)
    assert rel_err(got, x @ dequantize_int4(q).T) < bound


@pytest.mark.parametrize("group,bound", [(32, 0.085), (64, 0.10)])
def test_int4_linear_error_against_fp32(group, bound):
    """Against the original fp32 weight, Gaussian weights: uniform rounding noise of a step
    (max - min) / 15 gives ~0.078 relative error at group 32 and ~0.090 at 64."""
    torch.manual_seed(3)
    w = torch.randn(512, 1024)
    x = torch.randn(8, 1024)
    assert rel_err(Int4Linear(quantize_int4(w, group))(x), x @ w.T) < bound


def test_packing_in_row_slices_gives_the_same_bytes():
    q = quantize_int4(torch.randn(8192 + 16, 64), 32)
    assert torch.equal(pack_for_kernel(q, slice_rows=1024), pack_for_kernel(q, slice_rows=1 << 20))


@pytest.mark.parametrize("native", [True, False], ids=["bf16-native", "no-bf16"])
def test_prefill_sized_calls_use_the_dense_copy_of_the_same_weight(native, monkeypatch):
    import mainspring.engine.quant as quant

    monkeypatch.setattr(quant, "native_bf16", lambda: native)
    torch.manual_seed(4)
    q = quantize_int4(torch.randn(128, 256) * 0.02, 32)
    lin = Int4Linear(q, dense_prefill=True)
    x = torch.randn(KERNEL_MAX_ROWS + 7, 256)
    if native:  # half the fp32 bytes, bf16 GEMMs
        assert lin.dense_weight is not None and lin.dense_weight.dtype == BF16 and lin.dense_packed is None
        assert rel_err(lin(x), x @ dequantize_int4(q).T) < 6e-3
    else:  # fp32, on the standard engine's fp32 kernel: the dequantized weight's own result
        assert (lin.dense_weight is None) != (lin.dense_packed is None)
        if lin.dense_weight is not None:
            assert lin.dense_weight.dtype == torch.float32
        assert rel_err(lin(x), x @ dequantize_int4(q).T) < 1e-5
    assert Int4Linear(q, dense_prefill=False).dense_weight is None
    assert Int4Linear(q, dense_prefill=False).dense_packed is None


def test_rows_are_bit_identical_alone_or_together_up_to_kernel_max_rows():
    """A row's output does not depend on the other rows of a decode-sized call."""
    torch.manual_seed(5)
    lin = Int4Linear(quantize_int4(torch.randn(256, 512) * 0.02, 32))
    x = torch.randn(KERNEL_MAX_ROWS, 512)
    together = lin(x)
    assert all(torch.equal(together[i : i + 1], lin(x[i : i + 1])) for i in range(KERNEL_MAX_ROWS))


def test_bias_and_leading_dimensions():
    torch.manual_seed(6)
    w, b = torch.randn(64, 128) * 0.05, torch.randn(64)
    q = quantize_int4(w, 32)
    x = torch.randn(2, 3, 128)
    got = Int4Linear(q, bias=b)(x)
    assert got.shape == (2, 3, 64)
    assert rel_err(got, x @ dequantize_int4(q).T + b) < 6e-3


# -- shapes the kernel cannot take ----------------------------------------------------------------
def test_unsupported_shapes_are_named():
    assert unsupported_reason(64, 128, 32) is None
    assert "multiple of 16" in unsupported_reason(100, 128, 32)
    assert "not a multiple of the group size 64" in unsupported_reason(64, 96, 64)
    assert "group size 16" in unsupported_reason(64, 128, 16)
    with pytest.raises(ValueError, match=r"100x128 weight to int4: out_features 100 is not a multiple of 16"):
        quantize_int4(torch.zeros(100, 128), 32)


def tiny_model(vocab: int = 97, seed: int = 0) -> CausalLM:
    """2 layers, hidden 64; a vocabulary of 97 makes the LM head [97, 64]: not kernel-shaped."""
    cfg = ModelConfig(architecture="llama", vocab_size=vocab, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=64)
    torch.manual_seed(seed)
    model = CausalLM(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    return model


def run_logits(model: CausalLM, ids: list[int]) -> torch.Tensor:
    c, dtype = model.config, model.embed_tokens.weight.dtype  # the KV cache in the model's precision
    cache = [tuple(torch.zeros(64, c.num_key_value_heads, c.head_dim, dtype=dtype) for _ in range(2))
             for _ in range(c.num_hidden_layers)]
    meta = AttentionMetadata.build([], [(list(range(4)), 0, len(ids))], 16)
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), cache, meta))


def test_quantize_model_replaces_kernel_shaped_linears_and_keeps_the_rest(caplog):
    model = tiny_model()
    ref = run_logits(model, list(range(20)))
    embed = model.embed_tokens.weight.clone()
    with caplog.at_level(logging.INFO, logger="mainspring.engine.quant"):
        report, forms = quantize_model(model, group_size=32)
    layers = [f"layers.{i}.{m}" for i in range(2)
              for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")]
    assert sorted(report.quantized) == sorted(layers) and sorted(forms) == sorted(layers)
    assert report.kept_fp32 == {"lm_head": "out_features 97 is not a multiple of 16 (the kernel's packing)"}
    assert "stay fp32 (out_features 97 is not a multiple of 16" in caplog.text and "lm_head" in caplog.text
    assert all(isinstance(model.get_submodule(n), Int4Linear) for n in layers)
    assert type(model.lm_head) is nn.Linear and torch.equal(model.embed_tokens.weight, embed)
    got = run_logits(model, list(range(20)))
    assert rel_err(got, ref) < 0.1
    again, _ = quantize_model(model, group_size=32)  # nothing left to quantize
    assert again.quantized == [] and again.num_quantized_now == 0


def test_tied_lm_head_is_quantized_but_the_embedding_stays_fp32():
    model = tiny_model(vocab=96)
    model.lm_head.weight = model.embed_tokens.weight  # tied, as SmolLM2
    embed = model.embed_tokens.weight.clone()
    report, _ = quantize_model(model, group_size=32)
    assert "lm_head" in report.quantized and isinstance(model.lm_head, Int4Linear)
    assert model.embed_tokens.weight.dtype == FP32 and torch.equal(model.embed_tokens.weight, embed)
    report, _ = quantize_model(tiny_model(vocab=96), group_size=32, include_lm_head=False)
    assert "lm_head" not in report.quantized and "lm_head" not in report.kept_fp32


def test_the_cuda_packing_gets_column_2j_in_the_high_nibble_and_the_widest_k_tiles():
    """torch's CUDA packing reads byte j of a row as (column 2j << 4) | column 2j+1; the portable form holds them the
    other way round (tests/engine/test_cuda.py runs the kernel)."""
    torch.manual_seed(0)
    q = quantize_int4(torch.randn(32, 576), 32)
    codes, swapped = unpack_codes(q), high_nibble_first(q.codes)
    assert swapped.dtype == torch.uint8 and swapped.shape == q.codes.shape and swapped.is_contiguous()
    assert torch.equal(swapped >> 4, codes[:, 0::2]) and torch.equal(swapped & 0xF, codes[:, 1::2])
    assert [cuda_inner_k_tiles(quantize_int4(torch.zeros(16, k), 32, passes)) for k, passes in
            ((576, 1), (576, 2), (1536, 1), (96, 1))] == [4, 8, 8, 2]


def test_a_model_quantized_in_fp32_then_placed_in_bf16_keeps_its_int4_layers_and_ties():
    """CausalLM.place after quantizing, as a bf16 engine does: dense weights cast (a tied head stays tied), int4
    layers and RoPE tables as they were, logits within bf16 rounding of the fp32 int4 model's."""
    ref, model = tiny_model(vocab=96), tiny_model(vocab=96)
    for m in (ref, model):
        m.lm_head.weight = m.embed_tokens.weight
        quantize_model(m, group_size=32, include_lm_head=False)
    packed = model.layers[1].mlp.down_proj.packed.clone()
    model.place(torch.device("cpu"), BF16)
    assert model.embed_tokens.weight.dtype == BF16 and model.lm_head.weight is model.embed_tokens.weight
    assert model.layers[0].input_layernorm.weight.dtype == BF16 and model.rope.cos.dtype == FP32
    assert torch.equal(model.layers[1].mlp.down_proj.packed, packed)
    ids = list(range(20))
    assert rel_err(run_logits(model, ids), run_logits(ref, ids)) < 0.03


# -- the disk cache -------------------------------------------------------------------------------
def fake_source(tmp_path: Path) -> Path:
    src = tmp_path / "SomeModel"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"weights")
    return src


def test_cache_round_trip_skips_quantization_and_is_bit_identical(tmp_path):
    src, cache = fake_source(tmp_path), tmp_path / "cache"
    ids = list(range(30))
    first = tiny_model(vocab=96)
    r1 = quantize_with_cache(first, src, cache, group_size=32)
    assert not r1.from_cache and r1.num_quantized_now == 9 and Path(r1.cache_file).is_file()
    assert Path(r1.cache_file).parent == cache / "quant"
    second = tiny_model(vocab=96)
    r2 = quantize_with_cache(second, src, cache, group_size=32)
    assert r2.from_cache and r2.num_quantized_now == 0 and r2.cache_file == r1.cache_file
    assert r2.quantized == r1.quantized
    for name in r1.quantized:
        a, b = first.get_submodule(name), second.get_submodule(name)
        assert torch.equal(a.packed, b.packed) and torch.equal(a.scales_and_zeros, b.scales_and_zeros)
    assert torch.equal(run_logits(first, ids), run_logits(second, ids))
    assert torch.equal(run_logits(first, ids[:1]), run_logits(second, ids[:1]))  # the kernel path too


def test_cache_key_follows_weights_group_size_and_lm_head(tmp_path):
    src, cache = fake_source(tmp_path), tmp_path / "cache"
    base = quant_cache_file(cache, src, 32, True)
    assert base == quant_cache_file(cache, src, 32, True)
    assert base != quant_cache_file(cache, src, 64, True) and base != quant_cache_file(cache, src, 32, False)
    os.utime(src / "model.safetensors", ns=(1, 1))  # the weights changed
    assert quant_cache_file(cache, src, 32, True) != base


def test_an_unreadable_cache_file_is_recomputed(tmp_path, caplog):
    src, cache = fake_source(tmp_path), tmp_path / "cache"
    path = quant_cache_file(cache, src, 32, True)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a safetensors file")
    with caplog.at_level(logging.WARNING, logger="mainspring.engine.quant_cache"):
        report = quantize_with_cache(tiny_model(vocab=96), src, cache, group_size=32)
    assert "unreadable" in caplog.text and not report.from_cache and report.num_quantized_now == 9
    assert quantize_with_cache(tiny_model(vocab=96), src, cache, group_size=32).from_cache


def test_an_unwritable_cache_only_costs_a_warning(tmp_path, caplog):
    src, not_a_dir = fake_source(tmp_path), tmp_path / "cache"
    not_a_dir.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger="mainspring.engine.quant_cache"):
        report = quantize_with_cache(tiny_model(vocab=96), src, not_a_dir, group_size=32)
    assert "could not be written" in caplog.text and len(report.quantized) == 9


# -- the engine option ----------------------------------------------------------------------------
def test_engine_option_values():
    assert EngineConfig().quantization is None and EngineConfig().quant_group_size == 32
    assert [parse_quantization(v) for v in (None, "", "none", "FP32", " int4 ")] == [None, None, None, None, "int4"]
    model = tiny_model()
    assert quantize_for_engine(model, None, None) is None and type(model.layers[0].mlp.down_proj) is nn.Linear
    with pytest.raises(ValueError, match=r"unknown quantization 'int3'; supported: int4, int4-bf16, int4-fp32, int8"):
        quantize_for_engine(model, None, "int3")
    report = quantize_for_engine(model, None, "int4", 32)
    assert report.cache_file is None and len(report.quantized) == 8


# -- the embedded model ---------------------------------------------------------------------------
TEXT = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
        "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.")


def perplexity(model: CausalLM, ids: list[int]) -> float:
    c = model.config
    cache = [(torch.zeros(128, c.num_key_value_heads, c.head_dim), torch.zeros(128, c.num_key_value_heads, c.head_dim))
             for _ in range(c.num_hidden_layers)]
    meta = AttentionMetadata.build([], [(list(range(8)), 0, len(ids))], 16)
    with torch.inference_mode():
        logits = model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), cache, meta))
    return math.exp(torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:])).item())


@pytest.mark.slow
@pytest.mark.parametrize("dense_prefill", [False, True])
def test_embedded_model_perplexity_barely_moves(embedded, dense_prefill):
    """Within 1% of fp32 (measured 6.26 fp32, 6.19-6.25 int4 on this text; a longer one: 7.70 vs
    7.66-7.73). Group 64 would add ~40%: it cannot reproduce the GGUF's Q4_1 blocks of 32."""
    ids = embedded.tokenizer.encode(TEXT)
    fp32 = perplexity(CausalLM.from_weights(embedded.config, embedded.state_dict), ids)
    model = CausalLM.from_weights(embedded.config, embedded.state_dict)
    report, _ = quantize_model(model, dense_prefill=dense_prefill)
    assert len(report.quantized) == 4 * embedded.config.num_hidden_layers + 1 and not report.kept_fp32
    assert perplexity(model, ids) / fp32 < 1.01


@pytest.mark.slow
def test_embedded_model_per_layer_error(embedded):
    """Decoder weights come from Q4_1 blocks, which g32 reproduces: only bf16 rounding is left
    (< 1%); the LM head (the Q8_0 embedding) carries real 4-bit rounding error (~10%) in one pass,
    under 2% in the two passes it gets by default."""
    model = CausalLM.from_weights(embedded.config, embedded.state_dict)
    torch.manual_seed(7)
    worst = {}
    for name, lin in [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]:
        x = torch.randn(4, lin.in_features)
        kind = name.rsplit(".", 1)[-1]
        worst[kind] = max(worst.get(kind, 0.0), rel_err(Int4Linear(quantize_int4(lin.weight, 32))(x), lin(x)))
    assert set(worst) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"}
    assert max(v for k, v in worst.items() if k != "lm_head") < 0.01
    assert 0.05 < worst["lm_head"] < 0.15
    x = torch.randn(4, model.config.hidden_size)
    assert rel_err(Int4Linear(quantize_int4(model.lm_head.weight, 32, passes=2))(x), model.lm_head(x)) < 0.02


@pytest.mark.slow
def test_embedded_model_cache_round_trip(embedded, tmp_path):
    ids = embedded.tokenizer.encode(TEXT)[:24]
    first = CausalLM.from_weights(embedded.config, embedded.state_dict)
    r1 = quantize_with_cache(first, embedded.path, tmp_path)
    second = CausalLM.from_weights(embedded.config, embedded.state_dict)
    r2 = quantize_with_cache(second, embedded.path, tmp_path)
    assert r1.num_quantized_now == 121 and r2.from_cache and r2.num_quantized_now == 0
    assert torch.equal(run_logits(first, ids), run_logits(second, ids))


def chat_ids(engine, question: str) -> list[int]:
    return engine.tokenizer.encode(engine.tokenizer.apply_chat_template([{"role": "user", "content": question}]))


@pytest.fixture
def fp32_activations(monkeypatch):
    """int4 kernels on fp32 activations, whatever the CPU. With bf16 ones (the default where bf16 is
    native) each linear is ~3e-3 off fp32, and the 135M model's first greedy token of this question
    is a near tie ("The" / "L'"), so the answer's language would depend on the CPU's bf16 support;
    the kernel's bf16 accuracy is checked on its own in test_int4_bf16_activations_error_bound."""
    import mainspring.engine.quant as quant

    monkeypatch.setattr(quant, "default_compute_dtype", lambda: torch.float32)
    monkeypatch.setattr(quant, "native_bf16", lambda: False)


def test_int4_bf16_activations_error_bound():
    torch.manual_seed(0)
    q = quantize_int4(torch.randn(256, 512) * 0.02)
    x = torch.randn(5, 512)
    ref = x @ dequantize_int4(q).T
    for dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):  # bf16: input rounding, ~2^-9
        y = Int4Linear(q, None, compute_dtype=dtype, dense_prefill=False)(x)
        assert ((y.float() - ref).norm() / ref.norm()).item() < bound, dtype


@pytest.mark.slow
def test_int4_engine_answers_coherently(embedded, fp32_activations):
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.params import SamplingParams

    engine = LLMEngine(embedded, EngineConfig(kv_cache_mb=64))
    report = quantize_for_engine(engine.model, embedded.path, "int4")
    assert len(report.quantized) == 121
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    out = engine.generate([chat_ids(engine, "What is the capital of France?")], greedy)[0]
    assert "Paris" in out.text


@pytest.mark.slow
def test_fast_engine(embedded, fp32_activations):
    from mainspring.config import Settings
    from mainspring.engine.fast_variant import build_fast_engine
    from mainspring.engine.params import SamplingParams

    from mainspring.engine.engine import LLMEngine

    standard = LLMEngine(embedded, EngineConfig(kv_cache_mb=16))
    engine = build_fast_engine(Settings(kv_cache_mb=64, fast_kernel="int4-fp32"), loaded=embedded, standard=standard)
    assert engine.name == embedded.name + "-fast"
    assert engine.config.quantization == "int4-fp32" and engine.config.speculative
    assert engine.kernel_choice.reason == "pinned by MAINSPRING_FAST_KERNEL"
    assert isinstance(engine.model.lm_head, Int4Linear) and len(engine.quant_report.quantized) == 121
    # the layers are Q4_1 in the GGUF, exact in int4 g32: prefill runs the standard engine's linears, no fp32 copies
    # (the LM head's embedding is Q8_0, two int4 passes: it keeps its own)
    shared = engine.quant_report.shared_prefill
    assert len(shared) == 120 and "lm_head" not in shared
    assert all(engine.model.get_submodule(n).shared.module is standard.model.get_submodule(n) for n in shared)
    assert engine.tokenizer is embedded.tokenizer
    out = engine.generate([chat_ids(engine, "What is the capital of France?")],
                          SamplingParams(temperature=0.0, max_tokens=24))[0]
    assert "Paris" in out.text


@pytest.mark.slow
def test_the_measured_fast_kernel_meets_its_accuracy_bound(embedded, tmp_path):
    """The real choice on this CPU, whatever it is: every candidate timed, the winner within the
    bound (or fp32, the standard weights, with speculative decoding still on), the choice cached."""
    from mainspring.config import Settings
    from mainspring.engine.fast_variant import build_fast_engine
    from mainspring.engine.kernel_choice import AccuracyBound, candidates
    from mainspring.engine.cpu import detect
    from mainspring.engine.linear_kernel import onednn_available
    from mainspring.engine.quant_int8 import available

    settings = Settings(kv_cache_mb=64, data_dir=tmp_path)
    engine = build_fast_engine(settings, loaded=embedded)
    choice = engine.kernel_choice
    assert set(choice.ms_per_step) == set(candidates(detect(), available(), onednn_available()))
    assert not choice.from_cache
    assert engine.config.speculative is not None and engine.config.quantization == choice.quantization
    if choice.name != "fp32":
        bound = AccuracyBound()
        acc = choice.accuracy[choice.name]
        assert acc["top1"] >= bound.min_top1 and acc["ppl_ratio"] <= bound.max_ppl_ratio
        assert choice.ms_per_step[choice.name] < choice.ms_per_step["fp32"]
    again = build_fast_engine(settings, loaded=embedded).kernel_choice
    assert again.from_cache and again.name == choice.name
