"""allocator.keep_freed_memory: freed activations are reused without faulting their pages in again."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

# a child process each: the malloc settings are process-wide and must not leak into other tests
CHILD = """
import json, resource, sys
import torch
from mainspring.engine.allocator import keep_freed_memory
if sys.argv[1] == "on":
    applied = keep_freed_memory()
else:  # glibc as a process starts: large blocks mmapped (its dynamic threshold moves with the heap's history)
    import ctypes
    applied = ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def layer():  # five 20 MB activations alive at once, then all freed: a prefill layer's pattern
    alive = [torch.ones(5_000_000) for _ in range(5)]
    return sum(float(t[0]) for t in alive)
for _ in range(3):  # warm: the first rounds fault whatever the settings
    layer()
before = faults()
for _ in range(20):
    layer()
print(json.dumps({"applied": applied, "faults": faults() - before}))
"""

glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def child(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not glibc, reason="mallopt is glibc's")
def test_freed_activations_stay_mapped():
    off, on = child("off"), child("on")
    assert on["applied"] is True and off["applied"] == 1
    pages = 20 * 5 * 20_000_000 // 4096  # what faulting each tensor in again would cost
    assert off["faults"] > pages // 2  # mmapped, unmapped on free, faulted in again
    assert on["faults"] < pages // 1000, (on, off)


def test_applies_once_and_reports(monkeypatch):
    from mainspring.engine import allocator

    calls = []
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator, "_tune", lambda: calls.append(1) or False)
    assert allocator.keep_freed_memory() is False
    assert allocator.keep_freed_memory() is False
    assert calls == [1]


TRIM_CHILD = """
import json
import torch
from mainspring.engine.allocator import keep_freed_memory, release_freed_memory
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
keep_freed_memory()
weights = [torch.ones(2_000_000) for _ in range(40)]  # 320 MB in 8 MB tensors: from the heap, under the threshold
held = rss_mb()
del weights  # what packing leaves behind: freed, and kept by the thresholds
kept = rss_mb()
released = release_freed_memory()
print(json.dumps({"held": held, "kept": kept, "released": released, "after": rss_mb()}))
"""


@pytest.mark.skipif(not glibc, reason="malloc_trim is glibc's")
def test_freed_weights_go_back_to_the_kernel_once_released():
    out = subprocess.run([sys.executable, "-c", TRIM_CHILD], capture_output=True, text=True, timeout=120, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["kept"] > r["held"] - 64  # the thresholds keep what was freed
    assert r["released"] and r["after"] < r["kept"] - 200  # and the release hands it back
