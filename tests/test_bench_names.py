"""bench/ scripts run as `python bench/X.py`, which puts bench/ first on sys.path: a script named like
a standard-library module (inspect.py, profile.py, ...) would shadow it for every other script there."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_no_bench_script_shadows_the_standard_library():
    clashes = sorted(p.name for p in BENCH.glob("*.py") if p.stem in sys.stdlib_module_names)
    assert not clashes, f"rename {clashes}: they would shadow standard-library modules for bench/ scripts"
