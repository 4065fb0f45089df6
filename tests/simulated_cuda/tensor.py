"""The simulated GPU's tensors: cuda:0 to torch and to the code under test, a host tensor underneath."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("cuda", 0)
CPU = torch.device("cpu")


class DeviceTensor(torch.Tensor):
    """A tensor on the simulated GPU: cuda:0 to torch and to the code under test, a host tensor underneath."""

    host: torch.Tensor

    @staticmethod
    def __new__(cls, host: torch.Tensor) -> DeviceTensor:
        return torch.Tensor._make_wrapper_subclass(cls, host.shape, strides=host.stride(),  # type: ignore[return-value]
                                                   storage_offset=host.storage_offset(), dtype=host.dtype,
                                                   device=DEVICE, requires_grad=host.requires_grad)

    def __init__(self, host: torch.Tensor) -> None:
        self.host = host

    def data_ptr(self) -> int:  # type: ignore[override]
        return self.host.data_ptr()

    def __repr__(self) -> str:  # type: ignore[override]
        return f"DeviceTensor({self.host!r}, device='cuda:0')"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        raise RuntimeError(f"{func}: a tensor of the simulated GPU used outside `SimulatedCuda()`")


def is_cuda_device(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def host_of(x: Any) -> Any:
    if isinstance(x, DeviceTensor):
        return x.host
    return CPU if isinstance(x, torch.device) and x.type == "cuda" else x


def wrap_aliases(args: tuple, hargs: tuple, out: Any) -> Any:
    """Wrap an op's host outputs; an output that is one of its host inputs (an in-place op) is that input."""
    by_id = {id(h): a for a, h in zip(tree_flatten(args)[0], tree_flatten(hargs)[0]) if isinstance(a, DeviceTensor)}

    def wrap(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        same = by_id.get(id(x))
        return DeviceTensor(x) if same is None else same

    return tree_map(wrap, out)


class DeviceGenerator(torch.Generator):
    """torch.Generator(device="cuda") inside the simulation: a host generator that says it belongs to the GPU."""

    def __new__(cls, device: Any = "cpu") -> Any:
        gen = super().__new__(cls)
        gen.on_device = is_cuda_device(device)
        return gen

    def __init__(self, device: Any = "cpu") -> None:
        super().__init__()
