"""The simulated GPU's torch-function layer: what happens before torch's C++ bindings would reach for the CUDA
runtime this build lacks."""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from tests.simulated_cuda.kernels import Kernels
from tests.simulated_cuda.tensor import DEVICE, DeviceTensor, is_cuda_device

# methods that read a device tensor's values on the host
READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__int__, torch.Tensor.__float__,
          torch.Tensor.__bool__, torch.Tensor.__index__}


class Functions(TorchFunctionMode):
    """Before the C++ bindings: a device without an index is cuda:0 (the bindings would ask the missing CUDA
    runtime for the current device), and `Tensor.cuda()` is `.to(cuda:0)`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        pending = Kernels.current().pending
        if pending and any(isinstance(x, torch.Tensor) and pending.get(id(x)) is x
                           for x in tree_flatten((args, kwargs))[0]):
            raise RuntimeError(f"{getattr(func, '__name__', func)}: reads a non-blocking device-to-host copy before "
                               "the host waited for the device (its values may not have arrived)")
        if func is torch.Tensor.cuda:
            return args[0].to(DEVICE, non_blocking=kwargs.get("non_blocking", False))
        if func is torch.Tensor.numpy and isinstance(args[0], DeviceTensor):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        if func in READS and isinstance(args[0], DeviceTensor):
            Kernels.current()._sync(f"Tensor.{func.__name__}")  # one device-to-host copy
            return func(args[0].host)
        if func is torch.Tensor.pin_memory:
            return Kernels.current().pin(args[0])
        if func is torch.Tensor.is_pinned:
            return Kernels.current().is_pinned(args[0])

        if func is torch.Tensor.copy_ and any(isinstance(x, DeviceTensor) for x in args[:2]):
            return Kernels.current().copy(*args, **kwargs)  # the binding guards the missing runtime's device
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and isinstance(args[0], DeviceTensor):
            return Kernels.current().index(func, *args)  # the C++ binding asks the missing runtime for a guard

        def indexed(x: Any) -> Any:
            if isinstance(x, torch.device) and x.type == "cuda" and x.index is None:
                return DEVICE
            if isinstance(x, str) and x == "cuda":
                return DEVICE
            return x

        if func is not torch.device:  # torch.device("cuda") itself has no index, on a GPU too
            args, kwargs = tree_map(indexed, (args, kwargs))
        gen = kwargs.get("generator")
        if isinstance(gen, torch.Generator):  # checked here: below, the generator is a new object of the base class
            flat = tree_flatten((args, kwargs))[0]
            on_device = any(isinstance(x, DeviceTensor) for x in flat) or is_cuda_device(kwargs.get("device"))
            if on_device != getattr(gen, "on_device", False):
                want, got = ("cuda", "cpu") if on_device else ("cpu", "cuda")
                raise RuntimeError(f"{func.__name__}: Expected a '{want}' device type for generator but found '{got}'")
        try:
            return func(*args, **kwargs)
        except RuntimeError as exc:  # a binding that sets a device guard first (contiguous, __invert__, ...)
            if "not linked with support for cuda" not in str(exc):
                raise
            return Kernels.current().onhost_of(func, args, kwargs)
