"""MAINSPRING_DEVICE / MAINSPRING_DTYPE: resolved once, refused by name when this machine or this engine cannot run
them, and a bf16 engine on the embedded model that keeps weights and KV in bf16 and answers like the fp32 one."""

import dataclasses

import pytest
import torch

from mainspring.config import Settings
from mainspring.engine.config import EngineConfig
from mainspring.engine.engine import LLMEngine
from mainspring.engine.fast_variant import fast_engine_config
from mainspring.engine.linear_kernel import PackedLinear, plain_linears
from mainspring.engine.params import SamplingParams
from mainspring.engine.placement import PlacementError, check_supported, resolve_placement
from mainspring.engine.speculative import SpeculativeConfig


def test_auto_is_the_cpu_in_fp32_without_a_gpu_and_each_dtype_is_taken(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_placement() == resolve_placement("cpu", "fp32")
    auto = resolve_placement("auto", "auto")
    assert auto.device == torch.device("cpu") and auto.dtype == torch.float32 and auto.is_fp32
    assert resolve_placement("CPU", " bf16 ").dtype == torch.bfloat16
    assert resolve_placement("cpu", "fp16").dtype_name == "fp16"


@pytest.mark.parametrize("device,dtype,named", [
    ("gpu", "auto", "MAINSPRING_DEVICE='gpu'"), ("cuda:x", "auto", "MAINSPRING_DEVICE"),
    ("cpu", "float8", "MAINSPRING_DTYPE='float8'"), ("cpu", "", "MAINSPRING_DTYPE"),
])
def test_a_bad_value_is_refused_by_its_setting(device, dtype, named):
    with pytest.raises(PlacementError, match=named):
        resolve_placement(device, dtype)


def test_cuda_without_a_gpu_is_refused_and_with_one_auto_is_cuda_in_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PlacementError, match="no CUDA device"):
        resolve_placement("cuda", "bf16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(PlacementError, match="sees 1 CUDA device"):
        resolve_placement("cuda:1", "auto")
    auto = resolve_placement("auto", "auto")
    assert auto.device == torch.device("cuda") and auto.dtype == torch.bfloat16
    assert resolve_placement("cuda:0", "fp32").dtype == torch.float32
    assert resolve_placement("cpu", "auto").dtype == torch.float32  # the CPU keeps fp32 where a GPU is present


@pytest.mark.parametrize("method", ["int8", "int4-fp32", "bf16"])
def test_cpu_only_weight_formats_are_refused_on_cuda_in_any_precision(method, monkeypatch):
    from mainspring.engine.placement import Placement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for dtype in (torch.float32, torch.bfloat16):
        cuda = Placement(torch.device("cuda"), dtype)  # built directly: no GPU is needed to refuse
        check_supported(cuda, quantization=None)  # the plain engine runs there
        with pytest.raises(PlacementError, match=f"MAINSPRING_DEVICE=cuda with quantization '{method}'.*"
                                                 "MAINSPRING_QUANTIZATION"):
            check_supported(cuda, quantization=method)


def test_int4_runs_on_cuda_where_the_gpu_has_its_kernel(monkeypatch):
    from mainspring.engine.placement import Placement

    cuda = Placement(torch.device("cuda"), torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for method in ("int4", "int4-bf16"):
        check_supported(cuda, quantization=method)
    with pytest.raises(PlacementError, match="int4 and int4-bf16 run on CUDA"):
        check_supported(cuda, quantization="int8")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    with pytest.raises(PlacementError, match=r"compute capability 8.0 or newer \(this GPU has 7.5\)"):
        check_supported(cuda, quantization="int4")


def test_every_weight_format_runs_on_the_cpu_in_every_precision():
    for dtype in ("fp32", "bf16", "fp16"):  # quantized layers take any activations
        for method in (None, "int4", "int4-fp32", "int8", "bf16"):
            check_supported(resolve_placement("cpu", dtype), quantization=method)


def test_settings_reach_the_engine_config_and_the_fast_variant_stays_fp32_on_the_cpu():
    s = Settings(device="cpu", dtype="bf16")
    config = EngineConfig.from_settings(s)
    assert (config.device, config.dtype) == ("cpu", "bf16")
    assert fast_engine_config(s).dtype == "fp32"  # its int4 linears take fp32 activations
    assert fast_engine_config(s).quant_dense_prefill
    on_cuda = fast_engine_config(Settings(device="cuda", dtype="bf16"), "int4-bf16", device_type="cuda")
    assert (on_cuda.dtype, on_cuda.quantization, on_cuda.quant_dense_prefill) == ("bf16", "int4-bf16", None)
    assert on_cuda.speculative is not None and on_cuda.speculative.method == "ngram"


@pytest.mark.slow
def test_a_bf16_engine_keeps_weights_and_kv_in_bf16_and_answers(embedded):
    fp32 = LLMEngine(embedded, EngineConfig(kv_cache_mb=16, max_num_batched_tokens=256, dtype="fp32"))
    bf16 = LLMEngine(embedded, EngineConfig(kv_cache_mb=16, max_num_batched_tokens=256, dtype="bf16"))
    head = bf16.model.lm_head  # packed for oneDNN where it packs bf16 and wins the timing (linear_kernel.py)
    assert bf16.runner.cache.dtype == torch.bfloat16
    assert (head.dtype if isinstance(head, PackedLinear) else head.weight.dtype) == torch.bfloat16
    assert not plain_linears(bf16.model) and bf16.linear_kernel in ("torch", "onednn")  # no fp32 linear left
    assert bf16.stats()["dtype"] == "bf16" and fp32.stats()["dtype"] == "fp32"
    assert abs(bf16.block_manager.num_blocks - 2 * fp32.block_manager.num_blocks) <= 1  # half the bytes a block
    tok = bf16.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
    greedy = SamplingParams(temperature=0.0, max_tokens=12, logprobs=1)
    ours, ref = bf16.generate([prompt], greedy)[0], fp32.generate([prompt], greedy)[0]
    assert "Paris" in ours.text and "Paris" in ref.text
    assert ours.token_ids[:3] == ref.token_ids[:3]  # bf16 rounding may part ways later, not at once
    again = bf16.generate([prompt], greedy)[0]  # from the prefix cache, in bf16 blocks
    assert again.usage.cached_tokens > 0 and again.token_ids == ours.token_ids
    drafting = LLMEngine(embedded, EngineConfig(kv_cache_mb=16, dtype="bf16", speculative=SpeculativeConfig("ngram")))
    assert drafting.spec is not None  # runs in bf16 (tests/engine/test_speculative.py checks its tokens)


@pytest.mark.slow
def test_int4_in_bf16_runs_the_fp32_engines_int4_layers_and_keeps_their_greedy_picks(embedded):
    """The model is quantized from its fp32 weights in every precision (the cached forms are one per model), then
    the rest is cast: the same int4 layers as the fp32 engine's, bf16 embeddings and KV, RoPE tables kept fp32.
    Its greedy tokens are the fp32 int4 engine's picks up to bf16 rounding (a kept wrong token is nats below)."""
    from mainspring.engine.quant import Int4Linear
    from tests.engine.test_speculative import greedy_gaps

    config = EngineConfig(kv_cache_mb=16, max_num_batched_tokens=256, quantization="int4")
    fp32 = LLMEngine(embedded, config)
    bf16 = LLMEngine(embedded, dataclasses.replace(config, dtype="bf16"))
    assert bf16.quant_report.cache_file == fp32.quant_report.cache_file and bf16.quant_report.from_cache
    assert len(bf16.quant_report.quantized) == 121 and isinstance(bf16.model.lm_head, Int4Linear)
    for name in ("layers.0.self_attn.qkv_proj", "layers.29.mlp.down_proj", "lm_head"):
        ours, theirs = bf16.model.get_submodule(name), fp32.model.get_submodule(name)
        assert torch.equal(ours.packed, theirs.packed) and torch.equal(ours.scales_and_zeros, theirs.scales_and_zeros)
    assert bf16.model.embed_tokens.weight.dtype == torch.bfloat16 and bf16.model.norm.weight.dtype == torch.bfloat16
    assert bf16.model.rope.cos.dtype == torch.float32 and bf16.runner.cache.dtype == torch.bfloat16
    assert not plain_linears(bf16.model, torch.float32)
    tok = bf16.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
               for q in ("What is the capital of France?", "Name three colours.")] + [tok.encode("1, 2, 3, 4, 5,")]
    outs = bf16.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    gaps = [max(greedy_gaps(fp32, p, o.token_ids)) for p, o in zip(prompts, outs)]
    assert max(gaps) <= 0.5, (gaps, [o.text for o in outs])  # the first answer's first token is a near tie
