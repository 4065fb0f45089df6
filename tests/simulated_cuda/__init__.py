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

import types
from collections import Counter
from typing import Any

import torch

from tests.simulated_cuda.functions import Functions
from tests.simulated_cuda.kernels import Kernels
from tests.simulated_cuda.runtime import CUDAGraph, Event, Stream
from tests.simulated_cuda.tensor import DEVICE, DeviceGenerator, DeviceTensor

__all__ = ["DEVICE", "DeviceTensor", "SimulatedCuda"]


class SimulatedCuda:
    """Enter to give torch one simulated GPU (see the module docstring); exit to take it away."""

    def __init__(self, capability: tuple[int, int] = (9, 0), name: str = "simulated GPU",
                 total_memory: int = 80 << 30) -> None:
        self.capability, self.name, self.total_memory = capability, name, total_memory
        self.syncs: Counter[str] = Counter()
        self.uploads: Counter[str] = Counter()
        self.sync_debug_mode: str | None = None
        self._saved: list[tuple[Any, str, Any]] = []
        self._kernels = Kernels(self)
        self._functions = Functions()

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
            "Stream": Stream, "Event": Event, "current_stream": lambda device=None: Stream(),
            "default_stream": lambda device=None: Stream(), "stream": lambda s: s if s is not None else Stream(),
            "CUDAGraph": CUDAGraph, "graph": graph, "graph_pool_handle": lambda: ("graph pool", 0),
            "set_sync_debug_mode": set_sync_debug_mode,
            "get_sync_debug_mode": lambda: {None: 0, "warn": 1, "error": 2}[sim.sync_debug_mode],
        }.items():
            self._patch(cuda, name, value)
        self._patch(torch, "Generator", DeviceGenerator)
        # Module.to(): a new Parameter around the device tensor (`param.data = ...` would keep a plain Parameter
        # object over the device tensor's storage-less implementation)
        self._overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        self._lift = torch._C._only_lift_cpu_tensors()
        torch._C._set_only_lift_cpu_tensors(True)  # torch.tensor(..., device="cuda") builds on the host, then moves
        torch._C._ensureCUDADeviceGuardSet()
        Kernels._active.append(kernels)
        self._functions.__enter__()
        kernels.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._kernels.__exit__(*exc)
        self._functions.__exit__(*exc)
        Kernels._active.pop()
        torch._C._set_only_lift_cpu_tensors(self._lift)
        torch.__future__.set_overwrite_module_params_on_conversion(self._overwrite)
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved.clear()
