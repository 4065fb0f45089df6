"""Run a script on the simulated GPU, to dry-run a GPU bench or check before a GPU is lent:

    MAINSPRING_DEVICE=cuda python -m tests.simulated_cuda bench/fast_variant.py --child fast --repeats 1
    python -m tests.simulated_cuda bench/gpu_attention.py --device cuda --out /tmp/attention.json

Its figures are the CPU's, through a Python layer per op: they say whether the script runs, never how fast a GPU is.
"""

import runpy
import sys

import torch

from tests.simulated_cuda import SimulatedCuda

if len(sys.argv) < 2:
    print("usage: python -m tests.simulated_cuda SCRIPT [ARGS...]", file=sys.stderr)
    sys.exit(2)
sys.argv = sys.argv[1:]
with SimulatedCuda(), torch.inference_mode():
    runpy.run_path(sys.argv[0], run_name="__main__")
