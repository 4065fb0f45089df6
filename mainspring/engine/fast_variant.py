"""The `-fast` model variant: the same weights and tokenizer, run by an engine configured for
single-stream speed: the weight format this CPU runs fastest within an accuracy bound (measured at
first start and cached, engine/kernel_choice.py), or on CUDA int4 (torch's CUDA kernel), plus speculative decoding.

When no quantized format beats fp32 on the CPU, the fast engine keeps the standard weights and
still decodes speculatively, so it is never slower than the standard one; the log, /health and
/v1/models say which format it runs. The API serves it as `<engine name>-fast` (the price sheet
bills it as the "fast" tier).
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from mainspring.config import Settings, get_settings
from mainspring.engine.config import EngineConfig
from mainspring.engine.engine import LLMEngine
from mainspring.engine.kernel_choice import FP32, KernelChoice, choose_kernel
from mainspring.engine.loader import LoadedModel, load_model
from mainspring.engine.placement import Placement, resolve_placement
from mainspring.engine.quant_cache import QUANTIZATION_METHODS
from mainspring.engine.speculative import SpeculativeConfig

log = logging.getLogger(__name__)

FAST_SUFFIX = "-fast"
# Speculative decoding for the fast variant when MAINSPRING_FAST_SPECULATIVE is empty. Prompt lookup
# (n-gram) measured 2x over int4 alone on the single-stream bench (1 thread, loaded machine); the
# layer-skip draft model was slower than none (two thirds of the model per draft token). k=5 keeps
# verification (k + 1 rows) on the int4 kernel (quant.KERNEL_MAX_ROWS); the kernel choice times k + 1 rows.
FAST_SPECULATIVE = SpeculativeConfig("ngram", k=5, n=3)
# Compiling the decode step is not part of the fast variant: torch.compile costs 10-80 s per shape
# and at 2 threads under load its graphs ran slower than eager (shared/notes/engine.md section 4).
FAST_COMPILE_DECODE = False


FAST_KERNELS = ("auto", *(m for m in QUANTIZATION_METHODS if m != "int4"), FP32)


def fast_speculative(settings: Settings) -> SpeculativeConfig | None:
    s = settings.fast_speculative
    return SpeculativeConfig.parse(s) if s.strip() else FAST_SPECULATIVE


def fast_engine_config(settings: Settings | None = None, quantization: str | None = "int4",
                       device_type: str = "cpu") -> EngineConfig:
    """The plain engine's options from `settings`, plus `quantization` (None: the standard weights) and speculative
    decoding (MAINSPRING_FAST_SPECULATIVE, FAST_SPECULATIVE when empty; "off" turns it off)."""
    s = settings or get_settings()
    config = dataclasses.replace(EngineConfig.from_settings(s), quantization=quantization,
                                 speculative=fast_speculative(s))
    if device_type == "cuda":  # the engine's precision; the int4 kernel takes bf16 activations and runs prefill too
        return config
    # on the CPU fp32 activations whatever MAINSPRING_DTYPE says, and int4 layers keep a dense copy for prefill: its
    # time to first token is the standard engine's, not the int4 kernel's (2x slower than fp32 from 16 rows on
    # without native bf16)
    return dataclasses.replace(config, dtype="fp32", quant_dense_prefill=True)


def fast_kernel(settings: Settings, loaded: LoadedModel, device_type: str = "cpu") -> KernelChoice:
    """What MAINSPRING_FAST_KERNEL asks for: a pinned format, or ("auto") the measured choice on the CPU and int4
    with bf16 activations on CUDA."""
    wanted = settings.fast_kernel.strip().lower()
    if wanted not in FAST_KERNELS:
        raise ValueError(f"MAINSPRING_FAST_KERNEL={settings.fast_kernel!r}: expected one of {', '.join(FAST_KERNELS)}")
    if wanted != "auto":
        return KernelChoice(wanted, "pinned by MAINSPRING_FAST_KERNEL")
    if device_type == "cuda":
        return cuda_fast_kernel(resolve_placement(settings.device, settings.dtype))
    spec = fast_speculative(settings)
    return choose_kernel(loaded, settings.cache_dir, threads=settings.resolved_threads(),
                         verify_rows=(spec.k + 1) if spec is not None else 1)


def cuda_fast_kernel(placement: Placement) -> KernelChoice:
    """int4 with bf16 activations where torch's CUDA int4 kernel runs (compute capability 8.0 and up), else the
    standard weights ("fp32" names them whatever their precision, as on the CPU)."""
    major, minor = torch.cuda.get_device_capability(placement.device)
    if major < 8:
        return KernelChoice(FP32, f"torch's CUDA int4 kernel needs compute capability 8.0; this GPU has "
                                  f"{major}.{minor}")
    return KernelChoice("int4-bf16", "on CUDA: torch's int4 kernel, the one weight format with a CUDA kernel here "
                        "(not yet timed against the standard weights on a GPU)")


def build_fast_engine(settings: Settings | None = None, loaded: LoadedModel | None = None,
                      standard: LLMEngine | None = None) -> LLMEngine:
    """The `-fast` engine. Pass the plain engine's `LoadedModel` to share its tokenizer and fp32
    tensors (embeddings, norms), and the plain engine built from it to run prefill on its linears where they hold
    the int4 layers' weights exactly (engine/shared_prefill.py); int4 weights come from the disk cache after the
    first start."""
    if standard is not None and loaded is None:
        raise ValueError("a standard engine to share prefill with needs the LoadedModel it was built from")
    s = settings or get_settings()
    loaded = loaded or load_model(s.model, s.cache_dir)
    device_type = resolve_placement(s.device, s.dtype).device.type
    choice = fast_kernel(s, loaded, device_type)
    config = fast_engine_config(s, choice.quantization, device_type)
    engine = LLMEngine(loaded, config, share_prefill_with=standard)
    engine.name = loaded.name + FAST_SUFFIX
    engine.kernel_choice = choice
    ms = ", ".join(f"{k} {v:.2f} ms" for k, v in choice.ms_per_step.items())
    log.info("fast variant ready: %s on %s weights (%s%s; %s), speculative %s", engine.name, choice.name,
             choice.reason, ", cached" if choice.from_cache else "", ms or "not measured", config.speculative)
    if choice.name == FP32:
        log.warning("%s runs the standard weights (%s): only speculative decoding makes it faster", engine.name,
                    choice.reason)
    return engine
