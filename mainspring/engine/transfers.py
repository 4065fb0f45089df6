"""A step's small tensors between the host and the device, with one wait per step.

On a GPU, a blocking host-to-device copy (`torch.tensor(values, device="cuda")`, `t.to("cuda")`) synchronizes
the stream after it: the host waits until every kernel queued before it has run, so it cannot prepare the next
piece of work while the GPU computes, and a step pays one such wait per tensor it sends (token ids, positions,
slots, sampling parameters). `upload` copies without that wait: from pageable memory CUDA stages the bytes before
the call returns, so the source may go at once. What a step reads back (its sampled token ids, with their
logprobs when asked) comes in one `download`: the copies queued together, then one wait.

On the CPU both are no-ops: the tensors are already where they are needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def upload(values: torch.Tensor | Sequence, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`values` (a host tensor, or a list of numbers) as a tensor of `dtype` on `device`, the host not waiting."""
    t = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


def download(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The tensors on the host, after one wait for the device that covers all of them."""
    devices = {t.device for t in tensors if t.device.type != "cpu"}
    if not devices:
        return list(tensors)
    out = [t.to("cpu", non_blocking=True) for t in tensors]  # into pinned memory, read only after the wait
    for device in devices:
        torch.cuda.current_stream(device).synchronize()
    return out
