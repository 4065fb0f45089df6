"""Where the engine runs and in what precision: `MAINSPRING_DEVICE` and `MAINSPRING_DTYPE`, resolved once.

`auto` is the CPU with fp32, the path every test and bench of the CPU engine measures (CUDA with bf16 once the
CUDA path is built: asking for `cuda` is refused with that reason until then). A precision other than fp32 covers
the weights, the activations and the paged KV cache; logits are returned in fp32 so the sampler and grammar masks
work the same in every precision. Combinations the engine has not been built or tested for are refused here, by
name, before any weight is loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from mainspring.engine.errors import EngineError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_DEVICE = re.compile(r"^(auto|cpu|cuda(?::\d+)?)$")


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
        device = "cpu"  # CUDA once its path is built (see below); a GPU in the machine must not stop a start
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise PlacementError(f"MAINSPRING_DEVICE={device}: torch sees no CUDA device (this torch build or this "
                                 "machine has none); use cpu or auto")
        # refused before loading rather than half-run: the step loop still builds its index tensors on the CPU
        raise PlacementError(f"MAINSPRING_DEVICE={device}: the engine's CUDA path is not built yet; use cpu")
    if dtype == "auto":
        dtype = "fp32"
    return Placement(torch.device(device), DTYPES[dtype])


def check_supported(placement: Placement, *, quantization: str | None, kv_policy: bool, speculative: bool,
                    kv_disk: bool) -> None:
    """Refuse the engine options whose kernels are fp32-only when the placement is not fp32."""
    if placement.is_fp32:
        return
    name = placement.dtype_name
    for on, what, setting in ((quantization is not None, f"quantization {quantization!r}", "MAINSPRING_QUANTIZATION"),
                              (kv_policy, "a KV policy (window, sinks, cold tier)", "MAINSPRING_KV_POLICY"),
                              (speculative, "speculative decoding", "MAINSPRING_SPECULATIVE"),
                              (kv_disk, "the KV disk tier (fp32 block files)", "MAINSPRING_KV_DISK_CACHE_MB")):
        if on:
            raise PlacementError(f"MAINSPRING_DTYPE={name} with {what}: those kernels run fp32 only; unset "
                                 f"{setting} or use MAINSPRING_DTYPE=fp32")
