"""The fused CPU kernels (engine/native_ops.py): built once, right within fp32 rounding, taken only where they fit,
and off with a reason where the CPU, the compiler or the setting rules them out."""

import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

from mainspring.config import get_settings
from mainspring.engine import native_ops
from mainspring.engine.cpu import CpuFeatures, detect

OPS, STATUS = native_ops.load(get_settings().cache_dir)
# the build with no ISA flags, which every CPU of this architecture runs (on x86 CPUs with AVX2 OPS is the other)
PORTABLE, PORTABLE_STATUS = native_ops.load(get_settings().cache_dir, CpuFeatures(detect().arch, "", frozenset()))
# CI installs a C compiler: where there is one, a kernel that does not build is a failure
needs_ops = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason=f"no C compiler: {STATUS}")


@needs_ops
def test_the_kernels_build_and_load_here_in_this_cpus_variant_and_the_portable_one():
    assert OPS is not None and PORTABLE is not None, (STATUS, PORTABLE_STATUS)
    name, _ = native_ops.variant(detect())
    assert STATUS == f"on ({OPS.path.name}, {name})" and OPS.path.exists()
    assert PORTABLE_STATUS == f"on ({PORTABLE.path.name}, portable)"
    assert (PORTABLE.path == OPS.path) == (name == "portable")  # flags are part of the file's key


def test_the_variant_follows_the_cpus_features():
    def variant(arch, *flags):
        return native_ops.variant(CpuFeatures(arch, "", frozenset(flags)))

    assert variant("x86_64", "avx2", "fma", "avx512f") == ("avx2", native_ops.AVX2_FLAGS)
    assert variant("x86_64", "avx2") == ("portable", ())  # AVX2 without FMA: the build asks for both
    assert variant("x86_64") == ("portable", ())
    assert variant("aarch64", "asimd", "sve") == ("portable", ())  # NEON is aarch64's baseline: no flag needed
    assert variant("aarch64", "avx2", "fma") == ("portable", ())  # x86 flags on another arch mean nothing


def both_builds(test):
    return pytest.mark.parametrize("build", ["this_cpu", "portable"])(needs_ops(test))


def ops_of(build: str) -> native_ops.FusedOps:
    ops = OPS if build == "this_cpu" else PORTABLE
    assert ops is not None, (STATUS, PORTABLE_STATUS)
    return ops


@both_builds
@pytest.mark.parametrize("rows,d", [(1, 576), (3, 576), (8, 64), (2, 70), (1, 5), (native_ops.MAX_ROWS, 576)])
def test_each_kernel_matches_torch_within_fp32_rounding(rows, d, build):
    ops = ops_of(build)
    torch.manual_seed(rows * 100 + d)
    x, r, w = torch.randn(rows, d) * 3, torch.randn(rows, d), torch.randn(d)
    before = x.clone(), r.clone()
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5), F.rms_norm(x, (d,), w, 1e-5), rtol=2e-6, atol=2e-6)
    total, normed = ops.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(total, x + r)  # one fp32 add each: exactly torch's
    torch.testing.assert_close(normed, F.rms_norm(x + r, (d,), w, 1e-6), rtol=2e-6, atol=2e-6)
    gate_up = torch.randn(rows, 2 * d) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(ops.silu_mul(gate_up), F.silu(gate) * up, rtol=2e-6, atol=2e-6)
    assert torch.equal(x, before[0]) and torch.equal(r, before[1])  # inputs are read, never written


@both_builds
def test_silu_holds_over_the_whole_range_of_gates(build):
    """silu_mul computes exp by its own polynomial (libm's expf does not vectorize): within fp32 rounding of
    torch's over gates far beyond what a model produces, and sane at the extremes."""
    ops = ops_of(build)
    gate = torch.cat([torch.linspace(-150, 150, 30001), torch.randn(5000) * 6,
                      torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e30, -1e30])])
    up = torch.rand_like(gate) + 0.5
    got = ops.silu_mul(torch.cat([gate, up]).view(1, -1))[0]
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=2e-6, atol=2e-6)
    assert got[-2] == gate[-2] * up[-2]  # silu(g) -> g for large g
    assert got[-1] <= 0 and got[-1] > -1e-6  # and -> -0 for large -g
    nan = ops.silu_mul(torch.tensor([[float("nan"), 1.0]]))
    assert torch.isnan(nan).all()


@both_builds
@pytest.mark.parametrize("rows", [1, 3, 8, native_ops.MAX_ROWS])
def test_rope_and_the_kv_write_match_rotation_and_index_copy(rows, build):
    from mainspring.engine.layers import RotaryEmbedding

    ops = ops_of(build)
    h, kvh, d, slots_n = 6, 2, 16, max(40, 2 * rows)
    torch.manual_seed(rows)
    rope = RotaryEmbedding(d, 64, 10000.0, None)
    positions = torch.randint(0, 64, (rows,))
    rot = rope.at(positions)
    qkv = torch.randn(rows, (h + 2 * kvh) * d)
    slots = torch.randperm(slots_n)[:rows]
    k_cache, v_cache = torch.zeros(slots_n, kvh, d), torch.zeros(slots_n, kvh, d)
    qk = ops.rope_write_kv(qkv, rot.cos, rot.signed_sin, slots, k_cache, v_cache, h, kvh)
    want = rot.apply(qkv[:, : (h + kvh) * d].view(rows, h + kvh, d))
    torch.testing.assert_close(qk, want, rtol=2e-6, atol=2e-6)
    k_want, v_want = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    k_want.index_copy_(0, slots, want[:, h:])
    v_want.index_copy_(0, slots, qkv[:, (h + kvh) * d :].view(rows, kvh, d))
    torch.testing.assert_close(k_cache, k_want, rtol=2e-6, atol=2e-6)
    assert torch.equal(v_cache, v_want)  # values are copied as they are
    # a slot past the cache is refused, and nothing is written there
    with pytest.raises(IndexError, match="1 of 1 KV slots out of range"):
        ops.rope_write_kv(qkv[:1], rot.cos[:1], rot.signed_sin[:1], torch.tensor([slots_n]), k_cache, v_cache,
                          h, kvh)


def test_fits_takes_only_few_row_contiguous_fp32_cpu_tensors_without_gradients():
    fits = native_ops.FusedOps.fits
    x = torch.randn(2, 16)
    assert fits(x, torch.ones(16))
    assert not fits(x.to(torch.bfloat16))
    assert not fits(torch.randn(16, 2).T)  # not contiguous
    assert not fits(torch.randn(native_ops.MAX_ROWS + 1, 16))  # a prefill: torch's ops
    assert not fits(torch.randn(1, 2, 16))
    assert not fits(x, torch.ones(16, dtype=torch.bfloat16))
    w = torch.ones(16, requires_grad=True)
    assert not fits(x, w)  # the kernels have no backward
    with torch.no_grad():
        assert fits(x, w)


def test_off_with_a_reason_without_a_compiler(tmp_path, monkeypatch):
    monkeypatch.setattr(native_ops.shutil, "which", lambda name: None)
    for features in (CpuFeatures("x86_64", "", frozenset({"avx2", "fma"})), CpuFeatures("aarch64", "", frozenset())):
        assert native_ops.load(tmp_path, features) == (None, "off: no C compiler (cc or gcc) on the PATH")
    assert not (tmp_path / "kernels").exists()


@needs_ops
def test_a_source_that_does_not_compile_leaves_the_kernels_off_and_no_file(tmp_path, monkeypatch):
    bad = tmp_path / "broken.c"
    bad.write_text("void ms_rms_norm( {\n")
    monkeypatch.setattr(native_ops, "SOURCE", bad)
    ops, status = native_ops.load(tmp_path / "cache")
    assert ops is None and status.startswith("off: ") and "failed on broken.c" in status
    assert list((tmp_path / "cache" / "kernels").iterdir()) == []  # no half-written library left behind


@needs_ops
def test_the_library_is_compiled_once_and_reused(tmp_path, monkeypatch):
    ops, status = native_ops.load(tmp_path)
    assert ops is not None, status
    compiled = []
    real_run = subprocess.run

    def spy(cmd, *args, **kwargs):
        compiled.append("-shared" in cmd)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(native_ops.subprocess, "run", spy)
    again, _ = native_ops.load(tmp_path)
    assert again is not None and again.path == ops.path
    assert compiled == [False]  # only `cc --version`, for the cache key


@both_builds
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_decode_steps_on_the_kernels_match_transformers(arch, build, monkeypatch):
    """Prefill (more than MAX_ROWS rows) stays on torch's ops; each decode row runs every RMSNorm and MLP on the
    kernels; the logits match transformers' as torch's ops do (tests/engine/test_model.py)."""
    from mainspring.engine.attention import AttentionMetadata
    from tests.engine.test_model import BLOCK, TOLERANCE, hf_logits, new_cache, ours_from, tiny_hf

    ops = ops_of(build)

    hf = tiny_hf(arch)
    ours = ours_from(hf)
    # per layer 2 norms, the attention and the MLP; and the final norm
    assert native_ops.attach(ours, ops) == 4 * len(ours.layers) + 1
    calls = {"rms_norm": 0, "add_rms_norm": 0, "silu_mul": 0, "rope_write_kv": 0}
    for name in calls:
        def counted(*args, _name=name, _real=getattr(ops, name)):
            calls[_name] += 1
            return _real(*args)
        monkeypatch.setattr(ops, name, counted)  # every module holds this one instance
    torch.manual_seed(3)
    prefill = native_ops.MAX_ROWS + 6
    ids = torch.randint(0, 97, (prefill + 4,)).tolist()
    table = list(range(-(-len(ids) // BLOCK)))
    cache = new_cache(ours)
    with torch.no_grad():
        got = [ours.compute_logits(ours(torch.tensor(ids[:prefill]), torch.arange(prefill), cache,
                                        AttentionMetadata.build([], [(table, 0, prefill)], BLOCK)))]
        assert set(calls.values()) == {0}  # more than MAX_ROWS rows: torch's ops
        for n in range(prefill, len(ids)):
            meta = AttentionMetadata.build([(table, n + 1)], [], BLOCK)
            got.append(ours.compute_logits(ours(torch.tensor([ids[n]]), torch.tensor([n]), cache, meta)))
    layers = len(ours.layers)
    assert calls == {"rms_norm": 4 * (layers + 1), "add_rms_norm": 4 * layers, "silu_mul": 4 * layers,
                     "rope_write_kv": 4 * layers}
    tol = TOLERANCE[torch.float32]
    torch.testing.assert_close(torch.cat(got), hf_logits(hf, ids), atol=tol, rtol=tol)


@needs_ops
@pytest.mark.slow
def test_the_engine_on_the_kernels_decodes_what_torchs_ops_decode(embedded):
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.layers import RMSNorm
    from mainspring.engine.params import SamplingParams

    prompts = ["The capital of France is", "def fibonacci(n):", "List three colours:\n1."]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = {}
    for on in (False, True):
        engine = LLMEngine(embedded, EngineConfig(kv_cache_mb=64, native_kernels=on))
        status = engine.stats()["fused_kernels"]
        assert status.startswith("on (") if on else status == "off: MAINSPRING_NATIVE_KERNELS off"
        norms = [m for m in engine.model.modules() if isinstance(m, RMSNorm)]
        assert norms and all((m.fused is not None) == on for m in norms)
        outputs[on] = [o.token_ids for o in engine.generate(prompts, params)]
    assert outputs[True] == outputs[False]
