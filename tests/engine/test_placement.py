"""MAINSPRING_DEVICE / MAINSPRING_DTYPE: resolved once, refused by name when this machine or this engine cannot run
them, and a bf16 engine on the embedded model that keeps weights and KV in bf16 and answers like the fp32 one."""

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


@pytest.mark.parametrize("option,setting", [
    (dict(quantization="int4"), "MAINSPRING_QUANTIZATION"), (dict(kv_policy=True), "MAINSPRING_KV_POLICY"),
    (dict(kv_disk=True), "MAINSPRING_KV_DISK_CACHE_MB"),
])
def test_cpu_only_options_are_refused_on_cuda_in_any_precision(option, setting):
    from mainspring.engine.placement import Placement

    kwargs = dict(quantization=None, kv_policy=False, kv_disk=False)
    for dtype in (torch.float32, torch.bfloat16):
        cuda = Placement(torch.device("cuda"), dtype)  # built directly: no GPU is needed to refuse
        check_supported(cuda, **kwargs)  # the plain engine runs there
        with pytest.raises(PlacementError, match=f"MAINSPRING_DEVICE=cuda with .*{setting}"):
            check_supported(cuda, **(kwargs | option))


@pytest.mark.parametrize("option,setting", [
    (dict(quantization="int4"), "MAINSPRING_QUANTIZATION"), (dict(kv_disk=True), "MAINSPRING_KV_DISK_CACHE_MB"),
])
def test_fp32_only_options_are_refused_in_bf16(option, setting):
    kwargs = dict(quantization=None, kv_policy=False, kv_disk=False) | option
    check_supported(resolve_placement("cpu", "fp32"), **kwargs)  # fp32 runs them all
    with pytest.raises(PlacementError, match=setting):
        check_supported(resolve_placement("cpu", "bf16"), **kwargs)
    check_supported(resolve_placement("cpu", "bf16"), quantization=None, kv_policy=True, kv_disk=False)  # runs


def test_settings_reach_the_engine_config_and_the_fast_variant_stays_fp32():
    s = Settings(device="cpu", dtype="bf16")
    config = EngineConfig.from_settings(s)
    assert (config.device, config.dtype) == ("cpu", "bf16")
    assert fast_engine_config(s).dtype == "fp32"  # its int4 linears take fp32 activations


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
    with pytest.raises(PlacementError, match="MAINSPRING_QUANTIZATION"):
        LLMEngine(embedded, EngineConfig(dtype="bf16", quantization="int4"))
    drafting = LLMEngine(embedded, EngineConfig(kv_cache_mb=16, dtype="bf16", speculative=SpeculativeConfig("ngram")))
    assert drafting.spec is not None  # runs in bf16 (tests/engine/test_speculative.py checks its tokens)
