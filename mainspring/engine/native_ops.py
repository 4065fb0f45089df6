"""Fused CPU kernels for the small ops between a decode step's GEMVs, compiled from native/fused_ops.c.

A single-stream decode step on the CPU is ~120 GEMVs, each streaming more than a core's L2 cache, and between
them a layer's small ops: RMSNorms, residual adds, RoPE, the K/V write, SiLU × up. Each finds its code and data
evicted by the GEMV before it and fetches them back from L3. Measured on an Intel Xeon (2 cores, capped at AVX2):
`F.rms_norm` on one 576-wide row takes 11-16 µs in a loop and 80-100 µs right after an 8 MB GEMV, a residual `add`
30-40 µs; together a third of a 52 ms step. The same norm fused with its add, in a few hundred bytes of C called
through ctypes, took 17-25 µs after the same GEMV (docs/benchmarks.md, "Where a single-stream decode step's time
goes").

So where a C compiler is on the PATH, the engine compiles that file once (under the cache dir's kernels/, keyed
by the source, the compiler and its flags: ~1 s) and loads it, and its model's RMSNorms, attentions and MLPs take
these kernels for steps of at most MAX_ROWS rows in fp32 (decode batches, speculative verification). The build is
chosen by what the CPU has (`variant`): the file is plain loops, compiled with -mavx2 -mfma on x86 CPUs with both,
otherwise for the target's baseline (NEON on ARM, SSE2 on older x86); the compiler vectorizes them either way.
Larger steps (prefill), other dtypes and devices stay on torch's ops. Results agree with torch's within fp32
rounding, not bit for bit. Without a compiler, or with MAINSPRING_NATIVE_KERNELS off, nothing changes, and the
engine's log line and /health say why.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import nn

from mainspring.engine.cpu import CpuFeatures, detect

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "fused_ops.c"
FLAGS = ("-O3", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math")
AVX2_FLAGS = ("-mavx2", "-mfma")
# a decode step's rows (one per sequence), or a speculative verification's; larger prefill chunks stay on torch's
# ops, which use every thread. After a GEMM the kernels won at every row count timed up to 256 (add + RMSNorm 40
# against 120 µs at 32 rows, SiLU x up 69 against 86); a decode step of 32 sequences 172 -> 159 ms with 64 here
MAX_ROWS = 64

_P, _L, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_float
_SIGNATURES = {
    "ms_rms_norm": (_P, _P, _P, _L, _L, _F),
    "ms_add_rms_norm": (_P, _P, _P, _P, _P, _L, _L, _F),
    "ms_silu_mul": (_P, _P, _L, _L),
    "ms_rope_write_kv": (_P, _P, _P, _P, _P, _P, _P, _L, _L, _L, _L, _L),
}


class FusedOps:
    """The loaded kernels. Each method takes contiguous 2-D fp32 CPU tensors that `fits` accepted."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.path = path
        for name, args in _SIGNATURES.items():
            getattr(lib, name).argtypes = args
            getattr(lib, name).restype = None
        lib.ms_rope_write_kv.restype = _L
        self._rms_norm, self._add_rms_norm, self._silu_mul = lib.ms_rms_norm, lib.ms_add_rms_norm, lib.ms_silu_mul
        self._rope_write_kv = lib.ms_rope_write_kv

    @staticmethod
    def fits(x: torch.Tensor, weight: torch.Tensor | None = None) -> bool:
        """Whether these kernels can run on `x` (and `weight`): fp32 on the CPU, contiguous, 2-D, at most MAX_ROWS
        rows, and no gradient wanted (the kernels have no backward)."""
        if not (x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and x.shape[0] <= MAX_ROWS
                and x.is_contiguous()):
            return False
        if weight is not None and not (weight.dtype == torch.float32 and weight.is_contiguous()):
            return False
        return not (torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)))

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out = torch.empty_like(x)
        self._rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
        return out

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, rms_norm(x + residual) * weight)."""
        total, out = torch.empty_like(x), torch.empty_like(x)
        self._add_rms_norm(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), total.data_ptr(), out.data_ptr(),
                           x.shape[0], x.shape[1], eps)
        return total, out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of a fused [rows, 2 * inter] projection, gate first."""
        rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
        out = gate_up.new_empty((rows, inter))
        self._silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, inter)
        return out

    def rope_write_kv(self, qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, slots: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
        """The rotated queries and keys [rows, heads + kv_heads, head_dim] of a fused qkv projection (RoPE as
        layers.Rotation.apply computes it), with each row's rotated key and its value written to `slots` of the
        caches, as paged_attention's index_copy_ would."""
        rows, d = qkv.shape[0], k_cache.shape[-1]
        out = qkv.new_empty((rows, heads + kv_heads, d))
        bad = self._rope_write_kv(qkv.data_ptr(), cos.data_ptr(), signed_sin.data_ptr(), slots.data_ptr(),
                                  out.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), rows, heads, kv_heads, d,
                                  k_cache.shape[0])
        if bad:
            raise IndexError(f"{bad} of {rows} KV slots out of range (the cache holds {k_cache.shape[0]})")
        return out

    @staticmethod
    def fits_kv(slots: torch.Tensor, *tensors: torch.Tensor) -> bool:
        """Whether rope_write_kv takes these slots and tensors (caches, RoPE tables): int64 slots, contiguous fp32
        tensors, all on the CPU."""
        return slots.dtype == torch.int64 and slots.is_contiguous() and slots.device.type == "cpu" and all(
            t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in tensors)


def variant(features: CpuFeatures) -> tuple[str, tuple[str, ...]]:
    """Which build of fused_ops.c this CPU gets, and its extra compiler flags: "avx2" (-mavx2 -mfma) on x86 with AVX2
    and FMA, else "portable" (the target's baseline vector unit: NEON, SSE2)."""
    if features.x86 and {"avx2", "fma"} <= features.flags:
        return "avx2", AVX2_FLAGS
    return "portable", ()


def load(cache_dir: Path, features: CpuFeatures | None = None) -> tuple[FusedOps | None, str]:
    """The kernels, built under `cache_dir`/kernels the first time for this CPU's `variant`, and a line for the log
    and /health: "on (file, variant)" or "off: why"."""
    name, extra = variant(features or detect())
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "off: no C compiler (cc or gcc) on the PATH"
    try:
        path = _build(compiler, (*FLAGS, *extra), cache_dir / "kernels")
        return FusedOps(ctypes.CDLL(str(path)), path), f"on ({path.name}, {name})"
    except (OSError, subprocess.SubprocessError, BuildError) as exc:
        return None, f"off: {exc}"


class BuildError(RuntimeError):
    pass


def _build(compiler: str, flags: tuple[str, ...], out_dir: Path) -> Path:
    source = SOURCE.read_bytes()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(b"\0".join([source, version.encode(), " ".join(flags).encode()])).hexdigest()[:12]
    path = out_dir / f"fused_ops-{key}.so"
    if path.exists():
        return path
    out_dir.mkdir(parents=True, exist_ok=True)
    # built beside its final name and renamed: a concurrent start never loads a half-written library
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".so.tmp")
    os.close(fd)
    try:
        done = subprocess.run([compiler, *flags, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no message"])[0]
            raise BuildError(f"{Path(compiler).name} failed on {SOURCE.name}: {first}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("fused CPU kernels built: %s", path)
    return path


def attach(model: nn.Module, ops: FusedOps | None) -> int:
    """Hand `ops` (None: torch's ops) to every module of `model` that takes them (RMSNorm, Attention, MLP); how many."""
    n = 0
    for module in model.modules():
        attributes = vars(module)  # `fused` is a plain attribute of those modules, set in their __init__
        if "fused" in attributes:
            attributes["fused"] = ops
            n += 1
    return n
