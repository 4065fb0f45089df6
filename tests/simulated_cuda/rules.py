"""What CUDA refuses and what makes the host wait: the kernels a CUDA build of torch has, the ops that read the
device to learn a size."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
import yaml

aten = torch.ops.aten

# ops that make the host wait for the device (torch's sync debug mode flags these on a GPU)
SYNCING = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
            aten._unique2.default, aten.unique_consecutive.default, aten.unique_dim.default,
            aten.equal.default, aten.is_nonzero.default, aten.bincount.default}
# the ops CUDA lets take CPU index tensors (they are copied over)
INDEXING = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}


@functools.cache
def cuda_kernels() -> dict[str, bool]:
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


def has_cuda_kernel(func: torch._ops.OpOverload) -> bool:
    if func.namespace == "aten":
        overload = func._overloadname
        return cuda_kernels().get(func._opname + ("" if overload == "default" else f".{overload}"), True)
    name = func.name()
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
               for key in ("CUDA", "CompositeExplicitAutograd", "CompositeImplicitAutograd"))


class SyncError(RuntimeError):
    pass


def waits(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether the op makes the host wait for the device (to learn a size it computes)."""
    if func is aten.repeat_interleave.Tensor:  # its output size, unless given
        return kwargs.get("output_size", args[1] if len(args) > 1 else None) is None
    return func in SYNCING or (func in INDEXING and bool_index(args))


def bool_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else []
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or [])
