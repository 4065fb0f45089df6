"""The fp32 linear kernel: oneDNN's and MKL's prepacked linears against F.linear, the per-CPU choice (on faked
timings), packing a model, and writing new weights into a packed one (the trainer's sync)."""

import pytest
import torch
import torch.nn.functional as F

from mainspring.engine import linear_kernel as lk
from mainspring.engine.linear_kernel import PackedLinear, choose, pack_linears, pack_weights_into
from mainspring.engine.model import CausalLM
from tests.engine.test_quant import run_logits as _logits
from tests.train.tiny import tiny_config, tiny_state

needs_onednn = pytest.mark.skipif(not lk.onednn_available(), reason="this torch build has no working oneDNN linear")
needs_mkl = pytest.mark.skipif(not lk.mkl_available(), reason="this torch build has no MKL packed linear (x86 only)")
needs_bf16_packing = pytest.mark.skipif(not lk.bf16_packing_available(),
                                        reason="oneDNN packs bf16 weights only with AVX-512 or AVX-NE-CONVERT")


KERNELS = [pytest.param("onednn", marks=needs_onednn), pytest.param("mkl", marks=needs_mkl)]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("rows", [1, 7, 64, 300])  # MKL's pack is laid out for MKL_PACK_ROWS: other counts too
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_is_f_linear(kernel, rows, with_bias):
    g = torch.Generator().manual_seed(rows)
    w, b, x = torch.randn(96, 40, generator=g), torch.randn(96, generator=g), torch.randn(rows, 40, generator=g)
    layer = PackedLinear(w, b if with_bias else None, kernel=kernel)
    assert torch.allclose(layer(x), F.linear(x, w, b if with_bias else None), rtol=1e-5, atol=1e-5)
    assert torch.equal(layer.weight, w)  # the dense copy reads back exactly
    assert list(layer.parameters()) == ([layer.bias] if with_bias else [])  # the packed tensor is no parameter
    w2 = torch.randn(96, 40, generator=g)
    layer.set_weight(w2)
    assert torch.allclose(layer(x), F.linear(x, w2, b if with_bias else None), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="shape"):
        layer.set_weight(torch.randn(40, 96))
    with torch.inference_mode():  # the engine's mode; and leading dimensions as a batch of sequences has them
        x3 = torch.randn(2, rows, 40, generator=g)
        assert torch.allclose(layer(x3), F.linear(x3, w2, b if with_bias else None), rtol=1e-5, atol=1e-5)


def test_mkl_packs_fp32_only():
    with pytest.raises(ValueError, match="no packed bfloat16 linear on 'mkl'"):
        PackedLinear(torch.zeros(8, 8), dtype=torch.bfloat16, kernel="mkl")


def test_the_pick_weighs_one_row_and_a_batch():
    # (ms at 1 row, ms at BATCH_ROWS) per kernel, as measured on the CPUs the module docstring names
    amd = {"torch": (0.36, 0.90), "onednn": (0.13, 0.40), "mkl": (0.35, 0.80)}
    assert lk.pick(amd) == "onednn"  # MKL's slow path on AMD: oneDNN wins both
    xeon_avx2 = {"torch": (0.286, 0.884), "onednn": (0.448, 0.800), "mkl": (0.336, 0.625)}
    assert lk.pick(xeon_avx2) == "mkl"  # a batch 1.41x faster for a single stream 17% slower
    xeon_native = {"torch": (0.228, 0.695), "onednn": (0.404, 0.543), "mkl": (0.300, 0.577)}
    assert lk.pick(xeon_native) == "torch"  # together 1.05x: under MIN_GAIN
    costly = {"torch": (0.16, 0.40), "onednn": (0.30, 0.50), "mkl": (0.33, 0.20)}
    assert lk.pick(costly) == "torch"  # the batch gain would cost a single stream twice the time
    close = {"torch": (0.20, 0.40), "mkl": (0.20, 0.38)}
    assert lk.pick(close) == "torch"  # within MIN_GAIN: torch's kernel stays
    assert lk.pick({"torch": (0.20, 0.40)}) == "torch"
    assert lk.pick({"torch": (0.212, 0.806), "onednn": (0.440, 0.808), "mkl": (0.319, 0.583)}) == "mkl"  # another start


def test_choice_follows_the_timing_and_the_pins(monkeypatch):
    shapes = [(64, 32), (128, 32), (49152, 576)]
    monkeypatch.setattr(lk, "onednn_available", lambda: True)
    monkeypatch.setattr(lk, "mkl_available", lambda: True)
    seen = []

    def fake(times):
        def measure(out, inp, dtype=torch.float32, kernels=lk.PACKED_KERNELS):
            seen.append((out, inp))
            return times
        return measure

    monkeypatch.setattr(lk, "measure", fake({"torch": (3.0, 6.0), "onednn": (1.0, 2.0), "mkl": (2.9, 5.0)}))
    assert choose("auto", shapes) == "onednn"
    assert seen == [(128, 32)]  # the widest layer, not the streaming LM head
    monkeypatch.setattr(lk, "measure", fake({"torch": (1.0, 2.0), "onednn": (0.95, 1.9), "mkl": (1.0, 1.9)}))
    assert choose("auto", shapes) == "torch"
    assert [choose(k, shapes) for k in ("torch", "onednn", "mkl")] == ["torch", "onednn", "mkl"]
    monkeypatch.setattr(lk, "onednn_available", lambda: False)
    monkeypatch.setattr(lk, "mkl_available", lambda: False)
    assert choose("auto", shapes) == "torch"
    with pytest.raises(ValueError, match="no working oneDNN"):
        choose("onednn", shapes)
    with pytest.raises(ValueError, match="no working MKL"):
        choose("mkl", shapes)
    with pytest.raises(ValueError, match="unknown linear kernel"):
        choose("blas", shapes)


def test_measure_times_every_kernel_that_runs_here_at_both_row_counts():
    lk.measure.cache_clear()
    times = lk.measure(64, 48, budget_s=0.001)
    expected = {"torch"} | {k for k in lk.PACKED_KERNELS if lk.packs(k)}
    assert set(times) == expected
    assert all(len(t) == 2 and t[0] > 0 and t[1] > 0 for t in times.values())
    assert set(lk.measure(64, 48, budget_s=0.001, kernels=("onednn",))) == {"torch"} | ({"onednn"} & expected)
    lk.measure.cache_clear()


def test_the_choice_leaves_the_global_generator_alone():
    # a seeded run (a trainer's rollouts) that builds an engine must draw what it drew without one
    lk.measure.cache_clear()
    lk.onednn_available.cache_clear()
    state = torch.get_rng_state()
    choose("auto", [(96, 40)])
    assert torch.equal(torch.get_rng_state(), state)


def _tiny(seed=0):
    cfg = tiny_config(vocab=64, hidden=64, layers=2, heads=4, kv_heads=2)
    return cfg, CausalLM.from_weights(cfg, tiny_state(cfg, seed))


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_packed_model_computes_the_same_logits(kernel):
    _, plain = _tiny()
    _, packed = _tiny()
    # qkv, o, gate_up, down per layer + the (tied) LM head
    assert len(pack_linears(packed, kernel=kernel)) == 2 * 4 + 1
    assert packed.lm_head.kernel == kernel
    assert isinstance(packed.lm_head, PackedLinear) and not isinstance(plain.lm_head, PackedLinear)
    ids = [3, 14, 15, 9, 2, 6]
    assert torch.allclose(_logits(packed, ids), _logits(plain, ids), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_new_weights_reach_a_packed_model_and_its_tied_head(kernel):
    cfg, packed = _tiny(seed=0)
    pack_linears(packed, kernel=kernel)
    _, other = _tiny(seed=1)  # the weights a training step would sync: every tensor different
    weights = {n: p.detach() for n, p in other.named_parameters()}
    assert "lm_head.weight" not in weights  # tied: only the embedding is named
    n, size = pack_weights_into(packed, weights)
    assert n == len(weights) and size == sum(t.numel() * 4 for t in weights.values())
    ids = [5, 1, 7, 7, 30]
    assert torch.allclose(_logits(packed, ids), _logits(other, ids), rtol=1e-4, atol=1e-5)
    assert torch.equal(packed.lm_head.weight, other.embed_tokens.weight)  # the head followed the embedding
    with pytest.raises(KeyError, match="no parameter"):
        pack_weights_into(packed, {"layers.0.mlp.nope.weight": torch.zeros(1)})


@needs_bf16_packing
def test_bf16_weights_round_the_weights_and_keep_fp32_out():
    g = torch.Generator().manual_seed(3)
    w, b, x = torch.randn(64, 48, generator=g), torch.randn(64, generator=g), torch.randn(5, 48, generator=g)
    layer = PackedLinear(w, b, dtype=torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.float32
    # bf16 arithmetic of the rounded operands: close to them, and not exactly the fp32 answer
    ref = F.linear(x.bfloat16().float(), w.bfloat16().float(), b.bfloat16().float())
    assert torch.allclose(y, ref, rtol=2e-2, atol=5e-2)
    assert not torch.equal(y, F.linear(x, w, b))
    assert torch.equal(layer.weight, w.bfloat16().float())


@needs_bf16_packing
def test_the_bf16_format_packs_every_linear_of_a_model():
    from mainspring.engine.quant_cache import quantize_for_engine

    _, plain = _tiny()
    _, model = _tiny()
    report = quantize_for_engine(model, None, "bf16")
    assert len(report.quantized) == 2 * 4 + 1 and all(
        isinstance(model.get_submodule(n), PackedLinear) and model.get_submodule(n).dtype == torch.bfloat16
        for n in report.quantized)
    ids = [3, 14, 15, 9, 2, 6]
    a, b = _logits(model, ids), _logits(plain, ids)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.8 and torch.allclose(a, b, atol=0.2)


@pytest.mark.skipif(lk.bf16_packing_available(), reason="this CPU packs bf16 weights")
def test_the_bf16_format_is_a_clear_error_where_the_cpu_cannot_pack_it():
    _, model = _tiny()
    with pytest.raises(ValueError, match="AVX-512"):
        lk.quantize_model_bf16(model)


@needs_bf16_packing
def test_a_bf16_model_packs_its_own_linears_and_keeps_its_logits():
    cfg = tiny_config(vocab=64, hidden=64, layers=2, heads=4, kv_heads=2)
    plain = CausalLM.from_weights(cfg, tiny_state(cfg, 0), torch.bfloat16)
    packed = CausalLM.from_weights(cfg, tiny_state(cfg, 0), torch.bfloat16)
    assert not lk.plain_linears(packed) and len(lk.plain_linears(packed, torch.bfloat16)) == 2 * 4 + 1
    assert len(pack_linears(packed, torch.bfloat16)) == 2 * 4 + 1
    assert not lk.plain_linears(packed, torch.bfloat16)
    assert isinstance(packed.lm_head, PackedLinear) and packed.lm_head.dtype == torch.bfloat16
    assert packed.embed_tokens.weight.dtype == torch.bfloat16  # the embedding keeps its dense rows
    ids = [3, 14, 15, 9, 2, 6]
    a, b = _logits(packed, ids), _logits(plain, ids)
    # the same bf16 operands, summed in another order: bf16 rounding apart, never further
    assert a.dtype == torch.float32 and torch.allclose(a, b, rtol=2e-2, atol=2e-2)


def test_the_bf16_choice_times_bf16_and_needs_bf16_packing(monkeypatch):
    shapes = [(64, 32), (128, 32)]
    monkeypatch.setattr(lk, "onednn_available", lambda: True)
    seen = []

    def measure(out, inp, dtype=torch.float32, kernels=lk.PACKED_KERNELS):
        seen.append(dtype)
        return {"torch": (2.0, 4.0), "onednn": (1.0, 2.0)}

    monkeypatch.setattr(lk, "measure", measure)
    monkeypatch.setattr(lk, "bf16_packing_available", lambda: True)
    assert choose("auto", shapes, torch.bfloat16) == "onednn" and seen == [torch.bfloat16]
    monkeypatch.setattr(lk, "bf16_packing_available", lambda: False)
    assert choose("auto", shapes, torch.bfloat16) == "torch"
    with pytest.raises(ValueError, match="bfloat16 linear"):
        choose("onednn", shapes, torch.bfloat16)
    assert choose("auto", shapes, torch.float16) == "torch"  # no packed fp16 kernel: torch's
    assert choose("auto", shapes) == "onednn" and seen[-1] == torch.float32  # fp32 still needs oneDNN only


@needs_mkl
def test_the_engine_on_mkl_packs_decodes_what_torchs_kernel_decodes(embedded):
    # the real model through the engine: batched decode steps (3 rows), prefill chunks, the packed LM head
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.params import SamplingParams

    prompts = ["The capital of France is", "def fibonacci(n):", "List three colours:\n1."]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = {}
    for kernel in ("torch", "mkl"):
        engine = LLMEngine(embedded, EngineConfig(kv_cache_mb=64, linear_kernel=kernel))
        assert engine.linear_kernel == kernel and engine.stats()["linear_kernel"] == kernel
        assert all(m.kernel == "mkl" for m in engine.model.modules() if isinstance(m, PackedLinear))
        outputs[kernel] = [o.token_ids for o in engine.generate(prompts, params)]
    assert outputs["mkl"] == outputs["torch"]
