#!/usr/bin/env bash
# The engine's GPU checks, for a machine with a CUDA GPU and torch + transformers installed but no network and no
# copy of the weights: tests/engine/test_cuda.py and the trainer's process-group tests ("tests"), bench/engine.py
# --device cuda against transformers on the same GPU ("engine"), bench/fast_variant.py --device cuda: bf16 vs int4 vs
# int4 + n-gram drafts ("fast"), and bench/gpu_attention.py: one layer's attention per chunk, as the engine runs it,
# through FlashAttention varlen and through FlexAttention over the paged cache ("attention"). The model is the
# embedded one's shape (its config and tokenizer, copied into .gpu/smollm2 by `bench/gpu_check.sh --prepare` on a
# machine that has them) with random weights: the same work per token as the real weights, so speed and the numerics
# checks (same weights on both sides) hold.
#
# Before spending GPU time, dry-run a stage's script here on the simulated GPU (it runs; its figures mean nothing):
#   MAINSPRING_DEVICE=cuda python -m tests.simulated_cuda bench/fast_variant.py --child fast --repeats 1
#   python -m tests.simulated_cuda bench/gpu_attention.py --device cuda --out /tmp/attention.json
#
#   bench/gpu_check.sh --prepare            # here: tokenizer + config into .gpu/, wheels the GPU box lacks into .whl/
#   bench/gpu_check.sh OUT_DIR [STAGES]     # there: PYTHONPATH, random weights, then STAGES (default
#                                           # tests,engine,fast,attention; split them across calls of 10 minutes,
#                                           # what the issue's acceptance needs first: tests,engine then
#                                           # fast,attention)
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then
  model=$(.venv/bin/python -c "from mainspring.config import Settings; from mainspring.engine.loader import load_model
print(load_model('smollm2', Settings().cache_dir).path)")
  mkdir -p .gpu/smollm2 .whl
  cp "$model"/{tokenizer.json,tokenizer_config.json,config.json,generation_config.json} .gpu/smollm2/
  # what mainspring.engine and the trainer's process-group tests import beyond the GPU image's packages (torch,
  # numpy, tokenizers, rich, typer, pyyaml, safetensors, pytest)
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    pydantic pydantic_core pydantic-settings annotated-types typing-inspection python-dotenv
  exit
fi

out=${1:-/tmp/gpu-check}
stages=",${2:-tests,engine,fast,attention},"
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export MAINSPRING_DATA_DIR=/tmp/mainspring-data MAINSPRING_MODEL=/tmp/smollm2-random
export MAINSPRING_TEST_GPU=1  # the tests see the GPU (tests/conftest.py hides it otherwise)
nvidia-smi -L | tee "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$out/gpu.txt"

[ -f /tmp/smollm2-random/config.json ] || python3 - <<'EOF' || exit 1
import shutil, torch, transformers
torch.manual_seed(0)
config = transformers.AutoConfig.from_pretrained(".gpu/smollm2")
model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.save_pretrained("/tmp/smollm2-random")
for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copy(f".gpu/smollm2/{name}", "/tmp/smollm2-random/")
print("random weights:", sum(p.numel() for p in model.parameters()), "parameters")
EOF

if [[ $stages == *,tests,* ]]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/engine/test_cuda.py 2>&1 | tee "$out/test_cuda.txt"
  # the trainer's policy stays on the CPU where a GPU is visible: its gradients must go over gloo, not NCCL
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/train/test_trainer.py -k torchrun_rank 2>&1 \
    | tee "$out/test_torchrun_rank.txt"
fi
if [[ $stages == *,engine,* ]]; then
  timeout 300 python3 bench/engine.py --device cuda --engines mainspring,transformers --threads 4 \
    --out "$out/engine_cuda.json" 2>&1 | tee "$out/bench.txt"
fi
if [[ $stages == *,fast,* ]]; then
  timeout 150 python3 bench/fast_variant.py --device cuda --engines plain,int4,fast --threads 4 --repeats 2 \
    --out "$out/fast_variant_cuda.json" 2>&1 | tee "$out/fast_variant.txt"
fi
if [[ $stages == *,attention,* ]]; then
  timeout 240 python3 bench/gpu_attention.py --device cuda --out "$out/gpu_attention.json" 2>&1 | tee "$out/attention.txt"
fi
