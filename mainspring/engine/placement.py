"""Where the engine runs and in what precision: `MAINSPRING_DEVICE` and `MAINSPRING_DTYPE`, resolved once.

`auto` is CUDA with bf16 when torch sees a GPU, else the CPU with fp32 (the path every test and bench of the CPU
engine measures). On CUDA the weights, the paged KV cache, the step's index tensors, the sampler and the grammar
masks' application live on the device, and so do a KV policy's sparse attention metadata and its quantized cold
tier; int4 weights run there on torch's CUDA int4 kernel (tensor cores: compute capability 8.0 and up), while the
weight formats whose kernels are CPU-only so far (int8 and bf16-packed weights, int4 with fp32 activations) are
refused there by name. In every precision KV policies run (their attention casts the window to fp32), quantized
weights run (quantized from the fp32 weights, so the cached forms are the same in every precision), and the KV disk
tier stores blocks in the cache's dtype. Speculative decoding runs in every precision and on every device: its
proposers and verifier are torch ops on the logits' device (engine/speculative.py). A precision other than fp32
covers the weights, the activations and the paged KV cache; logits are returned in fp32 so the sampler and grammar
masks work the same in every precision. Combinations the engine has not been built or tested for are refused here,
by name, before any weight is loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from mainspring.engine.errors import EngineError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_DEVICE = re.compile(r"^(auto|cpu|cuda(?::\d+)?)$")
# the weight formats torch has a CUDA kernel for: int4 with bf16 activations (`_weight_int4pack_mm`, engine/quant.py)
CUDA_QUANTIZED = ("int4", "int4-bf16")


class PlacementError(EngineError, ValueError):
    """A device or precision this machine or this engine cannot run; the message names the setting."""


@dataclass(frozen=True)
class Placement:
    device: torch.device
    dtype: torch.dtype

    @property
    def dtype_name(self) -> str:
        return next(name for name, dt in DTYPES.items() if dt == self.dtype)

    @property
    def is_fp32(self) -> bool:
        return self.dtype == torch.float32


def resolve_placement(device: str = "auto", dtype: str = "auto") -> Placement:
    """The placement `device` ("auto", "cpu", "cuda", "cuda:N") and `dtype` ("auto", "fp32", "bf16", "fp16") ask
    for on this machine, or PlacementError."""
    device, dtype = device.strip().lower(), dtype.strip().lower()
    if not _DEVICE.match(device):
        raise PlacementError(f"MAINSPRING_DEVICE={device!r}: expected auto, cpu, cuda or cuda:N")
    if dtype != "auto" and dtype not in DTYPES:
        raise PlacementError(f"MAINSPRING_DTYPE={dtype!r}: expected auto, {', '.join(DTYPES)}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise PlacementError(f"MAINSPRING_DEVICE={device}: torch sees no CUDA device (this torch build or this "
                                 "machine has none); use cpu or auto")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise PlacementError(f"MAINSPRING_DEVICE={device}: torch sees {torch.cuda.device_count()} CUDA "
                                 f"device(s), numbered from 0")
    if dtype == "auto":
        dtype = "bf16" if device.startswith("cuda") else "fp32"
    return Placement(torch.device(device), DTYPES[dtype])


def check_supported(placement: Placement, *, quantization: str | None) -> None:
    """Refuse the weight formats whose kernels are CPU-only on CUDA, and int4 on a GPU without its kernel. The
    rest runs on every device in every precision: KV policies (their metadata and cold tier follow the cache) and
    the KV disk tier (its files hold the cache's dtype)."""
    if placement.device.type != "cuda" or quantization is None:
        return
    if quantization not in CUDA_QUANTIZED:
        raise PlacementError(f"MAINSPRING_DEVICE={placement.device} with quantization {quantization!r}: its kernels "
                             f"run on the CPU only so far ({' and '.join(CUDA_QUANTIZED)} run on CUDA); unset "
                             "MAINSPRING_QUANTIZATION or use MAINSPRING_DEVICE=cpu")
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(placement.device)
        if major < 8:
            raise PlacementError(f"MAINSPRING_DEVICE={placement.device} with quantization {quantization!r}: "
                                 f"torch's CUDA int4 kernel needs compute capability 8.0 or newer (this GPU has "
                                 f"{major}.{minor}); unset MAINSPRING_QUANTIZATION")
