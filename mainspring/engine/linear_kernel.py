"""The fp32 linear kernel per CPU: torch's own (`F.linear`, MKL in the CPU wheel), oneDNN with the weight
prepacked once at load time, or MKL with the weight prepacked (`cblas_sgemm_pack`).

MKL takes a slow generic path on AMD CPUs. Measured on an AMD EPYC (AVX-512, 2 threads) over the
embedded model's 121 linears, one decode step: 42.9 ms with `F.linear`, 15.5 ms with oneDNN's
prepacked weights (`torch.ops.mkldnn._reorder_linear_weight` / `_linear_pointwise`, the ops
inductor's weight freezing emits); 2.6x at 512 rows (prefill) too, and results within fp32
rounding of each other (relative 1e-6). Where MKL is at home (Intel) it can win instead.

MKL's own packed weights (`torch.ops.mkl._mkl_reorder_linear_weight` / `_mkl_linear`, what inductor's freezing
emits for fp32 on Intel) win where a step has a few rows: on an Intel Xeon capped at AVX2 (2 threads) the
model's 120 layer linears took 22.1 / 38.7 / 44.6 / 75.5 ms at 1 / 2 / 8 / 32 rows with `F.linear`, and
22.9 / 23.2 / 31.2 / 56.9 packed (MKL's small-M GEMM is slow unpacked). The packed layout depends on the row count
it was packed for, not its results: one pack for MKL_PACK_ROWS serves every row count (checked at start,
`mkl_available`), and 128 was the best hint from 1 to 2,048 rows.

So "auto" times the kernels on the model's widest layer shape, streaming the weights from memory as a step does,
at 1 row (a single stream's decode step) and at BATCH_ROWS (a busy server's), and keeps the one with the least
time for the two together among those within SINGLE_ROW_SLACK of the fastest at 1 row; a packed kernel must
beat torch's by MIN_GAIN. "torch", "onednn" and "mkl" pin one (`MAINSPRING_LINEAR_KERNEL`).

The oneDNN op takes bf16 weights: `PackedLinear(w, dtype=torch.bfloat16)` is the "bf16" weight format
(`MAINSPRING_QUANTIZATION=bf16`, and a candidate of the -fast engine's kernel choice where the CPU
has native bf16): half the bytes per step, activations rounded to bf16 on the way in and the result
returned in fp32. Measured on the same EPYC: 10.5 ms per decode step.

An engine in bf16 (`MAINSPRING_DTYPE=bf16`) makes the same choice for its bf16 linears where oneDNN packs bf16:
F.linear on bf16 has no MKL GEMM behind it. On an Intel Xeon with AMX (2 threads) the widest layer took 0.19 ms
packed against 0.27 with F.linear, and single-stream decode through HTTP went from 25.6 to 32.6 tok/s.

A `PackedLinear` holds no `weight` parameter: a packed tensor is opaque (no storage: it cannot be saved or
deep-copied, and MKL's must not move). `.weight` reads back a dense copy and `set_weight` repacks, which is how a
trainer's weight sync reaches it (`pack_weights_into`).
"""

from __future__ import annotations

import logging
import time
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mainspring.engine.allocator import TRIM_EVERY, fresh_mappings, release_freed_memory

if TYPE_CHECKING:
    from mainspring.engine.quant import QuantReport

log = logging.getLogger(__name__)

LINEAR_KERNELS = ("auto", "torch", "onednn", "mkl")
PACKED_KERNELS = ("onednn", "mkl")
STREAM_BYTES = 128 << 20  # the weights measure() streams: more than a CPU cache holds
MIN_GAIN = 1.1  # "auto" packs only when a packed kernel is at least this much faster: a tie keeps torch's kernel
BATCH_ROWS = 16  # the rows of a busy server's decode step, the second row count "auto" times
# how much slower at 1 row than the fastest a kernel may be and still win on batches: a guard, the sum decides. On
# the Xeon capped at AVX2, MKL's packs timed 1.17-1.50x torch's at 1 row (from one start to the next) and 0.71-0.73x
# at 16 on the widest layer, the sum 0.82-0.89x; through the engine a single stream's decode step took 9% longer
# and a step of 32 agents 14% less. Uncapped, the sum was 0.83-0.95x: either kernel, by start (MIN_GAIN)
SINGLE_ROW_SLACK = 2.0
MKL_PACK_ROWS = 128  # the row count MKL packs for (the layout's hint; any row count computes correctly)


def _pack(weight: torch.Tensor, dtype: torch.dtype, kernel: str) -> torch.Tensor:
    dense = weight.detach().to(dtype).contiguous()
    if kernel == "mkl":  # its buffer is ~3x what it fills: fresh pages, so the rest stays unbacked
        with fresh_mappings():
            return torch.ops.mkl._mkl_reorder_linear_weight(dense, MKL_PACK_ROWS)
    return torch.ops.mkldnn._reorder_linear_weight(dense, None)


class PackedLinear(nn.Module):
    """A drop-in for `nn.Linear` (y = x W^T + b), W prepacked for this CPU: for oneDNN in `dtype` (fp32, or bf16:
    then x is rounded to bf16 and y comes back in x's dtype), or for MKL (fp32 only)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.float32, kernel: str = "onednn") -> None:
        super().__init__()
        if kernel not in PACKED_KERNELS or (kernel == "mkl" and dtype != torch.float32):
            raise ValueError(f"no packed {str(dtype).removeprefix('torch.')} linear on {kernel!r}")
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype
        self.kernel = kernel
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype).clone(), requires_grad=False)
        # MKL's op reads the weight's shape from a dense tensor: one of that shape that takes no memory
        self._shape = torch.empty((), dtype=dtype).expand(self.out_features, self.in_features)
        self._packed = _pack(weight, dtype, kernel)
        self.version = 0  # counts repacks: what shares this linear can tell its weights changed (shared_prefill.py)

    @property
    def weight(self) -> torch.Tensor:
        """A dense fp32 copy of the weight (for inspection: the forward never reads it). MKL's packed layout has no
        reader: the copy is the identity's product with it, exact in fp32."""
        if self.kernel == "mkl":
            eye = torch.eye(self.in_features)
            return torch.ops.mkl._mkl_linear(eye, self._packed, self._shape, None, self.in_features).T.contiguous()
        return self._packed.to_dense().float()

    def set_weight(self, weight: torch.Tensor) -> None:
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight of shape {tuple(weight.shape)} for a {self.out_features}x{self.in_features} "
                             "linear")
        self._packed = _pack(weight, self.dtype, self.kernel)
        self.version += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "mkl":  # rows: the op runs the packed GEMM only when told the rows it gets
            return torch.ops.mkl._mkl_linear(x, self._packed, self._shape, self.bias, x.numel() // self.in_features)
        y = torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self._packed, self.bias, "none", [], "")
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        kind = self.kernel if self.dtype == torch.float32 else f"{self.kernel} {str(self.dtype).removeprefix('torch.')}"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, {kind}"


def _computes_f_linear(kernel: str, dtype: torch.dtype = torch.float32) -> bool:
    """Whether this build packs for `kernel` and gets F.linear's answer, at row counts other than a pack's hint."""
    try:
        gen = torch.Generator().manual_seed(0)  # not the global generator (see measure)
        w, b = torch.randn(24, 40, generator=gen), torch.randn(24, generator=gen)
        layer = PackedLinear(w, b, dtype, kernel)
        for rows in (1, 3, 33):
            x = torch.randn(rows, 40, generator=gen)
            if not torch.allclose(layer(x.to(dtype)).float(), F.linear(x, w, b), rtol=1e-4, atol=1e-5):
                return False
        return True
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


@lru_cache(maxsize=1)
def onednn_available() -> bool:
    """Whether this torch build runs the prepacked oneDNN linear, and gets F.linear's answer."""
    return torch.backends.mkldnn.is_available() and _computes_f_linear("onednn")


@lru_cache(maxsize=1)
def mkl_available() -> bool:
    """Whether this torch build runs MKL's packed linear (x86 wheels), and gets F.linear's answer."""
    return torch.backends.mkl.is_available() and _computes_f_linear("mkl")


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


def packs(kernel: str, dtype: torch.dtype = torch.float32) -> bool:
    """Whether `kernel` ("onednn" or "mkl") packs `dtype` weights here."""
    if kernel == "mkl":
        return dtype == torch.float32 and mkl_available()
    if dtype == torch.float32:
        return onednn_available()
    return dtype == torch.bfloat16 and bf16_packing_available()


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


@lru_cache(maxsize=16)
def measure(out_features: int, in_features: int, budget_s: float = 0.03, dtype: torch.dtype = torch.float32,
            kernels: tuple[str, ...] = PACKED_KERNELS) -> dict[str, tuple[float, float]]:
    """Per kernel that runs `dtype` here (torch's, and those of `kernels` that pack it): ms per call of one linear
    of this shape at 1 row and at BATCH_ROWS, cycling over distinct random weights (up to STREAM_BYTES) so they
    stream from memory as in a step; the best of three rounds; cached per process and shape. One packed copy at a
    time: start-up's peak memory grows by the dense copies and one packed set, not one set per kernel.

    Why so: the kernels rank differently by rows and by whether the weight sits in cache. On an AMD EPYC
    (AVX2) one matrix timed over and over made MKL look faster (0.14 vs 0.23 ms) while a step's streamed
    linears took 54 ms with it and 44 with oneDNN; on an Intel Xeon (Ice Lake) MKL did a step's linears in
    16.3 ms and oneDNN in 34.8, where the former sum over 1 and 16 rows called them even. Its own generator:
    drawing from torch's global one would shift every seeded run that builds an engine (a trainer's)."""
    gen = torch.Generator().manual_seed(0)
    copies = max(1, min(64, STREAM_BYTES // (out_features * in_features * dtype.itemsize)))
    weights = [torch.randn(out_features, in_features, generator=gen).to(dtype) for _ in range(copies)]
    xs = {rows: torch.randn(rows, in_features, generator=gen).to(dtype) for rows in (1, BATCH_ROWS)}
    times = {}
    with torch.inference_mode():
        for kernel in ("torch", *(k for k in kernels if packs(k, dtype))):  # one kernel's weights at a time
            if kernel == "torch":
                fns: list[Callable[[torch.Tensor], torch.Tensor]] = [partial(F.linear, weight=w) for w in weights]
            else:
                fns = [PackedLinear(w, dtype=dtype, kernel=kernel) for w in weights]
            rounds = [[seconds_per_call(fns, x, budget_s) * 1e3 for x in xs.values()] for _ in range(3)]
            times[kernel] = (min(r[0] for r in rounds), min(r[1] for r in rounds))
            del fns
    log.info("%s linear %dx%d, %d copies streamed, ms at 1 / %d rows: %s", str(dtype).removeprefix("torch."),
             out_features, in_features, copies, BATCH_ROWS,
             ", ".join(f"{k} {a:.3f} / {b:.3f}" for k, (a, b) in times.items()))  # once per shape and dtype
    return times


def pick(times: dict[str, tuple[float, float]]) -> str:
    """The kernel `measure`'s times call for: among those within SINGLE_ROW_SLACK of the fastest at 1 row (a single
    stream must not pay for a batch gain), the least time at 1 row and at BATCH_ROWS together; torch's kernel
    unless a packed one beats it by MIN_GAIN."""
    fastest = min(single for single, _ in times.values())
    cost = {k: single + batch for k, (single, batch) in times.items() if single <= fastest * SINGLE_ROW_SLACK}
    best = min(cost, key=cost.__getitem__)
    if "torch" in cost and cost[best] * MIN_GAIN > cost["torch"]:
        return "torch"
    return best


def choose(kernel: str, shapes: list[tuple[int, int]], dtype: torch.dtype = torch.float32,
           kernels: tuple[str, ...] = PACKED_KERNELS) -> str:
    """"torch", "onednn" or "mkl" for these linear shapes (out, in) in `dtype` (fp32, or bf16 where oneDNN packs
    it): what `kernel` pins, or for "auto" the one `pick` takes, among torch's and `kernels`, on the widest shape
    (timing it costs about a second, once per process and shape)."""
    if kernel not in LINEAR_KERNELS:
        raise ValueError(f"unknown linear kernel {kernel!r}; supported: {', '.join(LINEAR_KERNELS)}")
    if kernel == "torch" or not shapes:
        return "torch"
    if kernel != "auto":
        if not packs(kernel, dtype):
            name = "oneDNN" if kernel == "onednn" else "MKL"
            raise ValueError(f"linear kernel {kernel!r} asked for, but this torch build or CPU has no working "
                             f"{name} {str(dtype).removeprefix('torch.')} linear")
        return kernel
    if not any(packs(k, dtype) for k in kernels):
        return "torch"
    return pick(measure(*widest_shape(shapes), dtype=dtype, kernels=kernels))


def widest_shape(shapes: list[tuple[int, int]]) -> tuple[int, int]:
    """The (out, in) shape "auto" times: the largest but an LM head's (its rows stream past any cache anyway)."""
    return max(shapes, key=lambda s: s[0] * s[1] if s[0] < 32768 else 0)


def plain_linears(model: nn.Module, *dtypes: torch.dtype) -> dict[str, nn.Linear]:
    """The model's plain linears whose weights are of `dtypes` (fp32 when none is given; quantized linears are
    other module types)."""
    wanted = dtypes or (torch.float32,)
    return {n: m for n, m in model.named_modules() if type(m) is nn.Linear and m.weight.dtype in wanted}


def pack_linears(model: nn.Module, dtype: torch.dtype = torch.float32, kernel: str = "onednn") -> list[str]:
    """Replace every plain fp32 `nn.Linear` with a `PackedLinear` of `dtype` on `kernel`; the names replaced (a bf16
    model's own bf16 linears when `dtype` is bf16). A tied LM head gets its own packed copy (the embedding keeps the
    dense matrix it looks rows up in)."""
    linears = plain_linears(model, torch.float32, dtype)
    names, since_trim = list(linears), 0
    for name in names:
        linear = linears.pop(name)  # the dense weight goes with the module, unless something else holds it
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, PackedLinear(linear.weight, linear.bias, dtype, kernel))
        since_trim += linear.weight.nbytes
        del linear
        if since_trim > TRIM_EVERY:  # the replaced weights' heap pages go back as packing goes: a lower peak
            release_freed_memory()
            since_trim = 0
    return names


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
