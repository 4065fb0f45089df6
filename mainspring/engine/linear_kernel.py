"""The fp32 linear kernel per CPU: torch's own (`F.linear`, MKL in the CPU wheel) or oneDNN with the
weight prepacked once at load time.

MKL takes a slow generic path on AMD CPUs. Measured on an AMD EPYC (AVX-512, 2 threads) over the
embedded model's 121 linears, one decode step: 42.9 ms with `F.linear`, 15.5 ms with oneDNN's
prepacked weights (`torch.ops.mkldnn._reorder_linear_weight` / `_linear_pointwise`, the ops
inductor's weight freezing emits); 2.6x at 512 rows (prefill) too, and results within fp32
rounding of each other (relative 1e-6). Where MKL is at home (Intel) it can win instead, so "auto"
times both on the model's widest layer shape at 1 row (a decode step), streaming the weights from
memory as a step does, and keeps the faster; "torch" and "onednn" pin one (`MAINSPRING_LINEAR_KERNEL`).

The same op takes bf16 weights: `PackedLinear(w, dtype=torch.bfloat16)` is the "bf16" weight format
(`MAINSPRING_QUANTIZATION=bf16`, and a candidate of the -fast engine's kernel choice where the CPU
has native bf16): half the bytes per step, activations rounded to bf16 on the way in and the result
returned in fp32. Measured on the same EPYC: 10.5 ms per decode step.

An engine in bf16 (`MAINSPRING_DTYPE=bf16`) makes the same choice for its bf16 linears where oneDNN packs bf16:
F.linear on bf16 has no MKL GEMM behind it. On an Intel Xeon with AMX (2 threads) the widest layer took 0.19 ms
packed against 0.27 with F.linear, and single-stream decode through HTTP went from 25.6 to 32.6 tok/s.

A `PackedLinear` holds no `weight` parameter: oneDNN's blocked tensor is opaque (no storage: it
cannot be saved or deep-copied). `.weight` reads back a dense copy and `set_weight` repacks, which is
how a trainer's weight sync reaches it (`pack_weights_into`).
"""

from __future__ import annotations

import logging
import time
from functools import lru_cache
from typing import TYPE_CHECKING, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from mainspring.engine.quant import QuantReport

log = logging.getLogger(__name__)

LINEAR_KERNELS = ("auto", "torch", "onednn")
STREAM_BYTES = 128 << 20  # the weights measure() streams: more than a CPU cache holds
MIN_GAIN = 1.1  # "auto" packs only when oneDNN is at least this much faster: a tie keeps torch's kernel


def _pack(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype).contiguous(), None)


class PackedLinear(nn.Module):
    """A drop-in for `nn.Linear` (y = x W^T + b) on oneDNN, W prepacked for this CPU in `dtype`
    (fp32, or bf16: then x is rounded to bf16 and y comes back in x's dtype)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype).clone(), requires_grad=False)
        self._packed = _pack(weight, dtype)

    @property
    def weight(self) -> torch.Tensor:
        """A dense fp32 copy of the weight (for inspection: the forward never reads it)."""
        return self._packed.to_dense().float()

    def set_weight(self, weight: torch.Tensor) -> None:
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight of shape {tuple(weight.shape)} for a {self.out_features}x{self.in_features} "
                             "linear")
        self._packed = _pack(weight, self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self._packed, self.bias, "none", [], "")
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        kind = "onednn" if self.dtype == torch.float32 else f"onednn {str(self.dtype).removeprefix('torch.')}"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, {kind}"


@lru_cache(maxsize=1)
def onednn_available() -> bool:
    """Whether this torch build runs the prepacked oneDNN linear, and gets F.linear's answer."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        gen = torch.Generator().manual_seed(0)  # not the global generator (see measure)
        w, x = torch.randn(24, 40, generator=gen), torch.randn(3, 40, generator=gen)
        return bool(torch.allclose(PackedLinear(w)(x), F.linear(x, w), rtol=1e-4, atol=1e-5))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


@lru_cache(maxsize=1)
def bf16_packing_available() -> bool:
    """Whether oneDNN packs bf16 weights here: it needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT on x86."""
    if not onednn_available():
        return False
    try:
        PackedLinear(torch.zeros(8, 8), dtype=torch.bfloat16)
        return True
    except RuntimeError:
        return False


def seconds_per_call(fns: Sequence[Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor,
                     budget_s: float) -> float:
    """Time per call, cycling through `fns` (copies of one layer over distinct weights) for `budget_s`."""
    for fn in fns:
        fn(x)  # warm-up: oneDNN builds its primitive; first touch of each weight
    calls, start = 0, time.perf_counter()
    while True:
        for fn in fns:
            fn(x)
        calls += len(fns)
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s:
            return elapsed / calls


@lru_cache(maxsize=8)
def measure(out_features: int, in_features: int, budget_s: float = 0.03,
            dtype: torch.dtype = torch.float32) -> tuple[float, float]:
    """(torch ms, oneDNN ms) of one linear of this shape at 1 row, a decode step's, cycling over distinct
    random weights (up to STREAM_BYTES) so they stream from memory as in a step; the best of three
    alternating rounds; cached per process and shape.

    Why so: the kernels rank differently by rows and by whether the weight sits in cache. On an AMD EPYC
    (AVX2) one matrix timed over and over made MKL look faster (0.14 vs 0.23 ms) while a step's streamed
    linears took 54 ms with it and 44 with oneDNN; on an Intel Xeon (Ice Lake) MKL did a step's linears in
    16.3 ms and oneDNN in 34.8, where the former sum over 1 and 16 rows called them even. Its own generator:
    drawing from torch's global one would shift every seeded run that builds an engine (a trainer's)."""
    gen = torch.Generator().manual_seed(0)
    copies = max(1, min(64, STREAM_BYTES // (out_features * in_features * dtype.itemsize)))
    weights = [torch.randn(out_features, in_features, generator=gen).to(dtype) for _ in range(copies)]
    dense = [lambda x, w=w: F.linear(x, w) for w in weights]
    packed = [PackedLinear(w, dtype=dtype) for w in weights]
    x = torch.randn(1, in_features, generator=gen).to(dtype)
    with torch.inference_mode():
        t_torch, t_onednn = [], []
        for _ in range(3):
            t_torch.append(seconds_per_call(dense, x, budget_s) * 1e3)
            t_onednn.append(seconds_per_call(packed, x, budget_s) * 1e3)
    log.info("%s linear %dx%d at 1 row, %d copies streamed: torch %.3f ms, oneDNN %.3f ms",
             str(dtype).removeprefix("torch."), out_features, in_features, copies, min(t_torch),
             min(t_onednn))  # once per shape and dtype (cached)
    return min(t_torch), min(t_onednn)


def choose(kernel: str, shapes: list[tuple[int, int]], dtype: torch.dtype = torch.float32) -> str:
    """"torch" or "onednn" for these linear shapes (out, in) in `dtype` (fp32, or bf16 where oneDNN packs it): what
    `kernel` pins, or for "auto" the faster one on the widest shape (timing that one costs a few milliseconds)."""
    if kernel not in LINEAR_KERNELS:
        raise ValueError(f"unknown linear kernel {kernel!r}; supported: {', '.join(LINEAR_KERNELS)}")
    if kernel == "torch" or not shapes:
        return "torch"
    if not _onednn_packs(dtype):
        if kernel == "onednn":
            raise ValueError(f"linear kernel 'onednn' asked for, but this torch build or CPU has no working oneDNN "
                             f"{str(dtype).removeprefix('torch.')} linear")
        return "torch"
    if kernel == "onednn":
        return "onednn"
    widest = max(shapes, key=lambda s: s[0] * s[1] if s[0] < 32768 else 0)  # the LM head streams, skip it
    t_torch, t_onednn = measure(*widest, dtype=dtype)
    return "onednn" if t_onednn * MIN_GAIN <= t_torch else "torch"


def _onednn_packs(dtype: torch.dtype) -> bool:
    if dtype == torch.float32:
        return onednn_available()
    return dtype == torch.bfloat16 and bf16_packing_available()


def plain_linears(model: nn.Module, *dtypes: torch.dtype) -> dict[str, nn.Linear]:
    """The model's plain linears whose weights are of `dtypes` (fp32 when none is given; quantized linears are
    other module types)."""
    wanted = dtypes or (torch.float32,)
    return {n: m for n, m in model.named_modules() if type(m) is nn.Linear and m.weight.dtype in wanted}


def pack_linears(model: nn.Module, dtype: torch.dtype = torch.float32) -> list[str]:
    """Replace every plain fp32 `nn.Linear` with a `PackedLinear` of `dtype`; the names replaced (a bf16 model's
    own bf16 linears when `dtype` is bf16). A tied LM head gets its own packed copy (the embedding keeps the dense
    matrix it looks rows up in)."""
    linears = plain_linears(model, torch.float32, dtype)
    for name, linear in linears.items():
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, PackedLinear(linear.weight, linear.bias, dtype))
    return list(linears)


def quantize_model_bf16(model: nn.Module) -> QuantReport:
    """The "bf16" weight format: every linear packed in bf16 for oneDNN (nothing cached on disk:
    packing is a cast and a reorder, and the layout is this CPU's)."""
    from mainspring.engine.quant import QuantReport  # quant imports this module

    if not bf16_packing_available():
        raise ValueError("weights 'bf16' need torch's oneDNN bf16 linear, which this torch build or CPU lacks "
                         "(oneDNN packs bf16 weights only with AVX-512 or AVX-NE-CONVERT)")
    start = time.perf_counter()
    report = QuantReport(group_size=0, quantized=pack_linears(model, torch.bfloat16))
    report.num_quantized_now = len(report.quantized)
    report.seconds = time.perf_counter() - start
    return report


def pack_weights_into(model: nn.Module, weights: dict[str, torch.Tensor]) -> tuple[int, int]:
    """Copy `weights` (parameter names as in a plain model) into `model` in place, repacking where a
    linear is packed; (tensors written, bytes). Tensors that already are the model's are skipped. A
    tied LM head is repacked whenever the embedding changed."""
    params = dict(model.named_parameters())
    n = size = 0
    written = set()
    for name, value in weights.items():
        dst = params.get(name)
        if dst is not None:
            if dst.data_ptr() == value.data_ptr():
                continue
            dst.copy_(value)
        else:
            parent, _, leaf = name.rpartition(".")
            try:
                module = model.get_submodule(parent)
            except AttributeError:
                module = None
            if leaf != "weight" or not isinstance(module, PackedLinear):
                raise KeyError(f"the engine's model has no parameter {name!r}")
            module.set_weight(value)
        written.add(name)
        n += 1
        size += value.numel() * value.element_size()
    config = getattr(model, "config", None)
    head, embed = getattr(model, "lm_head", None), getattr(model, "embed_tokens", None)
    tied = config is not None and getattr(config, "tie_word_embeddings", False)
    if tied and isinstance(head, PackedLinear) and embed is not None and "embed_tokens.weight" in written:
        head.set_weight(embed.weight)
    return n, size
