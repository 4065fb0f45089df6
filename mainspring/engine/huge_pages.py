"""The model's weights on transparent huge pages (2 MiB on x86-64 instead of 4 KiB pages), where Linux offers them.

A decode step reads every weight once: at one row it is a stream through ~500 MB (SmolLM2-135M in fp32), and on
4 KiB pages that stream takes a TLB miss every 4 KiB and the CPU's prefetchers stop at each page's end. Most
distributions set THP to "madvise" (Debian, Ubuntu): memory gets huge pages only where a process asks. Measured on
an Intel Xeon (2 threads, capped at AVX2 as bench/http_peers.py --isa avx2 does), single-stream decode went from
37.3 to 31.4 ms a step and a decode step of 32 agents from 163 to 158 ms; the 120 fp32 linears alone, at one row,
22.1 -> 17.8 ms.

Two ways in, one per kind of tensor:
- dense tensors (parameters and buffers: fp32 / bf16 weights, int4 packs, norms, the embedding) are copied, one
  storage at a time, into one anonymous mapping advised MADV_HUGEPAGE before it is touched, so its pages fault in
  as huge pages; each tensor is then rebound to its copy (tied weights stay tied: they share a storage). The old
  storage is freed as soon as nothing else holds it. The engine first does this to the loaded state dict
  (`place_state`), which the standard and the -fast engine share, then to what each engine made of it
  (`place_weights`: fused and quantized weights); a storage already in such a mapping stays where it is;
- oneDNN's prepacked weights are opaque (no storage to rebind): their pages are collapsed in place
  (MADV_COLLAPSE, Linux 6.1+), best effort, one huge page at a time (the kernel's size: hpage_pmd_size).

Nothing changes a value: outputs are bit for bit the same. Where THP is off ("never"), on other kernels or other
systems, the weights stay where they are and the report says so.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from mainspring.engine.allocator import release_freed_memory

THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
THP_SIZE = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"
MADV_HUGEPAGE = 14  # <asm-generic/mman-common.h>; Python's mmap module names the first, not the second
MADV_COLLAPSE = 25
ALIGN = 64  # each storage's start in the arena: a cache line, what the kernels' vector loads like
TRIM_EVERY = 64 << 20  # bytes copied between trims: the copy's peak memory stays near the weights' size


@dataclass
class HugePageReport:
    placed_bytes: int = 0  # the model's dense storages in advised mappings (moved now, or by place_state)
    collapsed_pages: int = 0  # huge pages of opaque (oneDNN) weights collapsed in place
    huge_bytes: int = 0  # of those mappings, what the kernel backs with huge pages (AnonHugePages in smaps)
    reason: str = ""  # why nothing was done, when nothing was

    def describe(self) -> str:
        if self.reason:
            return f"weights on 4 KiB pages ({self.reason})"
        return (f"weights on huge pages: {self.huge_bytes >> 20} of {self.placed_bytes >> 20} MiB dense, "
                f"{self.collapsed_pages} pages of packed weights collapsed")


def huge_page_size() -> int:
    """The kernel's huge page: 2 MiB on x86-64 and on ARM64 with 4 KiB pages, 512 MiB on ARM64 with 64 KiB."""
    try:
        with open(THP_SIZE) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 2 << 20


def unavailable() -> str:
    """Why huge pages cannot be asked for here, or "" when they can."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    try:
        with open(THP_ENABLED) as f:
            mode = f.read()
    except OSError:
        return "the kernel has no transparent huge pages"
    if "[never]" in mode:
        return "transparent huge pages are off ([never])"
    return ""


def place_state(state: dict[str, torch.Tensor]) -> int:
    """Move a loaded state dict's dense CPU tensors onto huge pages, replacing its entries (same values); the bytes
    moved. Engines built from it adopt these tensors as their own (CausalLM.load_weights shares, not copies), so
    weights several engines share (the standard and the -fast one, built from one load) are placed once."""
    if unavailable():
        return 0
    groups: _Groups = {}
    for name, t in state.items():
        _add(groups, t, partial(state.__setitem__, name))
    return _relocate(groups)


def place_weights(model: nn.Module) -> HugePageReport:
    """Move `model`'s CPU weights onto huge pages as the module docstring says (those not there already); what
    was done."""
    reason = unavailable()
    if reason:
        return HugePageReport(reason=reason)
    report = HugePageReport()
    # where each tensor sits (a module's parameter or buffer dict, and its key): buffers are rebound there
    slots: list[tuple[dict[str, Any], str]] = [
        (owner, key) for module in model.modules() for owner in (module._parameters, module._buffers)
        for key, t in owner.items() if t is not None]
    groups: _Groups = {}
    for owner, key in slots:
        t = owner[key]
        # a Parameter keeps its identity (its .data is rebound): ties, optimizers and hooks still hold it
        rebind = partial(setattr, t, "data") if isinstance(t, nn.Parameter) else partial(owner.__setitem__, key)
        _add(groups, t, rebind)
    _relocate(groups)
    arenas: set[tuple[int, int]] = set()
    seen: set[int] = set()
    for owner, key in slots:  # the model's dense tensors now, placed here or by place_state
        t = owner[key]
        if t.is_mkldnn or t.data_ptr() in seen:  # a tied weight counts once
            continue
        seen.add(t.data_ptr())
        arena = placed_in(t.data_ptr())
        if arena is not None:
            arenas.add(arena)
            report.placed_bytes += t.numel() * t.element_size()
    # counted before the collapse below advises the packed weights' pages, which may sit next to them
    report.huge_bytes = min(_anon_huge_bytes(arenas), report.placed_bytes)
    _collapse_opaque(model, report)
    return report


# storage address -> (tensor, how to rebind it to its copy) for every tensor that views that storage
_Groups = dict[int, list[tuple[torch.Tensor, Callable[[torch.Tensor], None]]]]
_live: dict[int, int] = {}  # start -> end of every arena some tensor still views


def _add(groups: _Groups, t: torch.Tensor, rebind: Callable[[torch.Tensor], None]) -> None:
    if t.device.type != "cpu" or t.layout != torch.strided or t.is_mkldnn:
        return
    ptr = t.untyped_storage().data_ptr()
    if ptr and placed_in(ptr) is None:  # not on huge pages already
        groups.setdefault(ptr, []).append((t, rebind))


def placed_in(address: int) -> tuple[int, int] | None:
    """The (start, end) of the advised mapping holding `address`, or None."""
    return next(((lo, hi) for lo, hi in _live.items() if lo <= address < hi), None)


def _relocate(groups: _Groups) -> int:
    """Copy each storage into one new advised mapping and rebind its tensors to the copy (same offset, shape and
    strides); the bytes copied (0 when there was nothing to copy or no mapping to copy to)."""
    sizes = {ptr: -(-ts[0][0].untyped_storage().nbytes() // ALIGN) * ALIGN for ptr, ts in groups.items()}
    total = sum(sizes.values())
    if total == 0:
        return 0
    page = huge_page_size()
    arena = mmap.mmap(-1, total + page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = _address(arena)
    if _madvise(base, len(arena), MADV_HUGEPAGE) != 0:
        arena.close()
        return 0
    _live[base] = base + len(arena)
    weakref.finalize(arena, _live.pop, base, None)  # freed with the last tensor that views it
    raw = torch.frombuffer(arena, dtype=torch.uint8)  # holds the mapping for every view made from it
    offset = -base % page  # the first storage starts on a huge page boundary
    since_trim = 0
    for ptr in list(groups):
        entries = groups.pop(ptr)
        n = entries[0][0].untyped_storage().nbytes()
        raw[offset:offset + n].copy_(torch.empty(0, dtype=torch.uint8).set_(entries[0][0].untyped_storage()))
        copies: dict[int, torch.Tensor] = {}  # id(tensor) -> its copy: a tensor met twice is copied once
        for t, rebind in entries:
            if id(t) not in copies:
                assert offset % t.element_size() == 0  # ALIGN is a multiple of every element size
                copies[id(t)] = torch.empty(0, dtype=t.dtype).set_(
                    raw.untyped_storage(), offset // t.element_size() + t.storage_offset(), t.shape, t.stride())
            rebind(copies[id(t)])
        del entries, copies
        offset += sizes[ptr]
        since_trim += n
        if since_trim > TRIM_EVERY:  # the old storages' heap pages go back now, not after the whole copy
            release_freed_memory()
            since_trim = 0
    release_freed_memory()
    return total


def _collapse_opaque(model: nn.Module, report: HugePageReport) -> None:
    page = huge_page_size()
    pages: set[int] = set()
    for module in model.modules():
        packed = getattr(module, "_packed", None)
        if isinstance(packed, torch.Tensor) and packed.is_mkldnn:
            start, n = torch.ops.mkldnn.data_ptr(packed), torch.ops.mkldnn._nbytes(packed)
            if n >= page // 4:  # a smaller one is not worth a huge page of its own
                pages.update(range(start // page * page, start + n, page))
    for address in sorted(pages):
        _madvise(address, page, MADV_HUGEPAGE)  # khugepaged may still do the pages a collapse leaves
        report.collapsed_pages += _madvise(address, page, MADV_COLLAPSE) == 0


def _address(arena: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(arena))


_libc: ctypes.CDLL | None = None


def _madvise(address: int, length: int, advice: int) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc.madvise.restype = ctypes.c_int
    return _libc.madvise(address, length, advice)


def _anon_huge_bytes(ranges: set[tuple[int, int]]) -> int:
    """AnonHugePages of the mappings that overlap any (start, end) in `ranges`, from one read of /proc/self/smaps.
    The kernel merges neighbouring mappings advised alike into one, whose count may cover more than the ranges."""
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = any(lo < end and hi > start for start, end in ranges)
                elif inside and head == "AnonHugePages:":
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total
