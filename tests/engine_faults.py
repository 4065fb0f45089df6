"""Engines on the embedded model whose steps fail, as after a lost GPU context: for the tests of what the
layers above do when their engine fails a step, or stops."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mainspring.engine.async_engine import STOP_AFTER_FAILED_STEPS, AsyncLLMEngine
from mainspring.engine.config import EngineConfig
from mainspring.engine.engine import LLMEngine
from mainspring.engine.params import SamplingParams

FAULT = "CUDA error: an illegal memory access was encountered"


def failing_engine(embedded: Any, failures: int | None = None) -> AsyncLLMEngine:
    """An engine whose first `failures` steps raise (every step: None); the steps after those run as usual."""
    llm = LLMEngine(embedded, EngineConfig(kv_cache_mb=64))
    execute, left = llm.runner.execute, [failures]

    def faulty(*args, **kwargs):
        if left[0] is None or left[0] > 0:
            left[0] = None if left[0] is None else left[0] - 1
            raise RuntimeError(FAULT)
        return execute(*args, **kwargs)

    llm.runner.execute = faulty
    return AsyncLLMEngine(llm)


def stopped_engine(embedded: Any) -> AsyncLLMEngine:
    """An engine that stopped: its steps failed STOP_AFTER_FAILED_STEPS times in a row."""
    engine = failing_engine(embedded)
    for _ in range(STOP_AFTER_FAILED_STEPS):
        with pytest.raises(RuntimeError, match="the engine failed while serving this request"):
            asyncio.run(engine.generate("hi", SamplingParams(max_tokens=2)))
    assert engine.stopped is not None
    return engine
