"""An int4 layer's prefill rows on another engine's dense linear over the same weight.

The -fast engine runs a step of up to quant.KERNEL_MAX_ROWS rows on the int4 kernel and larger ones (prefill) on a
dense GEMM over the dequantized weight. Where that weight is exactly the standard engine's (the embedded model's
layers are Q4_1 blocks of 32, which int4 g32 holds without loss), the standard engine's own linear runs those rows:
on the kernel it chose for this CPU (MKL's or oneDNN's packs), with no second dense copy in memory. A separate fp32
copy on oneDNN or `F.linear` cost the -fast engine time to first token (16-token prompt through HTTP, Xeon capped at
AVX2: 0.095 s against the standard engine's 0.076 on MKL's packs) and the copy's memory.

A shared linear is checked once when the layer is built (same shape and dtype as the copy it replaces, and the same
answer on a probe) and on every use for writes since (a trainer's weight sync into the standard engine,
`pack_weights_into`): a layer whose shared weights changed runs its prefill rows on its own int4 kernel from then on,
which still computes the -fast engine's weights.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from mainspring.engine.linear_kernel import PackedLinear

log = logging.getLogger(__name__)

# relative error of the probe's output allowed for the same weight: fp32 kernels agree to ~1e-6, bf16 ones to ~4e-3
_PROBE_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
_PROBE_ROWS = 3


def weights_version(module: nn.Module) -> tuple[int, ...] | None:
    """What changes when a linear's weight or bias is written (in place or repacked); None when it cannot tell."""
    try:
        bias = module.bias
        tail = () if bias is None else (bias._version,)
        if isinstance(module, PackedLinear):
            return (module.version, *tail)
        if isinstance(module, nn.Linear):
            return (module.weight._version, module.weight.data_ptr(), *tail)
    except (AttributeError, RuntimeError):  # inference tensors keep no version counter
        return None
    return None


def linear_dtype(module: nn.Module) -> torch.dtype | None:
    """The dtype a dense linear computes in: a packed one's, or an `nn.Linear`'s weight's; None for other modules."""
    if isinstance(module, PackedLinear):
        return module.dtype
    if type(module) is nn.Linear:
        return module.weight.dtype
    return None


class SharedLinear:
    """Another engine's dense linear, held without registering it as a submodule (it is that engine's to place,
    save and sync); `get()` is it while its weights are as they were when shared, else None."""

    def __init__(self, module: nn.Module, version: tuple[int, ...], name: str = "") -> None:
        self.module: nn.Module | None = module
        self.version, self.name = version, name

    def get(self) -> nn.Module | None:
        if self.module is not None and weights_version(self.module) != self.version:
            log.warning("%s: the shared linear's weights were written since; its prefill rows run the int4 kernel",
                        self.name or "an int4 layer")
            self.module = None
        return self.module


def share_linear(shared: Mapping[str, nn.Module] | None, name: str, weight: torch.Tensor,
                 dequantized: Callable[[], torch.Tensor], bias: torch.Tensor | None,
                 dtype: torch.dtype) -> SharedLinear | None:
    """`shared[name]` for an int4 layer over the fp32 `weight` that would keep a dense copy in `dtype`: when the int4
    form (`dequantized()`, called only once the cheap checks pass) is exactly the weight and that linear computes the
    same layer (same shape and dtype, same answer on a probe within the dtype's rounding), else None."""
    module = (shared or {}).get(name)
    if module is None or linear_dtype(module) != dtype:
        return None
    if (module.out_features, module.in_features) != tuple(weight.shape) or (module.bias is None) != (bias is None):
        return None
    if not torch.equal(dequantized(), weight):
        return None
    version = weights_version(module)
    if version is None:
        return None
    x = torch.randn(_PROBE_ROWS, weight.shape[1], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = F.linear(x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)).float()
        got = module(x.to(dtype)).float()
    if (got - want).norm() > _PROBE_TOLERANCE.get(dtype, 2e-2) * want.norm():
        log.info("%s: the shared linear computes another weight; the layer keeps its own dense copy", name)
        return None
    return SharedLinear(module, version, name)
