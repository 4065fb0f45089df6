"""On PYTHONPATH for a peer's server under `bench/http_peers.py --isa avx2`: vLLM chooses its compiled kernels
(`vllm._C` for AVX512-BF16, `_C_AVX512`, `_C_AVX2`) and its attention ISA from torch.cpu's feature probes, which
read the CPU, not ATEN_CPU_CAPABILITY. Answering "no" to the probes above AVX2 makes it load its AVX2 build, as it
would on an AVX2-only CPU. Bench-only: nothing in mainspring imports this."""

import torch.cpu

for _probe in ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported",
               "_is_amx_tile_supported", "_is_amx_fp16_supported"):
    if hasattr(torch.cpu, _probe):
        setattr(torch.cpu, _probe, lambda: False)
