"""What this CPU can do, for choosing weight formats and kernels (engine/kernel_choice.py).

Features come from the kernel's view of the CPU (/proc/cpuinfo: `flags` on x86, `Features` on ARM),
named as Linux names them, plus what torch itself reports (its vectorisation level and whether
oneDNN does bf16 natively). Only the features a kernel choice depends on are kept, so the cache
key (`CpuFeatures.key`) changes when the choice could, not with every microcode flag.
"""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# the flags a choice may depend on (Linux /proc/cpuinfo spellings)
X86_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni",
             "amx_tile", "amx_bf16", "amx_int8")
ARM_FLAGS = ("asimd", "asimddp", "bf16", "i8mm", "sve", "sve2", "svebf16")


@dataclass(frozen=True)
class CpuFeatures:
    arch: str  # platform.machine(): "x86_64", "aarch64", ...
    model: str  # "Intel(R) Xeon(R) ...", "AMD EPYC ...", "" when unknown
    flags: frozenset[str]  # the relevant ones of X86_FLAGS / ARM_FLAGS
    torch_capability: str = ""  # torch.backends.cpu.get_cpu_capability(): "AVX512", "AVX2", "DEFAULT", ...

    @property
    def x86(self) -> bool:
        return self.arch in ("x86_64", "AMD64", "i686", "i386")

    @property
    def arm(self) -> bool:
        return self.arch in ("aarch64", "arm64") or self.arch.startswith("armv8")

    @property
    def bf16(self) -> bool:
        """bf16 arithmetic in hardware (AVX512-BF16, AMX-BF16, ARM BF16): bf16 activations pay."""
        return bool(self.flags & {"avx512_bf16", "amx_bf16", "bf16", "svebf16"})

    @property
    def int8_gemm(self) -> bool:
        """A fast int8 GEMM backend exists: fbgemm/oneDNN need AVX2 on x86; qnnpack needs NEON (asimd)."""
        return "avx2" in self.flags if self.x86 else ("asimd" in self.flags if self.arm else False)

    @property
    def key(self) -> str:
        """Stable across restarts and machines with the same relevant features: a cache key."""
        text = f"{self.arch}\0{','.join(sorted(self.flags))}\0{self.torch_capability}"
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def summary(self) -> str:
        """One line for logs and /health: "x86_64 AVX512 avx2,avx512_bf16,..."."""
        return f"{self.arch} {self.torch_capability or '?'} {','.join(sorted(self.flags)) or '-'}"

    def to_dict(self) -> dict[str, object]:
        return {"arch": self.arch, "model": self.model, "flags": sorted(self.flags),
                "torch_capability": self.torch_capability, "key": self.key}


# What each torch vectorisation level lets a kernel use. A user caps it (ATEN_CPU_CAPABILITY=avx2, with
# ONEDNN_MAX_CPU_ISA and MKL_ENABLE_INSTRUCTIONS for the libraries) to stay off AVX-512 (clock throttling, a VM
# that does not save its state); the kernel choice then follows what the kernels will really run.
_ABOVE_AVX2 = frozenset(f for f in X86_FLAGS if f.startswith(("avx512", "amx")))
_CAPPED = {"AVX2": _ABOVE_AVX2, "DEFAULT": _ABOVE_AVX2}  # fbgemm's int8 runs on AVX2 whatever ATen uses


def parse_cpuinfo(text: str, arch: str, torch_capability: str = "") -> CpuFeatures:
    """The features a /proc/cpuinfo text names (the first processor's; they agree on one host), less those above
    torch's vectorisation level when it was capped below what the CPU has."""
    flags: set[str] = set()
    model = ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name in ("flags", "features") and not flags:
            flags = set(value.split())
        elif name in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
    x86 = arch in ("x86_64", "AMD64", "i686", "i386")
    wanted = set(X86_FLAGS if x86 else ARM_FLAGS) - (_CAPPED.get(torch_capability, frozenset()) if x86 else set())
    return CpuFeatures(arch, model, frozenset(f for f in wanted if f in flags), torch_capability)


@lru_cache(maxsize=1)
def detect() -> CpuFeatures:
    """This machine's features (cached: the CPU does not change under a running process)."""
    import torch

    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        capability = ""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:  # not Linux: what torch says is all there is
        text = ""
    found = parse_cpuinfo(text, platform.machine(), capability)
    if not found.flags:  # no cpuinfo (not Linux): torch's vectorisation level implies the basics
        implied = {"asimd"} if found.arm else {"AVX2": {"avx2", "fma"},
                                               "AVX512": {"avx2", "fma", "avx512f"}}.get(capability, set())
        found = CpuFeatures(found.arch, found.model, frozenset(implied), capability)
    return found
