"""The `-fast` model variant: the same weights and tokenizer, run by an engine configured for
single-stream speed (int4 weight-only linears + speculative decoding).

The API serves it as `<engine name>-fast` (the price sheet bills it as the "fast" tier).
"""

from __future__ import annotations

import dataclasses
import logging

from mainspring.config import Settings, get_settings
from mainspring.engine.config import EngineConfig
from mainspring.engine.engine import LLMEngine
from mainspring.engine.loader import LoadedModel, load_model
from mainspring.engine.speculative import SpeculativeConfig

log = logging.getLogger(__name__)

FAST_SUFFIX = "-fast"
FAST_QUANTIZATION = "int4"
# Speculative decoding for the fast variant when MAINSPRING_FAST_SPECULATIVE is empty. Prompt lookup
# (n-gram) measured 2x over int4 alone on the single-stream bench (1 thread, loaded machine); the
# layer-skip draft model was slower than none (two thirds of the model per draft token). k=5 keeps
# verification (k + 1 rows) on the int4 kernel (quant.KERNEL_MAX_ROWS).
FAST_SPECULATIVE = SpeculativeConfig("ngram", k=5, n=3)
# Compiling the decode step is not part of the fast variant: torch.compile costs 10-80 s per shape
# and at 2 threads under load its graphs ran slower than eager (shared/notes/engine.md section 4).
FAST_COMPILE_DECODE = False


def fast_engine_config(settings: Settings | None = None) -> EngineConfig:
    """The plain engine's options from `settings`, plus int4 weights and speculative decoding
    (MAINSPRING_FAST_SPECULATIVE, FAST_SPECULATIVE when empty; "off" turns it off)."""
    s = settings or get_settings()
    spec = SpeculativeConfig.parse(s.fast_speculative) if s.fast_speculative.strip() else FAST_SPECULATIVE
    return dataclasses.replace(EngineConfig.from_settings(s), quantization=FAST_QUANTIZATION, speculative=spec)


def build_fast_engine(settings: Settings | None = None, loaded: LoadedModel | None = None) -> LLMEngine:
    """The `-fast` engine. Pass the plain engine's `LoadedModel` to share its tokenizer and fp32
    tensors (embeddings, norms); the int4 weights come from the disk cache after the first start."""
    s = settings or get_settings()
    loaded = loaded or load_model(s.model, s.cache_dir)
    config = fast_engine_config(s)
    engine = LLMEngine(loaded, config)
    engine.name = loaded.name + FAST_SUFFIX
    report = engine.quant_report
    assert report is not None  # the config asks for FAST_QUANTIZATION, so the engine quantized
    log.info("fast variant ready: %s (int4: %d linears, speculative %s)", engine.name,
             len(report.quantized), config.speculative)
    return engine
