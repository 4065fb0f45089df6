"""The -fast engine's weight format per CPU: feature parsing and candidates on faked CPUs, the pick
on faked timings and accuracies, the int8 kernel's numerics where this torch has it, the measurement
on real kernels and the cache keyed by CPU features (a tiny random model: no CPU-specific result)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from mainspring.engine import kernel_choice as kc
from mainspring.engine.cpu import CpuFeatures, parse_cpuinfo
from mainspring.engine.quant_int8 import Int8Linear, available

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13 64-Core Processor
flags\t\t: fpu vme sse sse2 ssse3 fma sse4_1 avx f16c avx2 bmi2 sha_ni
"""
SAPPHIRE = """model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: fpu avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8
"""
GRAVITON = """processor\t: 0
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimddp sve i8mm bf16 svebf16
CPU implementer\t: 0x41
"""
OLD_X86 = "model name\t: Intel(R) Core(TM)2 Duo\nflags\t\t: fpu sse sse2 ssse3\n"


def test_cpuinfo_parsing_keeps_the_features_a_choice_depends_on():
    epyc = parse_cpuinfo(EPYC, "x86_64", "AVX2")
    assert epyc.flags == {"avx2", "fma", "f16c"} and epyc.model.startswith("AMD EPYC")
    assert not epyc.bf16 and epyc.int8_gemm and epyc.x86 and not epyc.arm
    spr = parse_cpuinfo(SAPPHIRE, "x86_64", "AVX512")
    assert spr.bf16 and spr.int8_gemm and "amx_bf16" in spr.flags
    arm = parse_cpuinfo(GRAVITON, "aarch64")
    assert arm.arm and arm.bf16 and arm.int8_gemm and arm.flags == {"asimd", "asimddp", "sve", "i8mm", "bf16",
                                                                     "svebf16"}
    old = parse_cpuinfo(OLD_X86, "x86_64")
    assert not old.flags and not old.int8_gemm
    # the key follows the relevant features only: another AVX2 model, same key; AVX-512, another
    other = parse_cpuinfo(EPYC.replace("7B13", "9654").replace("sha_ni", "sha_ni rdrand"), "x86_64", "AVX2")
    assert other.key == epyc.key != spr.key and len({epyc.key, spr.key, arm.key, old.key}) == 4


def test_a_capped_torch_vectorisation_level_hides_the_features_above_it():
    # ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine: choose as on an AVX2 one (AMX and AVX512-BF16 unused)
    capped = parse_cpuinfo(SAPPHIRE, "x86_64", "AVX2")
    assert capped.flags == {"avx2", "fma", "f16c"} and not capped.bf16 and capped.int8_gemm
    assert kc.candidates(capped, True, onednn=True) == ["int4-bf16", "int8", "int4-fp32", "fp32"]
    assert capped.key != parse_cpuinfo(SAPPHIRE, "x86_64", "AVX512").key  # a choice cached apart
    assert parse_cpuinfo(SAPPHIRE, "x86_64", "DEFAULT").flags == capped.flags
    assert parse_cpuinfo(GRAVITON, "aarch64", "DEFAULT").bf16  # no such cap on ARM


@pytest.mark.parametrize("cpu, arch, int8, want", [
    (SAPPHIRE, "x86_64", True, ["int4-bf16", "bf16", "int8", "int4-fp32", "fp32"]),
    # no native bf16: no bf16 weights, but int4 on bf16 activations converted in software (measured, not assumed)
    (EPYC, "x86_64", True, ["int4-bf16", "int8", "int4-fp32", "fp32"]),
    (EPYC, "x86_64", False, ["int4-bf16", "int4-fp32", "fp32"]),  # a torch without the quantized engine
    (GRAVITON, "aarch64", True, ["int4-bf16", "bf16", "int8", "int4-fp32", "fp32"]),
    (OLD_X86, "x86_64", True, ["int4-bf16", "int4-fp32", "fp32"]),
])
def test_candidates_follow_the_cpu(cpu, arch, int8, want):
    assert kc.candidates(parse_cpuinfo(cpu, arch), int8, onednn=True) == want
    # a torch without a working oneDNN linear offers no bf16 weights
    assert "bf16" not in kc.candidates(parse_cpuinfo(cpu, arch), int8, onednn=False)


def fixed(table):
    calls = []

    def check(name):
        calls.append(name)
        return table[name]
    return check, calls


GOOD, BAD = {"top1": 0.97, "ppl_ratio": 1.01}, {"top1": 0.6, "ppl_ratio": 1.4}


def test_the_fastest_format_within_the_bound_wins_and_slower_ones_are_not_checked():
    check, calls = fixed({"int8": GOOD, "int4-bf16": GOOD})
    name, why, checked = kc.pick({"int4-bf16": 2.0, "int8": 1.0, "fp32": 5.0, "int4-fp32": 40.0}, check,
                                 kc.AccuracyBound())
    assert name == "int8" and calls == ["int8"] and "5.00x fp32" in why and checked == {"int8": GOOD}


def test_a_faster_format_that_misses_the_bound_gives_way():
    check, calls = fixed({"int8": BAD, "int4-bf16": GOOD})
    name, _, checked = kc.pick({"int4-bf16": 2.0, "int8": 1.0, "fp32": 5.0}, check, kc.AccuracyBound())
    assert name == "int4-bf16" and calls == ["int8", "int4-bf16"] and checked["int8"] == BAD


def test_fp32_when_nothing_faster_passes_or_nothing_is_faster():
    check, calls = fixed({"int8": BAD})
    name, why, _ = kc.pick({"int8": 1.0, "fp32": 5.0, "int4-fp32": 40.0}, check, kc.AccuracyBound())
    assert name == "fp32" and "miss the accuracy bound (int8)" in why and calls == ["int8"]
    check, calls = fixed({})
    name, why, _ = kc.pick({"int8": 7.0, "fp32": 5.0}, check, kc.AccuracyBound())
    assert name == "fp32" and "no quantized format is faster" in why and calls == []  # fp32 needs no check


@pytest.mark.skipif(not available(), reason="this torch build has no quantized CPU engine")
def test_int8_linear_numerics():
    torch.manual_seed(0)
    w, b, x = torch.randn(96, 64) * 0.05, torch.randn(96) * 0.1, torch.randn(3, 5, 64)
    ref = F.linear(x, w, b)
    got = Int8Linear(w, b)(x)
    assert got.shape == ref.shape and got.dtype == x.dtype
    assert ((got - ref).norm() / ref.norm()).item() < 3e-2  # 8-bit weights, 7-bit activations
    assert Int8Linear(w, b)(x.to(torch.bfloat16)).dtype == torch.bfloat16


def tiny_loaded():
    from tests.train.tiny import tiny_config, tiny_state

    cfg = tiny_config(vocab=64, hidden=64, layers=1, heads=4, kv_heads=2)
    return SimpleNamespace(name="tiny", path=None, config=cfg, state_dict=tiny_state(cfg))


def test_measurement_times_every_candidate_on_the_models_shapes():
    from mainspring.engine.model import CausalLM

    loaded = tiny_loaded()
    shapes = kc.linear_shapes(CausalLM.from_weights(loaded.config, loaded.state_dict))
    assert sum(shapes.values()) == 5 and (64, 64) in shapes  # qkv, o, gate_up, down, lm_head (tied, 64x64)
    names = ["int4-fp32", "fp32"] + (["int8"] if available() else [])
    ms = kc.measure(names, shapes, rows=(1, 6), budget_s=0.001)
    assert set(ms) == set(names) and all(v > 0 for v in ms.values())


def test_each_shape_is_timed_over_distinct_weights_as_a_forward_streams_them(monkeypatch):
    built = []

    def build(name, weight):
        built.append((name, weight.shape, weight.data_ptr()))
        return lambda x: x @ weight.T

    monkeypatch.setattr(kc, "build_linear", build)
    monkeypatch.setattr(kc, "STREAM_BYTES", 3 * 16 * 8 * 4)  # room for three 16x8 fp32 copies
    kc.measure(["fp32"], Counter({(16, 8): 5, (4, 8): 2}), rows=(1,), budget_s=0.0)
    big = [b for b in built if b[1] == (16, 8)]
    small = [b for b in built if b[1] == (4, 8)]
    # capped by the byte budget (3 of the 5 the forward runs), all by its count (2), each a distinct tensor
    assert len(big) == 3 and len(small) == 2 and len({b[2] for b in big + small}) == 5


def test_candidates_take_turns_and_keep_their_best_round(monkeypatch):
    """A burst of load during one candidate's only measurement used to decide the choice; now each takes ROUNDS
    turns in rotation and keeps its best, and one far slower than the fastest takes no more turns."""
    times = {"int4-bf16": [5e-3, 1e-3, 1e-3], "bf16": [2e-3, 2e-3, 2e-3], "int4-fp32": [50e-3]}
    calls = []

    def timed(fns, x, budget_s):
        name = fns[0]
        calls.append(name)
        return times[name].pop(0)

    monkeypatch.setattr(kc, "build_linear", lambda name, weight: name)
    monkeypatch.setattr(kc, "seconds_per_call", timed)
    ms = kc.measure(list(times), Counter({(16, 8): 2}), rows=(1,), rounds=3)
    assert calls == ["int4-bf16", "bf16", "int4-fp32", "int4-bf16", "bf16", "int4-bf16", "bf16"]
    assert ms == {"int4-bf16": 2.0, "bf16": 4.0, "int4-fp32": 100.0}  # best per call x 2 linears, in ms


def test_the_choice_is_cached_per_cpu_features(tmp_path, monkeypatch):
    monkeypatch.setattr(kc, "measure", lambda names, shapes, rows, budget_s=0: {n: float(i + 1) for i, n in
                                                                                 enumerate(names)})
    check, calls = fixed({"int8": GOOD, "int4-bf16": GOOD, "int4-fp32": GOOD})
    epyc = parse_cpuinfo(EPYC, "x86_64", "AVX2")
    first = kc.choose_kernel(tiny_loaded(), tmp_path, threads=1, verify_rows=6, features=epyc, check=check)
    want = "int4-bf16"  # the first candidate everywhere, and the fastest under this fake timing
    assert first.name == want and not first.from_cache and first.cpu["key"] == epyc.key
    again = kc.choose_kernel(tiny_loaded(), tmp_path, threads=1, verify_rows=6, features=epyc, check=check)
    assert again.from_cache and again.name == want and again.ms_per_step == first.ms_per_step and len(calls) == 1
    spr = kc.choose_kernel(tiny_loaded(), tmp_path, threads=1, verify_rows=6,
                           features=parse_cpuinfo(SAPPHIRE, "x86_64", "AVX512"), check=check)
    assert spr.name == "int4-bf16" and not spr.from_cache  # another CPU: measured again
    assert len(list((tmp_path / "kernels").glob("*.json"))) == 2
    (next((tmp_path / "kernels").glob("*.json"))).write_text("{not json")  # a broken cache: measured again
    assert isinstance(kc.choose_kernel(tiny_loaded(), tmp_path, threads=1, verify_rows=6, features=epyc,
                                       check=check), kc.KernelChoice)


def test_a_pinned_or_unknown_fast_kernel_setting():
    from mainspring.config import Settings
    from mainspring.engine.fast_variant import fast_kernel

    assert fast_kernel(Settings(fast_kernel="FP32"), tiny_loaded()).quantization is None
    assert fast_kernel(Settings(fast_kernel="int4-bf16"), tiny_loaded()).quantization == "int4-bf16"
    with pytest.raises(ValueError, match="MAINSPRING_FAST_KERNEL='int3'"):
        fast_kernel(Settings(fast_kernel="int3"), tiny_loaded())


def test_features_of_this_machine_are_consistent():
    from mainspring.engine.cpu import detect

    f = detect()
    assert isinstance(f, CpuFeatures) and f.key and f.summary().startswith(f.arch)


def test_the_linear_kernel_measured_at_first_start_is_taken_at_later_ones(tmp_path, monkeypatch):
    measured = []

    def fake_choose(kernel, shapes, dtype=torch.float32, kernels=()):
        measured.append(kernel)
        return "torch" if kernel == "auto" else kernel

    monkeypatch.setattr(kc, "choose", fake_choose)
    monkeypatch.setattr(kc, "detect", lambda: parse_cpuinfo(EPYC, "x86_64", "AVX2"))
    shapes = [(1536, 576), (576, 576), (49152, 576)]
    assert kc.choose_linear_kernel("auto", shapes, cache_dir=tmp_path) == "torch" and len(measured) == 1
    [cached] = (tmp_path / "kernels").glob("linear-*.json")
    assert "1536x576" in cached.name  # the shape timed: the widest but the LM head's
    assert kc.choose_linear_kernel("auto", shapes, cache_dir=tmp_path) == "torch" and len(measured) == 1
    kc.choose_linear_kernel("auto", [(2048, 576)], cache_dir=tmp_path)  # another model's shapes: measured
    monkeypatch.setattr(kc, "detect", lambda: parse_cpuinfo(SAPPHIRE, "x86_64", "AVX512"))
    kc.choose_linear_kernel("auto", shapes, cache_dir=tmp_path)  # another CPU: measured
    assert len(measured) == 3
    monkeypatch.setattr(kc, "detect", lambda: parse_cpuinfo(EPYC, "x86_64", "AVX2"))
    cached.write_text('{"format": "%s", "kernel": "no-such-kernel"}' % kc.LINEAR_CHOICE_FORMAT)
    assert kc.choose_linear_kernel("auto", shapes, cache_dir=tmp_path) == "torch" and len(measured) == 4
    cached.write_text("{not json")
    assert kc.choose_linear_kernel("auto", shapes, cache_dir=tmp_path) == "torch" and len(measured) == 5
    assert kc.choose_linear_kernel("torch", shapes, cache_dir=tmp_path) == "torch"  # pinned: never cached
    assert kc.choose_linear_kernel("auto", shapes) == "torch" and len(measured) == 7  # no cache dir: measured
