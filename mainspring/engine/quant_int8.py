"""Int8 linears with dynamically quantized activations, on torch's quantized CPU engine (fbgemm /
oneDNN "x86" on AVX2 and up, qnnpack on ARM).

Weights are int8, symmetric, one scale per output row; each call quantizes its activations
(per tensor, range from the call's own min/max) and runs an int8 GEMM with int32 accumulation. Unlike
the int4 kernel, it needs no bf16 hardware: on an AVX2-only CPU it is the fast path (measured on
the embedded model's shapes, 1 thread: the 49152x576 LM head 1.2 ms vs 9.3 ms fp32 at one row,
where int4 with fp32 activations takes 60 ms). Because activations are quantized per call, a
row's result depends slightly on the other rows of the same call (like bf16 in the int4 path).

The ops are torch's `quantized::linear_prepack` / `quantized::linear_dynamic`. torch marks its
quantized tensor types deprecated (a future release removes them; this project pins torch 2.13):
when they go, `available()` turns False and the kernel choice simply stops offering int8.
Activations keep their full 8 bits where the CPU has VNNI (or on ARM); elsewhere fbgemm needs them
cut to 7 (`reduce_range`) to avoid int16 overflow in its accumulation.

Accuracy, measured by the kernel choice's check on the embedded model (teacher-forced top-1
agreement with fp32 / perplexity ratio on its fixed text, chunks of 6 rows): 0.81 / 1.04 with 8-bit
activations, 0.87 / 1.03 with the LM head left fp32, 0.70 / 1.20 with 7-bit ones: below the bound
(0.90 / 1.10), so the choice does not take int8 for this model yet, even where it is 3x faster
than fp32. Per-row activation scales do not help (0.87); outlier activation channels need
SmoothQuant-style scale migration, calibrated on text, which is not built.
"""

from __future__ import annotations

import time
import warnings
from functools import lru_cache

import torch
from torch import nn

from mainspring.engine.quant import QuantReport, quantizable_linears



def reduce_range() -> bool:
    """7-bit activations, for x86 CPUs without VNNI (fbgemm's int16 accumulation would overflow)."""
    from mainspring.engine.cpu import detect

    f = detect()
    return f.x86 and not f.flags & {"avx512_vnni", "avx_vnni", "amx_int8"}


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether this torch build has a quantized CPU engine and the dynamic int8 linear works."""
    try:
        engines = torch.backends.quantized.supported_engines
        if not any(e in engines for e in ("x86", "fbgemm", "onednn", "qnnpack")):
            return False
        gen = torch.Generator().manual_seed(0)  # never the global generator: seeded runs depend on it
        layer = Int8Linear(torch.randn(16, 32, generator=gen), None)
        return bool(torch.isfinite(layer(torch.randn(2, 32, generator=gen))).all())
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


class Int8Linear(nn.Module):
    """y = x @ W^T + b with W as per-row int8 and x quantized per call; a drop-in for `nn.Linear` in
    inference (input and output dtype stay the caller's)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.reduce_range = reduce_range()
        scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).double()
        with warnings.catch_warnings():  # torch's notice that quantized tensors will go (module docstring)
            warnings.simplefilter("ignore", UserWarning)
            qw = torch.quantize_per_channel(w, scales, torch.zeros(len(scales), dtype=torch.int64), 0, torch.qint8)
            b = None if bias is None else bias.detach().float().contiguous()
            self._packed = torch.ops.quantized.linear_prepack(qw, b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        y = torch.ops.quantized.linear_dynamic(x2.float().contiguous(), self._packed, self.reduce_range)
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 dynamic"


@torch.no_grad()
def quantize_model_int8(model: nn.Module, include_lm_head: bool = True) -> QuantReport:
    """Replace the model's linears by `Int8Linear`s, in place. Quick enough (a per-row max) that
    nothing is cached on disk; the packed layout is the backend's, rebuilt at every start anyway."""
    start = time.perf_counter()
    report = QuantReport(group_size=0)
    linears = quantizable_linears(model, include_lm_head)
    while linears:
        name = next(iter(linears))
        linear = linears.pop(name)
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, Int8Linear(linear.weight, linear.bias))
        report.quantized.append(name)
        report.num_quantized_now += 1
    report.seconds = time.perf_counter() - start
    return report
