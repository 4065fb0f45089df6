"""The simulated GPU's dispatch layer: every aten op run on the host tensors, held to CUDA's rules."""

from __future__ import annotations

import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from tests.simulated_cuda.int4 import int4pack, int4pack_mm
from tests.simulated_cuda.rules import INDEXING, SyncError, has_cuda_kernel, waits
from tests.simulated_cuda.tensor import CPU, DeviceTensor, host_of, is_cuda_device, wrap_aliases

if TYPE_CHECKING:
    from tests.simulated_cuda import SimulatedCuda
    from tests.simulated_cuda.runtime import CUDAGraph

aten = torch.ops.aten


class Kernels(TorchDispatchMode):
    """Runs every op on the host tensors, enforcing what CUDA enforces and counting what it makes wait."""

    _active: list[Kernels] = []

    def __init__(self, sim: SimulatedCuda) -> None:
        super().__init__()
        self.sim = sim
        self.capture: CUDAGraph | None = None
        # by id (tensors compare elementwise): pinned host tensors, and non-blocking device-to-host copies whose
        # values the host has not waited for yet
        self._pinned: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self.pending: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

    @classmethod
    def current(cls) -> Kernels:
        return cls._active[-1]

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, DeviceTensor):
            raise RuntimeError("cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned")
        with torch.utils._python_dispatch._disable_current_modes():
            out = t.clone()
        self._pinned[id(out)] = out
        return out

    def is_pinned(self, t: torch.Tensor) -> bool:
        return self._pinned.get(id(t)) is t

    def _sync(self, what: str) -> None:
        if self.capture is not None:
            raise SyncError(f"CUDA error: operation not permitted when stream is capturing ({what})")
        self.pending.clear()
        self.sim.syncs[what] += 1
        if self.sim.sync_debug_mode == "error":
            raise RuntimeError(f"called a synchronizing CUDA operation ({what})")
        if self.sim.sync_debug_mode == "warn":
            warnings.warn(f"called a synchronizing CUDA operation ({what})", UserWarning, stacklevel=3)

    def _upload(self, src: torch.Tensor, what: str, non_blocking: bool) -> None:
        """A host-to-device copy. Blocking, torch waits for the stream after it (`memcpy_and_sync`): a sync."""
        if self.capture is not None:
            raise SyncError(f"CUDA error: operation not permitted when stream is capturing ({what})")
        self.sim.uploads[what] += 1
        if not non_blocking:
            self._sync(f"blocking {what}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = dict(kwargs or {})
        if func is aten._to_copy.default:
            return self._to_copy(args[0], kwargs)
        if func is aten.copy_.default:
            return self.copy(*args, **kwargs)
        if func is aten.lift_fresh.default:
            return args[0]
        if func is aten._pin_memory.default:
            return self.pin(args[0])
        if func is aten.is_pinned.default:
            return self.is_pinned(args[0])
        if func is aten._convert_weight_to_int4pack.default:
            return self._run(func, args, kwargs, host_func=int4pack)
        if func is aten._weight_int4pack_mm.default:
            return self._run(func, args, kwargs, host_func=int4pack_mm)
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            with self:  # inference mode lets some composites (Tensor.to) through undecomposed: run their parts here
                return func.decompose(*args, **kwargs)
        return self._run(func, args, kwargs)

    def _run(self, func: Any, args: tuple, kwargs: dict, host_func: Callable | None = None) -> Any:
        flat, spec = tree_flatten((args, kwargs))
        on_device = any(isinstance(x, DeviceTensor) for x in flat) or is_cuda_device(kwargs.get("device"))
        if on_device:
            if host_func is None and not has_cuda_kernel(func):
                raise NotImplementedError(f"Could not run '{func.name()}' with arguments from the 'CUDA' backend "
                                          "(the simulated GPU has only the kernels CUDA builds of torch have)")
            cpu = [x for x in flat if type(x) is torch.Tensor and x.dim() > 0]
            if cpu and func in INDEXING:  # CUDA copies CPU index tensors over
                indices = [i for i in args[1] if i is not None]
                for i in indices:
                    if type(i) is torch.Tensor:
                        self._upload(i, "index tensor copy", False)
                cpu = [x for x in cpu if not any(x is i for i in indices)]
            if cpu:
                raise RuntimeError(f"{func}: Expected all tensors to be on the same device, but found at least two "
                                   "devices, cuda:0 and cpu!")
            if waits(func, args, kwargs):
                self._sync(str(func))
        hargs, hkwargs = tree_unflatten([host_of(x) for x in flat], spec)
        out = (host_func or func)(*hargs, **hkwargs)
        if not on_device or func in (aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default) \
                or ("device" in kwargs and not is_cuda_device(kwargs["device"])):
            return out
        wrapped = wrap_aliases(args, hargs, out)
        if self.capture is not None:
            self.capture.ops.append((func if host_func is None else host_func, args, kwargs, wrapped))
        return wrapped

    def index(self, func: Callable, target: DeviceTensor, index: Any, value: Any = None) -> Any:
        """`target[index]` or `target[index] = value` on the host tensors: CPU index tensors and a CPU value are
        copied over (as CUDA does), a boolean mask makes the host wait (its nonzero) unless it fills a scalar."""
        flat = tree_flatten(index)[0]
        for x in flat:
            if type(x) is torch.Tensor and x.dim() > 0:
                self._upload(x, "index tensor copy", False)
        if type(value) is torch.Tensor and value.dim() > 0:
            self._upload(value, "host-to-device copy", False)
        args = (target, index) if func is torch.Tensor.__getitem__ else (target, index, value)
        return self.onhost_of(func, args, {})

    def onhost_of(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        """A tensor method whose binding cannot run on the simulated device, run on the host tensors: its devices
        checked here, the aten ops it runs by `Watch`."""
        flat = tree_flatten((args, kwargs))[0]
        if any(type(x) is torch.Tensor and x.dim() > 0 for x in flat) and func not in (
                torch.Tensor.__getitem__, torch.Tensor.__setitem__):
            raise RuntimeError(f"{func.__name__}: Expected all tensors to be on the same device, but found at least "
                               "two devices, cuda:0 and cpu!")
        hargs, hkwargs = tree_map(host_of, (args, kwargs))
        with torch.utils._python_dispatch._disable_current_modes(), Watch(self):
            out = func(*hargs, **hkwargs)
        wrapped = None if out is None else wrap_aliases(args, hargs, out)
        if self.capture is not None:
            self.capture.ops.append((func, args, kwargs, wrapped))
        return args[0] if wrapped is None else wrapped

    def _to_copy(self, src: torch.Tensor, kwargs: dict) -> torch.Tensor:
        target = kwargs.get("device")
        to_device = is_cuda_device(target) if target is not None else isinstance(src, DeviceTensor)
        if not to_device and not isinstance(src, DeviceTensor):
            return aten._to_copy.default(src, **kwargs)  # nothing to do with the GPU (CPU, meta)
        hkwargs = {**kwargs, "device": CPU}
        hkwargs.pop("pin_memory", None)
        host_src = src.host if isinstance(src, DeviceTensor) else src
        if isinstance(src, DeviceTensor) and not to_device:
            if not kwargs.get("non_blocking", False):
                self._sync("device-to-host copy")
            else:  # into pinned memory, valid once the host has waited for the device
                out = aten._to_copy.default(host_src, **hkwargs)
                self._pinned[id(out)] = self.pending[id(out)] = out
                return out
        elif not isinstance(src, DeviceTensor) and to_device:
            self._upload(src, "host-to-device copy", kwargs.get("non_blocking", False))
        out = aten._to_copy.default(host_src, **hkwargs)
        if not to_device:
            return out
        wrapped = DeviceTensor(out)
        if self.capture is not None:
            self.capture.ops.append((aten._to_copy.default, (src,), kwargs, wrapped))
        return wrapped

    def copy(self, dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        if isinstance(src, DeviceTensor) and not isinstance(dst, DeviceTensor):
            self._sync("device-to-host copy")
        elif isinstance(dst, DeviceTensor) and type(src) is torch.Tensor and src.dim() > 0:
            self._upload(src, "host-to-device copy", non_blocking)
        elif isinstance(dst, DeviceTensor) and self.capture is not None:
            self.capture.ops.append((aten.copy_.default, (dst, src), {}, dst))
        (dst.host if isinstance(dst, DeviceTensor) else dst).copy_(src.host if isinstance(src, DeviceTensor) else src)
        return dst

    def replay(self, graph: CUDAGraph) -> None:
        with torch.utils._python_dispatch._disable_current_modes():
            for func, args, kwargs, out in graph.ops:
                hargs, hkwargs = tree_map(host_of, (args, kwargs))
                if func is aten._to_copy.default:
                    hkwargs = {**hkwargs, "device": CPU}
                fresh = func(*hargs, **hkwargs)
                for was, now in zip(tree_flatten(out)[0], tree_flatten(fresh)[0]):
                    if isinstance(was, DeviceTensor) and isinstance(now, torch.Tensor) \
                            and now.untyped_storage().data_ptr() != was.host.untyped_storage().data_ptr():
                        was.host.copy_(now)  # a functional op's output: the captured buffer takes the new values


class Watch(TorchDispatchMode):
    """Under `on_host`: the aten ops a tensor method ran on the host, held to the device's rules (a CUDA kernel,
    and a count of the ones that make the host wait)."""

    def __init__(self, kernels: Kernels) -> None:
        super().__init__()
        self.kernels = kernels

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if not has_cuda_kernel(func):
            raise NotImplementedError(f"Could not run '{func.name()}' with arguments from the 'CUDA' backend")
        if waits(func, args, kwargs):
            self.kernels._sync(str(func))
        return func(*args, **kwargs)
