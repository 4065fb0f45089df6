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
