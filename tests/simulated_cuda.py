"""A simulated CUDA device for the engine's CUDA tests on a machine without a GPU.

Inside `SimulatedCuda()` torch says it has one GPU (`torch.cuda.is_available()`, capability 9.0 by default).
Every tensor put "on" it is a `DeviceTensor`: its `.device` is cuda:0 and `.is_cuda` is True, while its values
live in a host tensor and each op runs torch's CPU kernel on them. What makes a real GPU refuse or slow a program
is enforced or counted here, so that a CUDA code path can be run and checked before a GPU is ever lent:

- devices: an op mixing cuda and CPU tensors fails as on CUDA ("Expected all tensors to be on the same
  device"), except the mixes CUDA accepts: a 0-dim CPU tensor (a scalar) and CPU index tensors;
  `.numpy()` of a device tensor fails; random ops on the device take only a device generator;
- kernels: an aten op whose `native_functions.yaml` entry dispatches to no CUDA (or composite) kernel fails
  as the dispatcher does ("Could not run ... 'CUDA' backend"); so do ops of other namespaces (CPU extensions);
- host round trips: every op that makes the host wait for the device (a blocking copy either way - torch
  synchronizes the stream after a blocking host-to-device copy -, `.item()`, `.tolist()`, `nonzero`,
  boolean-mask indexing, a stream's or `torch.cuda.synchronize()` ...) is counted in `syncs`, and
  `torch.cuda.set_sync_debug_mode("warn" | "error")` warns or raises on them as torch does on a GPU;
  host-to-device copies are counted in `uploads`; a non-blocking device-to-host copy read before the next
  wait fails (its values would not have arrived);
- CUDA graphs: `torch.cuda.graph` records the ops of the capture, and `CUDAGraph.replay()` runs those ops
  again on the tensors they were captured with, writing into the captured outputs. Whatever the capture
  baked in (a Python number, a tensor made outside the graph's buffers) stays baked in, as on a GPU. A sync
  or a host-to-device copy during capture fails ("operation not permitted when stream is capturing").
- torch's CUDA int4 kernels (`_convert_weight_to_int4pack`, `_weight_int4pack_mm`) are emulated from their
  contract as read in ATen's CUDA source: uint8 [N, K/2] codes with column 2j in the high nibble, bf16
  activations, scales_and_zeros [K/group, N, 2] in bf16, w = (q - 8) * scale + zero; their shape checks are
  the kernel's. The packed tensor has the kernel's shape; what it holds is this emulation's own.

Inference only: run it under `torch.no_grad()` or `torch.inference_mode()` (building an autograd graph asks
the missing CUDA runtime for a device guard, and the process aborts).

What it cannot tell: speed, memory, and numerics of CUDA's own kernels (cuBLAS, FlashAttention, tinygemm's
tiles) - results are the CPU kernels' -, and real concurrency between streams (streams are sequential here).
A capture runs its ops once (CUDA only records them), so a capture's writes to tensors made before it happen.
A test that passes here still has to pass on a GPU; one that fails here would fail there.
"""

from __future__ import annotations

import functools
import types
import warnings
import weakref
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch
import yaml
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

aten = torch.ops.aten
DEVICE = torch.device("cuda", 0)
_CPU = torch.device("cpu")

# ops that make the host wait for the device (torch's sync debug mode flags these on a GPU)
_SYNCING = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
            aten._unique2.default, aten.unique_consecutive.default, aten.unique_dim.default,
            aten.equal.default, aten.is_nonzero.default, aten.bincount.default}
# the ops CUDA lets take CPU index tensors (they are copied over)
_INDEXING = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}


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


def _on_device(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cuda"


@functools.cache
def _cuda_kernels() -> dict[str, bool]:
    """aten op name (with overload) -> whether ATen has a CUDA or composite kernel for it."""
    path = Path(torch.__file__).parent.parent / "torchgen" / "packaged" / "ATen" / "native" / "native_functions.yaml"
    entries = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    own, delegate = {}, {}
    for entry in entries:
        name = entry["func"].split("(", 1)[0]
        keys = {k.strip() for key in entry.get("dispatch", {}) for k in key.split(",")}
        own[name] = (any(k == "CUDA" or k.startswith("Composite") for k in keys)
                     or "ufunc_inner_loop" in entry  # kernels generated for every backend
                     or not (keys or "structured_delegate" in entry))  # no dispatch section at all: composite
        if "structured_delegate" in entry:  # the CUDA kernel is its out= variant's
            delegate[name] = entry["structured_delegate"]
    return {**own, **{name: own[name] or own.get(target, True) for name, target in delegate.items()}}


def _has_cuda_kernel(func: torch._ops.OpOverload) -> bool:
    if func.namespace == "aten":
        overload = func._overloadname
        return _cuda_kernels().get(func._opname + ("" if overload == "default" else f".{overload}"), True)
    name = func.name()
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
               for key in ("CUDA", "CompositeExplicitAutograd", "CompositeImplicitAutograd"))


class SyncError(RuntimeError):
    pass


class CUDAGraph:
    """Stands in for torch.cuda.CUDAGraph: the ops recorded by a capture, run again at each replay."""

    def __init__(self) -> None:
        self.ops: list[tuple[Any, tuple, dict, Any]] = []
        self._mode: _Kernels | None = None

    def replay(self) -> None:
        if self._mode is None:
            raise RuntimeError("CUDAGraph.replay: the graph was never captured")
        self._mode.replay(self)

    def pool(self) -> tuple[str, int]:
        return ("graph pool", id(self))

    def reset(self) -> None:
        self.ops.clear()


class _Stream:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.device = DEVICE

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        _Kernels.current()._sync("Stream.synchronize")

    def record_event(self, event: Any = None) -> Any:
        return event or _Event()

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class _Event:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


# methods that read a device tensor's values on the host
_READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__int__, torch.Tensor.__float__,
          torch.Tensor.__bool__, torch.Tensor.__index__}


class _Functions(TorchFunctionMode):
    """Before the C++ bindings: a device without an index is cuda:0 (the bindings would ask the missing CUDA
    runtime for the current device), and `Tensor.cuda()` is `.to(cuda:0)`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        pending = _Kernels.current().pending
        if pending and any(isinstance(x, torch.Tensor) and pending.get(id(x)) is x
                           for x in tree_flatten((args, kwargs))[0]):
            raise RuntimeError(f"{getattr(func, '__name__', func)}: reads a non-blocking device-to-host copy before "
                               "the host waited for the device (its values may not have arrived)")
        if func is torch.Tensor.cuda:
            return args[0].to(DEVICE, non_blocking=kwargs.get("non_blocking", False))
        if func is torch.Tensor.numpy and isinstance(args[0], DeviceTensor):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        if func in _READS and isinstance(args[0], DeviceTensor):
            _Kernels.current()._sync(f"Tensor.{func.__name__}")  # one device-to-host copy
            return func(args[0].host)
        if func is torch.Tensor.pin_memory:
            return _Kernels.current().pin(args[0])
        if func is torch.Tensor.is_pinned:
            return _Kernels.current().is_pinned(args[0])

        if func is torch.Tensor.copy_ and any(isinstance(x, DeviceTensor) for x in args[:2]):
            return _Kernels.current().copy(*args, **kwargs)  # the binding guards the missing runtime's device
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and isinstance(args[0], DeviceTensor):
            return _Kernels.current().index(func, *args)  # the C++ binding asks the missing runtime for a guard

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
            on_device = any(isinstance(x, DeviceTensor) for x in flat) or _on_device(kwargs.get("device"))
            if on_device != getattr(gen, "on_device", False):
                want, got = ("cuda", "cpu") if on_device else ("cpu", "cuda")
                raise RuntimeError(f"{func.__name__}: Expected a '{want}' device type for generator but found '{got}'")
        try:
            return func(*args, **kwargs)
        except RuntimeError as exc:  # a binding that sets a device guard first (contiguous, __invert__, ...)
            if "not linked with support for cuda" not in str(exc):
                raise
            return _Kernels.current().on_host(func, args, kwargs)


class _Kernels(TorchDispatchMode):
    """Runs every op on the host tensors, enforcing what CUDA enforces and counting what it makes wait."""

    _active: list[_Kernels] = []

    def __init__(self, sim: SimulatedCuda) -> None:
        super().__init__()
        self.sim = sim
        self.capture: CUDAGraph | None = None
        # by id (tensors compare elementwise): pinned host tensors, and non-blocking device-to-host copies whose
        # values the host has not waited for yet
        self._pinned: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self.pending: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

    @classmethod
    def current(cls) -> _Kernels:
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
            return self._run(func, args, kwargs, host_func=_emulated_int4pack)
        if func is aten._weight_int4pack_mm.default:
            return self._run(func, args, kwargs, host_func=_emulated_int4pack_mm)
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            with self:  # inference mode lets some composites (Tensor.to) through undecomposed: run their parts here
                return func.decompose(*args, **kwargs)
        return self._run(func, args, kwargs)

    def _run(self, func: Any, args: tuple, kwargs: dict, host_func: Callable | None = None) -> Any:
        flat, spec = tree_flatten((args, kwargs))
        on_device = any(isinstance(x, DeviceTensor) for x in flat) or _on_device(kwargs.get("device"))
        if on_device:
            if host_func is None and not _has_cuda_kernel(func):
                raise NotImplementedError(f"Could not run '{func.name()}' with arguments from the 'CUDA' backend "
                                          "(the simulated GPU has only the kernels CUDA builds of torch have)")
            cpu = [x for x in flat if type(x) is torch.Tensor and x.dim() > 0]
            if cpu and func in _INDEXING:  # CUDA copies CPU index tensors over
                indices = [i for i in args[1] if i is not None]
                for i in indices:
                    if type(i) is torch.Tensor:
                        self._upload(i, "index tensor copy", False)
                cpu = [x for x in cpu if not any(x is i for i in indices)]
            if cpu:
                raise RuntimeError(f"{func}: Expected all tensors to be on the same device, but found at least two "
                                   "devices, cuda:0 and cpu!")
            if _waits(func, args, kwargs):
                self._sync(str(func))
        hargs, hkwargs = tree_unflatten([_host(x) for x in flat], spec)
        out = (host_func or func)(*hargs, **hkwargs)
        if not on_device or func in (aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default) \
                or ("device" in kwargs and not _on_device(kwargs["device"])):
            return out
        wrapped = _wrap_aliases(args, hargs, out)
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
        return self.on_host(func, args, {})

    def on_host(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        """A tensor method whose binding cannot run on the simulated device, run on the host tensors: its devices
        checked here, the aten ops it runs by `_Watch`."""
        flat = tree_flatten((args, kwargs))[0]
        if any(type(x) is torch.Tensor and x.dim() > 0 for x in flat) and func not in (
                torch.Tensor.__getitem__, torch.Tensor.__setitem__):
            raise RuntimeError(f"{func.__name__}: Expected all tensors to be on the same device, but found at least "
                               "two devices, cuda:0 and cpu!")
        hargs, hkwargs = tree_map(_host, (args, kwargs))
        with torch.utils._python_dispatch._disable_current_modes(), _Watch(self):
            out = func(*hargs, **hkwargs)
        wrapped = None if out is None else _wrap_aliases(args, hargs, out)
        if self.capture is not None:
            self.capture.ops.append((func, args, kwargs, wrapped))
        return args[0] if wrapped is None else wrapped

    def _to_copy(self, src: torch.Tensor, kwargs: dict) -> torch.Tensor:
        target = kwargs.get("device")
        to_device = _on_device(target) if target is not None else isinstance(src, DeviceTensor)
        if not to_device and not isinstance(src, DeviceTensor):
            return aten._to_copy.default(src, **kwargs)  # nothing to do with the GPU (CPU, meta)
        hkwargs = {**kwargs, "device": _CPU}
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
                hargs, hkwargs = tree_map(_host, (args, kwargs))
                if func is aten._to_copy.default:
                    hkwargs = {**hkwargs, "device": _CPU}
                fresh = func(*hargs, **hkwargs)
                for was, now in zip(tree_flatten(out)[0], tree_flatten(fresh)[0]):
                    if isinstance(was, DeviceTensor) and isinstance(now, torch.Tensor) \
                            and now.untyped_storage().data_ptr() != was.host.untyped_storage().data_ptr():
                        was.host.copy_(now)  # a functional op's output: the captured buffer takes the new values


class _Watch(TorchDispatchMode):
    """Under `on_host`: the aten ops a tensor method ran on the host, held to the device's rules (a CUDA kernel,
    and a count of the ones that make the host wait)."""

    def __init__(self, kernels: _Kernels) -> None:
        super().__init__()
        self.kernels = kernels

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if not _has_cuda_kernel(func):
            raise NotImplementedError(f"Could not run '{func.name()}' with arguments from the 'CUDA' backend")
        if _waits(func, args, kwargs):
            self.kernels._sync(str(func))
        return func(*args, **kwargs)


def _waits(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether the op makes the host wait for the device (to learn a size it computes)."""
    if func is aten.repeat_interleave.Tensor:  # its output size, unless given
        return kwargs.get("output_size", args[1] if len(args) > 1 else None) is None
    return func in _SYNCING or (func in _INDEXING and _bool_index(args))


def _host(x: Any) -> Any:
    if isinstance(x, DeviceTensor):
        return x.host
    return _CPU if isinstance(x, torch.device) and x.type == "cuda" else x


def _bool_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else []
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or [])


def _wrap_aliases(args: tuple, hargs: tuple, out: Any) -> Any:
    """Wrap an op's host outputs; an output that is one of its host inputs (an in-place op) is that input."""
    by_id = {id(h): a for a, h in zip(tree_flatten(args)[0], tree_flatten(hargs)[0]) if isinstance(a, DeviceTensor)}

    def wrap(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        same = by_id.get(id(x))
        return DeviceTensor(x) if same is None else same

    return tree_map(wrap, out)


def _emulated_int4pack(codes: torch.Tensor, inner_k_tiles: int) -> torch.Tensor:
    if codes.dtype != torch.uint8 or codes.dim() != 2:
        raise RuntimeError("_convert_weight_to_int4pack: expected a 2D uint8 tensor [N, K/2]")
    if inner_k_tiles not in (2, 4, 8):
        raise RuntimeError("_convert_weight_to_int4pack: innerKTiles must be 2, 4, or 8")
    n, k = codes.shape[0], codes.shape[1] * 2
    if n % 8 or k % (16 * inner_k_tiles):
        raise RuntimeError(f"_convert_weight_to_int4pack: N={n} must divide 8, K={k} must divide {16 * inner_k_tiles}")
    # the kernel's shape; the emulation keeps the bytes in its own order (the high-nibble-first codes as given)
    return codes.contiguous().view(torch.int32).reshape(n // 8, k // (16 * inner_k_tiles), 32, inner_k_tiles // 2)


def _emulated_int4pack_mm(x: torch.Tensor, packed: torch.Tensor, group_size: int, sz: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.bfloat16:
        raise RuntimeError(f"_weight_int4pack_mm: expected x to be bf16, got {x.dtype}")
    if group_size not in (32, 64, 128, 256):
        raise RuntimeError("_weight_int4pack_mm: qGroupSize must be 32, 64, 128 or 256")
    n = packed.shape[0] * 8
    k = packed.shape[1] * 16 * packed.shape[3] * 2
    if x.dim() != 2 or x.shape[1] != k or not x.is_contiguous():
        raise RuntimeError(f"_weight_int4pack_mm: expected a contiguous x of shape [M, {k}], got {tuple(x.shape)}")
    if sz.dtype != torch.bfloat16 or tuple(sz.shape) != (k // group_size, n, 2):
        raise RuntimeError(f"_weight_int4pack_mm: expected qScaleAndZeros bf16 [{k // group_size}, {n}, 2], got "
                           f"{sz.dtype} {tuple(sz.shape)}")
    codes = packed.reshape(-1).view(torch.uint8).reshape(n, k // 2)
    q = torch.stack([codes >> 4, codes & 15], dim=-1).reshape(n, k).float()  # column 2j in the high nibble
    scale = sz[..., 0].float().t().repeat_interleave(group_size, dim=1)
    zero = sz[..., 1].float().t().repeat_interleave(group_size, dim=1)
    w = (q - 8) * scale + zero
    return (x.float() @ w.t()).to(torch.bfloat16)


class _DeviceGenerator(torch.Generator):
    """torch.Generator(device="cuda") inside the simulation: a host generator that says it belongs to the GPU."""

    def __new__(cls, device: Any = "cpu") -> Any:
        gen = super().__new__(cls)
        gen.on_device = _on_device(device)
        return gen

    def __init__(self, device: Any = "cpu") -> None:
        super().__init__()


class SimulatedCuda:
    """Enter to give torch one simulated GPU (see the module docstring); exit to take it away."""

    def __init__(self, capability: tuple[int, int] = (9, 0), name: str = "simulated GPU",
                 total_memory: int = 80 << 30) -> None:
        self.capability, self.name, self.total_memory = capability, name, total_memory
        self.syncs: Counter[str] = Counter()
        self.uploads: Counter[str] = Counter()
        self.sync_debug_mode: str | None = None
        self._saved: list[tuple[Any, str, Any]] = []
        self._kernels = _Kernels(self)
        self._functions = _Functions()

    def reset_counts(self) -> None:
        self.syncs.clear()
        self.uploads.clear()

    @property
    def total_syncs(self) -> int:
        return sum(self.syncs.values())

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, getattr(owner, name, None)))
        setattr(owner, name, value)

    def __enter__(self) -> SimulatedCuda:
        if torch.cuda.is_available():
            raise RuntimeError("SimulatedCuda is for machines without a GPU; torch sees one")
        sim, kernels = self, self._kernels
        props = types.SimpleNamespace(name=self.name, major=self.capability[0], minor=self.capability[1],
                                      total_memory=self.total_memory, multi_processor_count=132)

        class graph:
            def __init__(self, cuda_graph: CUDAGraph, pool: Any = None, stream: Any = None,
                         capture_error_mode: str = "global") -> None:
                self.cuda_graph = cuda_graph

            def __enter__(self) -> None:
                self.cuda_graph.ops.clear()
                self.cuda_graph._mode = kernels
                kernels.capture = self.cuda_graph

            def __exit__(self, *exc: Any) -> None:
                kernels.capture = None

        def synchronize(device: Any = None) -> None:
            kernels._sync("torch.cuda.synchronize")

        def set_sync_debug_mode(mode: int | str) -> None:
            sim.sync_debug_mode = {0: None, 1: "warn", 2: "error", "default": None}.get(mode, mode)  # type: ignore

        cuda = torch.cuda
        for name, value in {
            "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
            "is_initialized": lambda: True, "_lazy_init": lambda: None, "set_device": lambda device: None,
            "get_device_capability": lambda device=None: self.capability,
            "get_device_name": lambda device=None: self.name, "get_device_properties": lambda device=None: props,
            "is_bf16_supported": lambda *a, **k: True, "synchronize": synchronize,
            "mem_get_info": lambda device=None: (self.total_memory, self.total_memory),
            "memory_allocated": lambda device=None: 0, "max_memory_allocated": lambda device=None: 0,
            "reset_peak_memory_stats": lambda device=None: None, "empty_cache": lambda: None,
            "manual_seed": lambda seed: None, "manual_seed_all": lambda seed: None,
            "Stream": _Stream, "Event": _Event, "current_stream": lambda device=None: _Stream(),
            "default_stream": lambda device=None: _Stream(), "stream": lambda s: s if s is not None else _Stream(),
            "CUDAGraph": CUDAGraph, "graph": graph, "graph_pool_handle": lambda: ("graph pool", 0),
            "set_sync_debug_mode": set_sync_debug_mode,
            "get_sync_debug_mode": lambda: {None: 0, "warn": 1, "error": 2}[sim.sync_debug_mode],
        }.items():
            self._patch(cuda, name, value)
        self._patch(torch, "Generator", _DeviceGenerator)
        # Module.to(): a new Parameter around the device tensor (`param.data = ...` would keep a plain Parameter
        # object over the device tensor's storage-less implementation)
        self._overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        self._lift = torch._C._only_lift_cpu_tensors()
        torch._C._set_only_lift_cpu_tensors(True)  # torch.tensor(..., device="cuda") builds on the host, then moves
        torch._C._ensureCUDADeviceGuardSet()
        _Kernels._active.append(kernels)
        self._functions.__enter__()
        kernels.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._kernels.__exit__(*exc)
        self._functions.__exit__(*exc)
        _Kernels._active.pop()
        torch._C._set_only_lift_cpu_tensors(self._lift)
        torch.__future__.set_overwrite_module_params_on_conversion(self._overwrite)
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved.clear()
