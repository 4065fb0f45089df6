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
  storage is freed as soon as nothing else holds it. Each engine does this once it has made its weights (fused,
  packed, quantized), to what its model holds, and rebinds the loaded state dict's entries that share those
  storages, so the -fast engine built next from the same load adopts them; a storage already in such a mapping
  stays where it is. Only what a model holds is copied: placing the whole state dict first (as this did at
  first) kept the q/k/v and gate/up matrices that every engine fuses into new ones alive in the mapping (a
  server's resident memory after start went from 1.79 to 1.53 GB when that stopped: SmolLM2, torch's kernel);
- prepacked weights (oneDNN's, MKL's) are opaque (no storage to rebind; MKL's must not move): their pages are
  collapsed in place (MADV_COLLAPSE, Linux 6.1+), best effort, one huge page at a time (the kernel's size:
  hpage_pmd_size), and only where most base pages are in memory already (MKL allocates ~3x what it fills).

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

from mainspring.engine.allocator import TRIM_EVERY, release_freed_memory

THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
THP_SIZE = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"
MADV_HUGEPAGE = 14  # <asm-generic/mman-common.h>; Python's mmap module names the first, not the second
MADV_COLLAPSE = 25
ALIGN = 64  # each storage's start in the arena: a cache line, what the kernels' vector loads like


@dataclass
class HugePageReport:
    placed_bytes: int = 0  # the model's dense storages in advised mappings (moved now, or by an earlier call)
    collapsed_pages: int = 0  # huge pages of opaque (oneDNN, MKL) weights collapsed in place
    collapsing_pages: int = 0  # how many pages of opaque weights a collapse was asked for
    huge_bytes: int = 0  # of those mappings, what the kernel backs with huge pages (AnonHugePages in smaps)
    reason: str = ""  # why nothing was done, when nothing was

    def describe(self) -> str:
        if self.reason:
            return f"weights on 4 KiB pages ({self.reason})"
        return (f"weights on huge pages: {self.huge_bytes >> 20} of {self.placed_bytes >> 20} MiB dense, "
                f"{self.collapsed_pages} of {self.collapsing_pages} pages of packed weights collapsed")


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


def place_weights(model: nn.Module, shared: dict[str, torch.Tensor] | None = None) -> HugePageReport:
    """Move `model`'s CPU weights onto huge pages as the module docstring says (those not there already); what
    was done. Entries of `shared` (the state dict the model was built from) that view a storage the model uses are
    rebound to the copy too, so another engine built from it later adopts the placed tensor instead of copying it
    again; entries the model does not use (what it fused, packed or quantized) are left alone, to be freed with
    the state dict. Packed weights are collapsed before this returns: each collapse compacts memory for its huge
    page, tens of milliseconds where memory is fragmented (SmolLM2's MKL packs: 3 to 14 s in all at start, on the
    Xeon of engine/linear_kernel.py); on a thread of their own while the engine served, the first workload after
    start ran at half speed."""
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
    state = shared if shared is not None else {}
    for name, t in state.items():
        if t.device.type == "cpu" and t.layout == torch.strided and t.untyped_storage().data_ptr() in groups:
            _add(groups, t, partial(state.__setitem__, name))
    _relocate(groups)
    arenas: set[tuple[int, int]] = set()
    seen: set[int] = set()
    for owner, key in slots:  # the model's dense tensors now, placed by this call or an earlier one
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
    pages = _opaque_pages(model)
    report.collapsing_pages = len(pages)
    _collapse(pages, report)
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


def _opaque_pages(model: nn.Module) -> list[int]:
    """The huge pages the model's packed (opaque) weights mostly fill, in address order."""
    page = huge_page_size()
    pages: set[int] = set()
    for module in model.modules():
        packed = getattr(module, "_packed", None)
        if isinstance(packed, torch.Tensor) and packed.is_mkldnn:
            start, n = torch.ops.mkldnn.data_ptr(packed), torch.ops.mkldnn._nbytes(packed)
            if n >= page // 4:  # a smaller one is not worth a huge page of its own
                pages.update(range(start // page * page, start + n, page))
    # only pages mostly filled already: a collapse fills what it covers, and MKL's buffer is ~3x what it packs into
    # it. Measured on SmolLM2 (Xeon, capped at AVX2): every touched page collapsed, single-stream decode took 33.0
    # ms a step for +138 MB; half-filled ones, 33.9 for +42 MB; only full ones, 36.5
    return [address for address in sorted(pages) if _mostly_resident(address, page)]


def _collapse(pages: list[int], report: HugePageReport) -> None:
    """Collapse each huge page in place (the caller's model holds the weights in them alive meanwhile)."""
    page = huge_page_size()
    for address in pages:
        _madvise(address, page, MADV_HUGEPAGE)  # khugepaged may still do the pages a collapse leaves
        report.collapsed_pages += _madvise(address, page, MADV_COLLAPSE) == 0


def _mostly_resident(address: int, length: int) -> bool:
    """Whether at least half the base pages of [address, address + length) are in memory (mincore; page-aligned
    address)."""
    base = mmap.PAGESIZE
    vec = ctypes.create_string_buffer(length // base)
    if _libc_fn("mincore", ctypes.c_char_p)(address, length, vec) != 0:
        return False
    return sum(b & 1 for b in vec.raw) * 2 >= len(vec.raw)


def _address(arena: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(arena))


_libc: ctypes.CDLL | None = None


def _libc_fn(name: str, third: type) -> Any:
    """libc's `name`(void *, size_t, `third`) -> int."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(_libc, name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, third]
    fn.restype = ctypes.c_int
    return fn


def _madvise(address: int, length: int, advice: int) -> int:
    return _libc_fn("madvise", ctypes.c_int)(address, length, advice)


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
